"""How kubelet checks and stops each process: probes and the preStop hook, with their timings."""

import math
from typing import Any

from hooks.runtime import (
    EPP_HEALTH_PORT,
    MODEL_LOAD_SECONDS,
    PRESTOP_SECONDS,
    STARTUP_PERIOD_SECONDS,
    STARTUP_SLACK_SECONDS,
    ready_timeout_seconds,
)


def probe(action: dict[str, Any], *, period: int, timeout: int, failures: int, delay: int = 0) -> dict[str, Any]:
    """A probe as the API server stores it: every timing written out (defaults included), so the
    stored object never differs from the rendered one."""
    rendered = {
        **action,
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
        "successThreshold": 1,
    }
    if delay:
        rendered["initialDelaySeconds"] = delay
    return rendered


def http_get(path: str, port: int) -> dict[str, Any]:
    """A fresh action per probe: children share no objects (a shared one would be patched twice
    and dumped as a YAML alias)."""
    return {"httpGet": {"path": path, "port": port, "scheme": "HTTP"}}


def worker_probes(port: int, env: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The engine's /health, three ways. Startup: a model load is never killed, however long
    the wrapper is allowed to wait for it. Liveness, once started: a hung engine is restarted
    after three minutes without an answer (a full batch can stall /health for seconds, never
    minutes). Readiness: the upstream operator's timing (its /health runs a tiny prefill that
    often takes over a second)."""
    load = max(MODEL_LOAD_SECONDS, ready_timeout_seconds(env))
    startup_failures = math.ceil((load + STARTUP_SLACK_SECONDS) / STARTUP_PERIOD_SECONDS)
    return {
        "startupProbe": probe(
            http_get("/health", port), period=STARTUP_PERIOD_SECONDS, timeout=10, failures=startup_failures
        ),
        "livenessProbe": probe(http_get("/health", port), period=20, timeout=10, failures=9),
        "readinessProbe": probe(http_get("/health", port), period=15, timeout=10, failures=6, delay=15),
    }


def router_readiness(path: str, port: int) -> dict[str, Any]:
    """A router is ready once it serves HTTP (its /health answers while it has no workers)."""
    return probe(http_get(path, port), period=10, timeout=5, failures=3)


def router_liveness(port: int) -> dict[str, Any]:
    """A router whose HTTP server stops answering /health (it answers whatever its pool) for a
    minute is hung: restarted."""
    return probe(http_get("/health", port), period=20, timeout=5, failures=3)


def _epp_health() -> dict[str, Any]:
    return {"grpc": {"port": EPP_HEALTH_PORT, "service": "inference-extension"}}


def epp_readiness() -> dict[str, Any]:
    """The gRPC health service the picker serves on its health port."""
    return probe(_epp_health(), period=10, timeout=5, failures=3)


def epp_liveness() -> dict[str, Any]:
    """The same service: a picker that stops answering it for a minute is restarted."""
    return probe(_epp_health(), period=20, timeout=5, failures=3)


def prestop() -> dict[str, Any]:
    """Requests stop arriving before SIGTERM starts the drain (see runtime.PRESTOP_SECONDS)."""
    return {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}
