"""The render memo: what the sync's pure steps made for each parent, computed once per worker.

It wraps the steps from outside: the sync calls a step through it (`remembered`, `rolled_up`),
and no step knows it is kept. The desired children are a pure function of the parent's identity and spec, the kinds the
CompositeController registers, and a few facts about the observed children (an autoscaler's
live count, where the model download is); the status, of the observed children's statuses and
the previous conditions (and of the clock, when a condition changes). Almost every sync
differs from the one before only in what the observed children report (a resourceVersion
moved, a pod became ready), so those inputs repeat and are answered from here; a sync then
costs decoding and checking the request and the immutable-field check. Keys carry a digest of
this build (its code, its data and its dependencies), and the memo lives in the worker's memory:
a new build never sees an old build's renders. It is bounded by the memory its entries take, least recently used out first.
"""

import dataclasses
import hashlib
import importlib.metadata
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

import orjson
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel

from hooks import DISTRIBUTION
from hooks.api.fields import SpecError
from hooks.api.graph import InferaDeployment, ParentMeta
from hooks.encoding import EncodedChild

T = TypeVar("T")
P = ParamSpec("P")


def dependency_versions(distribution: str) -> dict[str, str]:
    """The installed version of `distribution` and of every distribution it needs to run (its
    requirements and theirs, with the extras they name, not its own optional ones), by
    normalised name; {} when it is not installed (run from a source checkout)."""
    versions: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    pending = [(distribution, "")]
    while pending:
        name, extra = pending.pop()
        key = canonicalize_name(name)
        if (key, extra) in seen:
            continue
        seen.add((key, extra))
        try:
            metadata = importlib.metadata.metadata(name)  # parsed once: it is most of the cost
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python, not installed here
        versions[key] = metadata["Version"]
        for line in metadata.get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                pending += [(requirement.name, wanted) for wanted in ("", *requirement.extras)]
    return versions


def build_digest(package: Path, versions: dict[str, str]) -> bytes:
    """A digest of everything an answer depends on besides the request: every file of the
    package (its code and its data, such as the Kubernetes schema), the interpreter and the
    versions of the installed distributions, so that a new build differs even when the
    package's version does not."""
    digest = hashlib.sha256(sys.version.encode() + b"\0")
    files = sorted(path for path in package.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    for name, version in sorted(versions.items()):
        digest.update(f"{name}=={version}\0".encode())
    return digest.digest()


BUILD_DIGEST = build_digest(Path(__file__).parent, dependency_versions(DISTRIBUTION))
# The parent's metadata a render reads (InferaDeployment.from_parent parses only these).
PARENT_FIELDS = tuple(ParentMeta.model_fields)
# Results kept per parent and remembered function: the current one and the one before, which
# the observed children may return to (a sync in flight with an older world, a pod flapping).
KEPT_PER_PARENT = 2
# Per gunicorn worker, counted as the memory the entries take (retained_bytes): room for about
# 1,300 PD graphs (32 KB each: 20 KB of children, 11 KB of parsed model, the rest the status
# and bookkeeping), what keeps a worker under 100 MB (docs/performance.md).
MEMO_BYTES = 40 * 1024 * 1024
# What the memo's own bookkeeping takes beside the values it measures: a parent's entry (its
# object, its digest, its table of tables and its place in the memo), a remembered function's
# table, and a kept result's key and place in its table.
ENTRY_OVERHEAD = 1000
TABLE_OVERHEAD = 200
KEPT_OVERHEAD = 200

# What a remembered call returned, or the SpecError message it raised (raised afresh each time).
Result = tuple[bool, Any]
# A rolled-up status: its state, and the status as canonical JSON.
RolledUp = tuple[str | None, bytes]


@dataclass
class ParentEntry:
    """One parent's parsed model (or why its spec is invalid), and its latest results of each
    remembered function, by the function's name."""

    digest: bytes
    parsed: InferaDeployment | str
    size: int
    tables: dict[str, OrderedDict[bytes, Any]] = field(default_factory=dict)

    def idep(self) -> InferaDeployment:
        if isinstance(self.parsed, str):
            raise SpecError(self.parsed)
        return self.parsed

    def kept(self, function: Callable[..., Any]) -> "OrderedDict[bytes, Any]":
        """The results of `function` kept for this parent, oldest first."""
        return self.tables.get(_table_name(function), OrderedDict())


def _table_name(function: Callable[..., Any]) -> str:
    """A remembered function's name: a module's own function, so that no two share a table."""
    name = f"{function.__module__}.{function.__qualname__}"
    if "<" in name:  # a lambda or a local function: another of the same name may compute otherwise
        raise ValueError(f"{name} cannot be remembered: only a module's own functions can")
    return name


# Objects every value shares rather than holds.
_SHARED = (type(None), bool)
# Objects that hold no others.
_LEAVES = (str, bytes, int, float)


def retained_bytes(value: Any) -> int:
    """The memory `value` holds: the size of every object it reaches (a parsed model's fields,
    a dict's keys and values, a child's body...), each once. What values share is left out:
    None, booleans, enum members, a model's field names."""
    total, seen, pending = 0, set(), [value]
    while pending:
        obj = pending.pop()
        kind = type(obj)
        if kind in _SHARED or id(obj) in seen:
            continue
        seen.add(id(obj))
        if kind in _LEAVES:
            total += sys.getsizeof(obj)
        elif kind is dict:
            total += sys.getsizeof(obj)
            pending += obj
            pending += obj.values()
        elif kind is list or kind is tuple:
            total += sys.getsizeof(obj)
            pending += obj
        elif isinstance(obj, BaseModel):
            fields = obj.__dict__
            total += sys.getsizeof(obj) + sys.getsizeof(fields) + sys.getsizeof(obj.__pydantic_fields_set__)
            pending += fields.values()
        elif kind is EncodedChild:
            total += sys.getsizeof(obj)
            pending += (obj.kind, obj.api_version, obj.name, obj.service, obj.body, obj.fields)
        elif not isinstance(obj, Enum):
            total += sys.getsizeof(obj)
    return total


def _plain(value: Any) -> Any:
    """What JSON does not hold, as a key holds it: a set sorted, a dataclass by its fields (where
    orjson does not write it itself), a parsed graph as the generation it renders (the parent's
    entry holds its spec)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, InferaDeployment):
        return value.graph_generation
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {item.name: getattr(value, item.name) for item in dataclasses.fields(value)}
    raise TypeError(f"{type(value).__name__} is no key")


def _document(inputs: Any) -> bytes:
    """Inputs as JSON, maps' keys in the order given: Metacontroller sends them sorted, and the
    same data in another order only costs a render. (Decoding refused every number orjson
    would write as null.)"""
    try:
        return orjson.dumps(inputs, default=_plain)
    except TypeError:  # a lone surrogate, an integer beyond 64 bits, nesting past 254 levels
        return json.dumps(inputs, separators=(",", ":"), default=_plain).encode()


def _digest(document: bytes) -> bytes:
    return hashlib.sha256(BUILD_DIGEST + document).digest()


def key_of(inputs: Any) -> bytes:
    """The key of a call's arguments (with the parent's entry, which holds its spec)."""
    return _digest(_document(inputs))


def _identity(parent: dict[str, Any]) -> tuple[bytes, bytes]:
    """What a render reads of the parent, as JSON, and its digest."""
    metadata = parent.get("metadata") or {}
    document = _document([[[k, metadata[k]] for k in PARENT_FIELDS if k in metadata], parent.get("spec")])
    return document, _digest(document)


def _check_graphs(entry: ParentEntry, args: tuple[Any, ...]) -> None:
    """A parsed graph in a key stands for its generation alone (_plain): it must be the entry's."""
    for arg in args:
        if isinstance(arg, InferaDeployment) and (isinstance(entry.parsed, str) or arg.spec is not entry.parsed.spec):
            raise ValueError("a remembered call's graph must be its parent entry's")


class ReadClock:
    """A clock that remembers whether it was read."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.read = False

    def __call__(self) -> datetime:
        self.read = True
        return self.clock()


class RenderMemo:
    """Parents by digest, least recently used out first, bounded in bytes. A memo of no bytes
    keeps nothing: every call computes afresh through the same code (the CLI, the tests)."""

    def __init__(self, max_bytes: int = MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, ParentEntry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self._bytes

    def holds(self, parent: dict[str, Any]) -> bool:
        """Whether the parent's entry is here (looked up, not parsed, not moved)."""
        with self._lock:
            return _identity(parent)[1] in self._entries

    def parent(self, parent: dict[str, Any]) -> ParentEntry:
        """The parent's entry, parsing it on a miss."""
        document, digest = _identity(parent)
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                return entry
        try:
            parsed: InferaDeployment | str = InferaDeployment.from_parent(parent)
        except SpecError as error:
            parsed = str(error)
        entry = ParentEntry(digest, parsed, ENTRY_OVERHEAD + retained_bytes(parsed))
        self._store(entry)
        return entry

    def remembered(self, entry: ParentEntry, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """What `function` (pure: plain data and the parent's graph in, plain data out, which
        nobody changes) returns for these arguments, from the memo when it was called with them
        for this parent before. A SpecError is remembered and raised again."""
        _check_graphs(entry, args)
        table = self._table(entry, function)
        key = key_of([args, kwargs])
        result: Result | None = self._get(table, key)
        if result is None:
            try:
                result = (True, function(*args, **kwargs))
            except SpecError as error:
                result = (False, str(error))
            self._add(entry, table, key, result)
        valid, value = result
        if not valid:
            raise SpecError(value)
        return cast(T, value)

    def rolled_up(
        self, entry: ParentEntry, roll_up: Callable[..., RolledUp], *args: Any, now: Callable[[], datetime]
    ) -> RolledUp:
        """What `roll_up(*args, clock)` returns, from the memo when it was called with these
        `args` for this parent before, and kept only when it did not read the clock: a
        condition changed then, and the same inputs later must get a later time."""
        _check_graphs(entry, args)
        table = self._table(entry, roll_up)
        key = key_of(args)
        rolled_up: RolledUp | None = self._get(table, key)
        if rolled_up is None:
            clock = ReadClock(now)
            rolled_up = roll_up(*args, clock)
            if not clock.read:
                self._add(entry, table, key, rolled_up)
        return rolled_up

    def _table(self, entry: ParentEntry, function: Callable[..., Any]) -> "OrderedDict[bytes, Any]":
        name = _table_name(function)
        with self._lock:
            table = entry.tables.get(name)
            if table is None:
                table = entry.tables[name] = OrderedDict()
                if self._entries.get(entry.digest) is entry:  # else the entry is not counted
                    entry.size += TABLE_OVERHEAD
                    self._bytes += TABLE_OVERHEAD
            return table

    def _get(self, table: "OrderedDict[bytes, Any]", key: bytes) -> Any:
        with self._lock:
            value = table.get(key)
            if value is not None:
                table.move_to_end(key)
            return value

    def _store(self, entry: ParentEntry) -> None:
        with self._lock:
            if entry.size > self.max_bytes or entry.digest in self._entries:
                return
            self._entries[entry.digest] = entry
            self._bytes += entry.size
            self._evict()

    def _add(self, entry: ParentEntry, table: "OrderedDict[bytes, Any]", key: bytes, value: Any) -> None:
        size = KEPT_OVERHEAD + retained_bytes(value)
        with self._lock:
            if self._entries.get(entry.digest) is not entry or key in table:
                return  # evicted meanwhile, or another request computed it
            table[key] = value
            entry.size += size
            self._bytes += size
            while len(table) > KEPT_PER_PARENT:
                _, dropped = table.popitem(last=False)
                dropped_size = KEPT_OVERHEAD + retained_bytes(dropped)
                entry.size -= dropped_size
                self._bytes -= dropped_size
            self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size
