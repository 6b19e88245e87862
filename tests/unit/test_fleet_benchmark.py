"""The fleet benchmark's arithmetic (tests/bench/cluster_fleet): what it reads from the audit log,
the hook's log and the API server's histogram is what those say."""

import json
from collections import Counter
from pathlib import Path

from tests.bench.cluster_fleet import upstream
from tests.bench.cluster_fleet.meter import audit_writes, histogram_quantile, hook_calls
from tests.support.metacontroller import USER as METACONTROLLER_USER


def test_histogram_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    # 100 requests: 50 under 10 ms, 90 under 50 ms, all under 1 s.
    buckets = Counter({0.01: 50, 0.05: 90, 1.0: 100, float("inf"): 100})
    assert histogram_quantile(0.5, buckets) == 0.01
    assert histogram_quantile(0.7, buckets) == 0.01 + 0.04 * (70 - 50) / 40
    assert histogram_quantile(0.99, buckets) == 0.05 + 0.95 * 9 / 10
    assert histogram_quantile(0.5, Counter()) == 0.0


def event(user: str, verb: str, resource: str, code: int = 200, subresource: str = "") -> dict:
    ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
    return {
        "stage": "ResponseComplete",
        "user": {"username": user},
        "verb": verb,
        "objectRef": ref,
        "responseStatus": {"code": code},
    }


def test_writes_are_counted_by_verb_and_resource_for_metacontroller_and_in_sum_for_the_rest(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    earlier = json.dumps(event(METACONTROLLER_USER, "create", "deployments")) + "\n"
    events = [
        event(METACONTROLLER_USER, "create", "deployments"),
        event(METACONTROLLER_USER, "create", "deployments"),
        event(METACONTROLLER_USER, "update", "inferadeployments", subresource="status"),
        event(METACONTROLLER_USER, "update", "deployments", code=409),  # a conflict writes nothing
        event("system:kube-controller-manager", "create", "replicasets"),
        {**event(METACONTROLLER_USER, "create", "services"), "stage": "ResponseStarted"},
    ]
    log.write_text(earlier + "".join(json.dumps(e) + "\n" for e in events))
    writes, others = audit_writes(log, len(earlier), log.stat().st_size)
    assert writes == Counter({"create deployments": 2, "update inferadeployments/status": 1})
    assert others == 1


def test_hook_calls_are_read_from_the_call_lines_of_the_hook_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = [
        {"time": "t", "message": "hook call", "hook": "sync", "duration_ms": 2.5},
        {"time": "t", "message": "Booting worker"},
        {"time": "t", "message": "hook call", "hook": "finalize", "duration_ms": 7.0},
    ]
    log.write_text("[2026] gunicorn text line\n" + "".join(json.dumps(line) + "\n" for line in lines))
    assert hook_calls(log, 0, log.stat().st_size) == (Counter({"sync": 1, "finalize": 1}), [2.5, 7.0])


def test_the_upstream_operator_sends_what_its_client_lets_through() -> None:
    # 1,000 graphs: 6,600 updates a pass asked every 15 s; the 2,400 Deployment updates at 20
    # per second make a pass take 120 s.
    assert sum(upstream.updates_per_pass(1000).values()) == 6600
    assert upstream.writes_per_second(1000) == (440.0, 55.0)
    # 100 graphs fit in 15 s.
    assert upstream.writes_per_second(100) == (44.0, 44.0)
