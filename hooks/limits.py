"""Size bounds: what the API server refuses by size, and what keeps one request's work small.

A spec can make the hook render far more than it says (a JSON-patch `copy` doubles a child; a
long `spec.envs` lands in every pool), so every rendered child is measured as it is made and
the answer stops growing at a fixed bound, long before the hook pod's memory limit.
"""

import json
from typing import Any

from hooks.api import SpecError

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


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON, as a child travels to the API server."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def nesting(value: Any) -> int:
    """How many objects and lists deep `value` is (0 for a scalar), counted level by level, so
    that a value too deep for recursion is measured too."""
    depth, level = 0, [value]
    while level := [node for node in level if isinstance(node, (dict, list))]:
        depth += 1
        level = [item for node in level for item in (node.values() if isinstance(node, dict) else node)]
    return depth


class RenderedSize:
    """The size of each rendered child and of the whole answer, checked as they grow."""

    def __init__(self) -> None:
        self.total = 0
        self.sizes: list[int] = []

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

    @staticmethod
    def _check(child: dict[str, Any], size: int, total: int, prefix: str, would: str) -> None:
        name = f"{child.get('kind')} {(child.get('metadata') or {}).get('name')}"
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
