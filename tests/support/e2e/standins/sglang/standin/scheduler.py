"""Admission, request states and the record of every request served.

SGLang's `/metrics` counts requests by where they are: running (in a batch), queued (waiting for
a slot), and, on a PD pair, the handoff queues a graceful drain must also wait for (a prefill
request waiting for its decode to connect, then for its KV to be taken; a decode request waiting
to reach its prefill, then for the KV). Every request here is in exactly one of those states at a
time, so the gauges are the truth, not an estimate: a drain that reads zero really has nothing
in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class State(Enum):
    """Where an unfinished request is; the value is the SGLang gauge that counts it."""

    QUEUED = "sglang:num_queue_reqs"
    RUNNING = "sglang:num_running_reqs"
    PREFILL_BOOTSTRAP = "sglang:num_prefill_bootstrap_queue_reqs"
    PREFILL_INFLIGHT = "sglang:num_prefill_inflight_queue_reqs"
    DECODE_PREALLOC = "sglang:num_decode_prealloc_queue_reqs"
    DECODE_TRANSFER = "sglang:num_decode_transfer_queue_reqs"


class EngineError(Exception):
    """A request the engine refuses or fails, with the HTTP status SGLang answers."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class RequestRecord:
    """One request as `/standin/requests` lists it (compared by identity)."""

    path: str
    role: str
    pod: str
    port: int
    model: str | None
    stream: bool
    messages: Any
    prompt: Any
    body: dict[str, Any]
    bootstrap_host: str | None
    bootstrap_port: int | None
    bootstrap_room: int | None
    dp_rank: int
    request_id: str | None
    client: str | None  # the address the request came from: the router (HTTP) or the wrapper (NATS)
    version: str | None = None  # the engine's STANDIN_VERSION
    started: float = field(default_factory=time.time)
    finished: float | None = None
    outcome: str = "running"  # running | ok | aborted | error
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""
    state: State | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["state"] = self.state.name.lower() if self.state else None
        return out


class Scheduler:
    """Counts requests by state, bounds how many run at once (--max-running-requests) and how
    many may wait (--max-queued-requests), and keeps every request's record."""

    def __init__(self, max_running: int | None, max_queued: int | None) -> None:
        self.records: list[RequestRecord] = []
        self.unfinished: set[RequestRecord] = set()
        self.in_state: Counter[State] = Counter()
        self.totals: Counter[str] = Counter()
        self._slots = asyncio.Semaphore(max_running) if max_running else None
        self._max_queued = max_queued

    def open(self, record: RequestRecord) -> None:
        self.records.append(record)
        self.unfinished.add(record)
        self.totals["sglang:num_requests_total"] += 1

    def move(self, record: RequestRecord, state: State | None) -> None:
        if record.state is not None:
            self.in_state[record.state] -= 1
        record.state = state
        if state is not None:
            self.in_state[state] += 1

    def close(self, record: RequestRecord, outcome: str, error: str | None = None) -> None:
        """The request is done, whatever happened; idempotent, the first outcome stands."""
        if record.finished is not None:
            return
        self.move(record, None)
        self.unfinished.discard(record)
        record.finished = time.time()
        record.outcome = outcome
        record.error = error
        self.totals["sglang:prompt_tokens_total"] += record.prompt_tokens
        self.totals["sglang:generation_tokens_total"] += record.completion_tokens
        self.totals["sglang:cached_tokens_total"] += record.cached_tokens
        if outcome != "ok":
            self.totals["sglang:num_aborted_requests_total"] += 1

    @contextlib.asynccontextmanager
    async def running(self, record: RequestRecord) -> AsyncIterator[None]:
        """Hold a running slot: queued until one is free, 503 when the queue is full."""
        if self._slots is None:
            self.move(record, State.RUNNING)
            yield
            return
        if self._slots.locked() and self._max_queued is not None and self.in_state[State.QUEUED] >= self._max_queued:
            raise EngineError(503, "The request queue is full.")
        self.move(record, State.QUEUED)
        async with self._slots:
            self.move(record, State.RUNNING)
            yield
