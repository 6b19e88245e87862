"""Metrics and logs: Prometheus metrics that add up across gunicorn workers, one JSON line per
hook call, and gunicorn's own logs in the same JSON format."""

import json
import logging
import os
import time
import traceback
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import orjson
from prometheus_client import REGISTRY as PROCESS_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess

from hooks import metrics_dir

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
    # Each labelled child looked up once: labels() costs more than counting.
    return HOOK_CALLS.labels(hook, outcome), HOOK_SECONDS.labels(hook, outcome)


# Under `serve`, the directory where every worker keeps its metrics (configure()); None in one process.
_directory: str | None = None


def configure(metrics_directory: str | None) -> None:
    """Sum the metrics of every worker from `metrics_directory` (where `serve` pointed
    PROMETHEUS_MULTIPROC_DIR before prometheus_client was imported), or keep this process's."""
    global _directory
    _directory = metrics_directory


# The attribute of a log record that holds a hook call's fields, which its JSON line carries.
CALL_FIELDS = "hook_call"


def record(hook: str, outcome: str, seconds: float, parent: dict[str, Any] | None, summary: "Summary | None") -> None:
    """Count and log one hook call."""
    calls, durations = _call_metrics(hook, outcome)
    calls.inc()
    durations.observe(seconds)
    metadata = (parent or {}).get("metadata") or {}
    if log.isEnabledFor(logging.INFO):
        fields = {
            "hook": hook,
            "namespace": metadata.get("namespace"),
            "name": metadata.get("name"),
            "generation": metadata.get("generation"),
            "children": summary.children if summary else None,
            "state": summary.state if summary else None,
            "duration_ms": round(seconds * 1000, 3),
            "outcome": outcome,
            "reason": summary.reason if summary else None,
        }
        log.info("hook call", extra={CALL_FIELDS: {key: value for key, value in fields.items() if value is not None}})


@dataclass(frozen=True)
class Summary:
    """What the log line and the metrics say about an answer."""

    state: str | None
    children: int | None
    # Why a call failed (its status message) or was refused (what was wrong with the request).
    reason: str | None = None

    @classmethod
    def of(cls, answer: dict[str, Any]) -> "Summary":
        children = answer.get("children")
        status = answer.get("status") or {}
        return cls(
            status.get("state"),
            len(children) if isinstance(children, list) else None,
            status.get("message") if status.get("state") == "failed" else None,
        )


def metrics() -> bytes:
    """Prometheus text format: every worker's metrics when running under `serve`."""
    if _directory is None:
        return generate_latest(PROCESS_REGISTRY)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    with metrics_dir.locked(_directory):
        return generate_latest(registry)


def storage_problem() -> str | None:
    """Why metrics cannot be recorded (every hook call records some), or None. Under `serve`
    each worker keeps its metrics in files of a directory the master created."""
    if _directory is not None and not (os.path.isdir(_directory) and os.access(_directory, os.W_OK | os.X_OK)):
        return "the metrics directory (PROMETHEUS_MULTIPROC_DIR) is missing or not writable"
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
        line.update(getattr(record, CALL_FIELDS, ()))
        if record.exc_info:
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return _json_line(line)


def _json_line(line: dict[str, Any]) -> str:
    try:  # one line per hook call: orjson writes it faster
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
