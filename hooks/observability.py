"""Metrics and logs: Prometheus metrics that add up across gunicorn workers, one JSON line per
hook call, and gunicorn's own logs in the same JSON format."""

import json
import logging
import os
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client import REGISTRY as PROCESS_REGISTRY

STATES = ("initializing", "pending", "ready", "failed", "terminating")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

HOOK_CALLS = Counter("infera_hook_requests", "Hook calls by hook and outcome.", ["hook", "outcome"])
HOOK_SECONDS = Histogram(
    "infera_hook_duration_seconds",
    "Time to answer a hook call.",
    ["hook", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
# 1 for an InferaDeployment's current state, 0 for the others (all 0 once finalized); across
# gunicorn workers the most recent value wins. Each hook replica exports its own series, so count
# with `count by (state) (max by (namespace, name, state) (infera_inferadeployment_state) == 1)`.
STATE = Gauge(
    "infera_inferadeployment_state",
    "Current state of each InferaDeployment (1 for its state, 0 for the others).",
    ["namespace", "name", "state"],
    multiprocess_mode="mostrecent",
)

log = logging.getLogger("hooks")


@cache
def _call_metrics(hook: str, outcome: str) -> tuple[Any, Any]:
    # Looking labelled children up once: labels() is a large share of a cached answer's cost.
    return HOOK_CALLS.labels(hook, outcome), HOOK_SECONDS.labels(hook, outcome)


@lru_cache(maxsize=65536)
def _state_metrics(namespace: str, name: str) -> tuple[tuple[str, Any], ...]:
    return tuple((state, STATE.labels(namespace, name, state)) for state in STATES)


def record(hook: str, outcome: str, seconds: float, parent: dict[str, Any] | None, summary: "Summary | None") -> None:
    """Count and log one hook call."""
    calls, durations = _call_metrics(hook, outcome)
    calls.inc()
    durations.observe(seconds)
    metadata = (parent or {}).get("metadata") or {}
    state = summary.state if summary else None
    if (state in STATES or (summary and summary.finalized)) and isinstance(metadata.get("name"), str):
        # A finalized InferaDeployment is gone: it counts in no state any more.
        for each, gauge in _state_metrics(str(metadata.get("namespace", "")), metadata["name"]):
            gauge.set(1 if each == state and not summary.finalized else 0)
    fields = {
        "hook": hook,
        "namespace": metadata.get("namespace"),
        "name": metadata.get("name"),
        "generation": metadata.get("generation"),
        "children": summary.children if summary else None,
        "state": state,
        "duration_ms": round(seconds * 1000, 3),
        "outcome": outcome,
    }
    log.info("hook call", extra={"fields": {k: v for k, v in fields.items() if v is not None}})


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
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(PROCESS_REGISTRY)


def storage_problem() -> str | None:
    """Why metrics cannot be recorded (every hook call records some), or None. Under `serve`
    each worker keeps its metrics in files of a directory the master created."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory is None or (os.path.isdir(directory) and os.access(directory, os.W_OK | os.X_OK)):
        return None
    return "the metrics directory (PROMETHEUS_MULTIPROC_DIR) is missing or not writable"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, structured fields, traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line |= getattr(record, "fields", {})
        if record.exc_info:
            line["traceback"] = "".join(traceback.format_exception(*record.exc_info))
        return json.dumps(line, default=str)


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonFormatter}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["stderr"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        # Every hook call already logs one line; probes every few seconds would drown them.
        "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
    },
}
