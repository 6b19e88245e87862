"""The canonical JSON of answers, and children kept as such JSON.

Metacontroller re-applies whatever differs from what the API server stores, so an answer must be
byte-identical for the same request: sorted keys, no spaces, UTF-8 (ASCII escapes for a value
holding a lone surrogate, decoded from an observed annotation, which UTF-8 cannot hold). A sync
answer is spliced from children encoded once, the way the whole would encode.
"""

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from hooks.contract import field_at, fields_at
from hooks.vocabulary import SERVICE_LABEL

Path = tuple[str, ...]


def canonical_json(value: Any) -> bytes:
    try:
        # A copy of exactly its length: orjson's own result keeps its whole write buffer (8 KiB
        # for a 600-byte child), which a memoised child would hold for the worker's life.
        return memoryview(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).tobytes()
    except TypeError:  # a lone surrogate or an integer beyond 64 bits: ASCII escapes hold any str
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class EncodedChild:
    """A child as the answer carries it, with what the steps after rendering read of it: its
    identity, its service, and its values at `fields` (paths the caller names, such as the
    immutable ones), so none of them decodes the body again."""

    kind: Any  # str in every rendered child; a kept child's last-applied record may hold anything
    api_version: Any
    name: Any
    service: Any
    body: bytes
    fields: dict[Path, Any]

    @classmethod
    def of(cls, child: dict[str, Any], paths: Iterable[Path] = ()) -> "EncodedChild":
        return cls(
            child.get("kind"),
            child.get("apiVersion"),
            field_at(child, "metadata", "name"),
            field_at(child, "metadata", "labels", SERVICE_LABEL),
            canonical_json(child),
            fields_at(child, paths),
        )


def sync_answer_json(status_json: bytes, children: Sequence[EncodedChild]) -> bytes:
    """canonical_json({"children": children, "status": status}) from the status's and each
    child's encoding."""
    parts = [b'{"children":[', b",".join([child.body for child in children]), b'],"status":', status_json, b"}"]
    return b"".join(parts)
