"""Metrics and logs: Prometheus metrics that add up across gunicorn workers, one JSON line per
hook call, and gunicorn's own logs in the same JSON format."""

import json
import logging
import os
import select
import sqlite3
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, get_args

import orjson
from prometheus_client import REGISTRY as PROCESS_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily

from hooks import metrics_dir
from hooks.api.status import State
from hooks.flush_timer import FlushTimer

STATES = get_args(State)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

HOOK_CALLS = Counter("infera_hook_requests", "Hook calls by hook and outcome.", ["hook", "outcome"])
HOOK_SECONDS = Histogram(
    "infera_hook_duration_seconds",
    "Time to answer a hook call.",
    ["hook", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)

log = logging.getLogger("hooks")


@cache
def _call_metrics(hook: str, outcome: str) -> tuple[Any, Any]:
    # Looking labelled children up once: labels() is a large share of a cached answer's cost.
    return HOOK_CALLS.labels(hook, outcome), HOOK_SECONDS.labels(hook, outcome)


class StateGauge:
    """infera_inferadeployment_state: one series per InferaDeployment, labelled with its current
    state, value 1; a finalized one has none. Each hook replica exports the states it answered
    (for 30 minutes after its last call), so count with
    `count by (state) (max by (namespace, name, state) (infera_inferadeployment_state))`."""

    def __init__(self, table: metrics_dir.StateTable) -> None:
        self.table = table

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "infera_inferadeployment_state",
            "Current state of each InferaDeployment (a series labelled with it, value 1).",
            labels=["namespace", "name", "state"],
        )
        for row in self.table.rows():
            family.add_metric(row, 1)
        yield family


_directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
STATE_TABLE = metrics_dir.StateTable(os.path.join(_directory, metrics_dir.STATES_FILE) if _directory else ":memory:")
if _directory is None:
    PROCESS_REGISTRY.register(StateGauge(STATE_TABLE))


def record(hook: str, outcome: str, seconds: float, parent: dict[str, Any] | None, summary: "Summary | None") -> None:
    """Count and log one hook call."""
    calls, durations = _call_metrics(hook, outcome)
    calls.inc()
    durations.observe(seconds)
    metadata = (parent or {}).get("metadata") or {}
    state = summary.state if summary else None
    if summary is not None and (state in STATES or summary.finalized) and isinstance(metadata.get("name"), str):
        # A finalized InferaDeployment is gone: it has no state any more.
        STATE_TABLE.set(str(metadata.get("namespace", "")), metadata["name"], None if summary.finalized else state)
    if log.isEnabledFor(logging.INFO):
        _write_call_line(
            {
                "hook": hook,
                "namespace": metadata.get("namespace"),
                "name": metadata.get("name"),
                "generation": metadata.get("generation"),
                "children": summary.children if summary else None,
                "state": state,
                "duration_ms": round(seconds * 1000, 3),
                "outcome": outcome,
                "reason": summary.reason if summary else None,
            }
        )


def _write_call_line(fields: dict[str, Any]) -> None:
    """The call's line, as JsonFormatter would format it, with the fields that are not None.
    Not through `logging`: making a record, walking the handlers and taking their locks cost
    about 11 µs of a distinct sync's 745 µs of CPU, for a line whose shape never changes."""
    line = {"time": utc_timestamp(time.time()), "level": "info", "logger": log.name, "message": "hook call"}
    for key, value in fields.items():
        if value is not None:
            line[key] = value
    CALL_LINES.add(_json_line(line) + "\n")


# Pending lines are written together once they would pass this many bytes: a pipe takes a write
# of up to PIPE_BUF bytes whole, so the lines of the master and of every worker, which share
# stderr, never interleave mid-line.
CALL_LINES_BYTES = select.PIPE_BUF
# ... or this long after the first of them: a worker killed outright (SIGKILL, out of memory)
# loses at most this much of its lines; one that exits otherwise writes them first.
CALL_LINES_SECONDS = 0.1


class LineBatch:
    """Lines for stderr, written a batch at a time: a write of its own cost each call about 6 to
    8 µs of a distinct sync's 745 µs of CPU, and a batch of PIPE_BUF bytes holds about 18 call
    lines."""

    def __init__(self, max_bytes: int, seconds: float) -> None:
        self.max_bytes = max_bytes
        self._lines: list[str] = []
        self._bytes = 0
        self._lock = threading.Lock()
        self._flush_timer = FlushTimer(seconds, self.flush)

    def add(self, line: str) -> None:
        """Write `line` (whole lines, ending in a newline) within `seconds`."""
        size = len(line) if line.isascii() else len(line.encode(errors="surrogatepass"))
        with self._lock:
            if self._bytes + size > self.max_bytes:
                self._write()
            self._lines.append(line)
            self._bytes += size
        self._flush_timer.due()

    def flush(self) -> None:
        """Write the pending lines now."""
        with self._lock:
            self._write()

    def _write(self) -> None:
        """Write the pending lines in one write (with the lock held). Lost if stderr cannot take
        them (there is none, it is closed, the pipe is broken): a lost log line must not fail a
        hook call."""
        lines, self._lines, self._bytes = self._lines, [], 0
        if not lines:
            return
        try:
            sys.stderr.write("".join(lines))
            sys.stderr.flush()
        except Exception:
            pass


CALL_LINES = LineBatch(CALL_LINES_BYTES, CALL_LINES_SECONDS)


class StderrHandler(logging.StreamHandler):
    """The handler of every log record: this process's pending call lines go first, so its
    lines keep their order."""

    def emit(self, record: logging.LogRecord) -> None:
        CALL_LINES.flush()
        super().emit(record)


@dataclass(frozen=True)
class Summary:
    """What the log line and the metrics say about an answer."""

    state: str | None
    children: int | None
    finalized: bool = False
    # Why a call failed (its status message) or was refused (what was wrong with the request).
    reason: str | None = None

    @classmethod
    def of(cls, answer: dict[str, Any]) -> "Summary":
        children = answer.get("children")
        status = answer.get("status") or {}
        return cls(
            status.get("state"),
            len(children) if isinstance(children, list) else None,
            answer.get("finalized") is True,
            status.get("message") if status.get("state") == "failed" else None,
        )


def metrics() -> bytes:
    """Prometheus text format: every worker's metrics when running under `serve`."""
    if _directory is None:
        return generate_latest(PROCESS_REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(StateGauge(STATE_TABLE))
    with metrics_dir.locked(_directory):
        return generate_latest(registry)


def storage_problem() -> str | None:
    """Why metrics cannot be recorded (every hook call records some), or None. Under `serve`
    each worker keeps its metrics in files of a directory the master created."""
    if _directory is not None and not (os.path.isdir(_directory) and os.access(_directory, os.W_OK | os.X_OK)):
        return "the metrics directory (PROMETHEUS_MULTIPROC_DIR) is missing or not writable"
    try:
        STATE_TABLE.check()
    except sqlite3.Error as error:
        return f"the InferaDeployment state table cannot be read: {error}"
    return None


@lru_cache(maxsize=1)
def _utc_second(seconds: int) -> str:
    # Most call lines fall in the same second as the one before: the date is formatted once.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def utc_timestamp(created: float) -> str:
    """RFC 3339 UTC, to the microsecond: 2026-11-30T12:00:00.000123Z."""
    seconds = int(created)
    return f"{_utc_second(seconds)}.{int((created - seconds) * 1e6):06d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return _json_line(line)


def _json_line(line: dict[str, Any]) -> str:
    try:  # one line per hook call: orjson writes it in a fifth of the time
        return orjson.dumps(line, default=str).decode()
    except TypeError:  # a lone surrogate (in an exception's text) or a huge integer
        return json.dumps(line, default=str)


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonFormatter}},
    "handlers": {
        "stderr": {"class": "hooks.observability.StderrHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    },
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
    },
}
