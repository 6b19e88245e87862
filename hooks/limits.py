"""Size bounds: what the API server refuses by size, and what keeps one request's work small.

A spec can make the hook render far more than it says (a JSON-patch `copy` doubles a child; a
long `spec.envs` lands in every pool), so every rendered child is measured as it is made and
the answer stops growing at a fixed bound, long before the hook pod's memory limit.
"""

import json
from typing import Any

from hooks.api.fields import SpecError
from hooks.contract import CONTROLLER_UID_LABEL, LAST_APPLIED_ANNOTATION
from hooks.kubernetes_names import MAX_ANNOTATIONS_BYTES, annotations_bytes

MiB = 1024 * 1024
# etcd's default request limit: the API server cannot store a larger object.
MAX_OBJECT_BYTES = 3 * MiB // 2
# All children of one answer: about 16 times a 200-service graph's, and what keeps a worker's
# peak memory for one request well inside the hook pod's limit.
MAX_ANSWER_BYTES = 8 * MiB
# Kubernetes objects nest about 15 levels deep (a LeaderWorkerSet's pod affinity terms). A child
# nested no deeper keeps every recursive step after rendering (copies, the schema check, JSON
# encoding) well inside Python's recursion limit.
MAX_NESTING = 64
# Go's JSON encoder, which Metacontroller records children with, escapes these (as \u003c,
# \u2028, ...): the bytes each then takes beyond its UTF-8.
GO_ESCAPE_EXTRA = {"<": 5, ">": 5, "&": 5, "\u2028": 3, "\u2029": 3}
# The most bytes a byte of JSON can take in Go's encoding (one of <, > and &).
WIDEST_GO_ESCAPE = 6


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON, as a child travels to the API server."""
    return len(_json(value).encode())


def _named(child: dict[str, Any]) -> str:
    return f"{child.get('kind')} {(child.get('metadata') or {}).get('name')}"


class RenderedSize:
    """The size of each rendered child and of the whole answer, checked as they grow."""

    def __init__(self) -> None:
        self.total = 0
        self.sizes: list[int] = []
        # The positions whose size counts what patches added but not what they took away.
        self.grown: set[int] = set()

    def add(self, child: dict[str, Any]) -> None:
        """Count a newly rendered child (appended at the next position)."""
        size = json_size(child)
        self._check(child, size, self.total + size, "", "would be")
        self.sizes.append(size)
        self.total += size

    def grow(self, position: int, child: dict[str, Any], added: int, where: str) -> None:
        """Count `added` bytes that a patch operation puts into the child at `position`."""
        size = self.sizes[position] + added
        # Only growth is counted (a removal does not give bytes back): bounded, deterministic work.
        self._check(child, size, self.total + added, f"{where}: ", "could grow to")
        self.sizes[position] = size
        self.total += added
        self.grown.add(position)

    def check_recorded(self, children: list[dict[str, Any]], namespace: str, uid: str) -> None:
        """SpecError naming the first of `children` (the ones counted here, as patched) that the
        API server could never store once Metacontroller records it: it writes the whole child as
        applied (with its namespace and controller-uid label) as JSON into the annotation
        LAST_APPLIED_ANNOTATION, beside the child's own annotations, and the API server bounds
        all of an object's annotations together."""
        # Each a member added to an object that has others: its JSON without the braces, with a comma.
        stamp = json_size({"namespace": namespace}) + json_size({CONTROLLER_UID_LABEL: uid}) - 2
        for position, child in enumerate(children):
            size = json_size(child) if position in self.grown else self.sizes[position]
            others = annotations_bytes((child.get("metadata") or {}).get("annotations") or {})
            needed = len(LAST_APPLIED_ANNOTATION) + stamp + others
            if needed + WIDEST_GO_ESCAPE * size <= MAX_ANNOTATIONS_BYTES:
                continue  # fits however much of it Go escapes: the common case, without a look at the text
            text = _json(child)
            needed += size + sum(text.count(char) * extra for char, extra in GO_ESCAPE_EXTRA.items())
            if needed > MAX_ANNOTATIONS_BYTES:
                raise SpecError(
                    f"{_named(child)} is {size:,} bytes as JSON: "
                    f"Metacontroller records all of it in the annotation {LAST_APPLIED_ANNOTATION}, and with "
                    f"the child's other annotations that makes {needed:,} bytes, past the API server's bound of "
                    f"{MAX_ANNOTATIONS_BYTES:,} bytes (256 KiB) of annotations per object, so the child could "
                    "never be created or updated: shorten what the spec puts in it (envs, args, extraPodSpec, patches)"
                )

    @staticmethod
    def _check(child: dict[str, Any], size: int, total: int, prefix: str, would: str) -> None:
        name = _named(child)
        if size > MAX_OBJECT_BYTES:
            raise SpecError(
                f"{prefix}{name} {would} {size:,} bytes; the API server stores at most "
                f"{MAX_OBJECT_BYTES:,} bytes (1.5 MiB) per object: shorten what the spec puts in it "
                "(envs, args, extraPodSpec, patches)"
            )
        if total > MAX_ANSWER_BYTES:
            raise SpecError(
                f"{prefix}the graph's children {would} {total:,} bytes together, past the hook's bound of "
                f"{MAX_ANSWER_BYTES:,} bytes (8 MiB) per InferaDeployment (reached at {name}): use fewer services or "
                "smaller envs, args, extraPodSpec and patches"
            )
