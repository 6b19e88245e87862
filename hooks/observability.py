"""Metrics and logs: Prometheus metrics that add up across gunicorn workers, one JSON line per
hook call, and gunicorn's own logs in the same JSON format."""

import json
import logging
import os
import sqlite3
import sys
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
from hooks.api import State

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
            }
        )


def _write_call_line(fields: dict[str, Any]) -> None:
    """The call's line, as JsonFormatter would format it, with the fields that are not None, on
    stderr (where LOGGING sends every line). Not through `logging`: making a record, walking the
    handlers and taking their locks cost about 11 µs of a distinct sync's 745 µs of CPU, for a
    line whose shape never changes."""
    line = {"time": utc_timestamp(time.time()), "level": "info", "logger": log.name, "message": "hook call"}
    for key, value in fields.items():
        if value is not None:
            line[key] = value
    try:
        sys.stderr.write(_json_line(line) + "\n")
        sys.stderr.flush()
    except Exception:  # no stderr, a closed or broken one: a lost line must not fail the call
        pass


@dataclass(frozen=True)
class Summary:
    """What the log line and the metrics say about an answer."""

    state: str | None
    children: int | None
    finalized: bool = False

    @classmethod
    def of(cls, answer: dict[str, Any]) -> "Summary":
        children = answer.get("children")
        return cls(
            (answer.get("status") or {}).get("state"),
            len(children) if isinstance(children, list) else None,
            answer.get("finalized") is True,
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
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
    },
}
