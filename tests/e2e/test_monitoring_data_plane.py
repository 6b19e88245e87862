"""spec.monitoring on the data plane: a real Prometheus, configured from the PodMonitor the hook
rendered (tests/support/e2e/monitoring.py translates it as the Prometheus Operator does, with the
sandbox's pods as static targets), scrapes the router and the stand-in engines of a
prefill/decode graph; the monitoring component's rules and dashboard run against it."""

from tests.e2e.test_data_plane import CLIENTS, HTTP_BESIDE_NATS, PEERS, run_scenario
from tests.support.e2e import monitoring, sandbox
from tests.support.e2e.graphs import server, worker
from tests.support.prerequisites import need_schemas
from tests.support.prometheus import programs


def test_prometheus_scrapes_what_the_pod_monitor_selects(hooks) -> None:
    sandbox.need_sandbox()
    need_schemas()
    built = programs()  # skips (or fails under INFERA_REQUIRE_ALL) without Go
    run_scenario(
        hooks,
        monitoring.SCENARIO,
        lambda model: {
            "monitoring": {},
            "services": {
                "server": server(model),
                "prefill": worker(model, "prefill"),
                "decode": worker(model, "decode"),
            },
        },
        # Prometheus scrapes from the node, which no NetworkPolicy judges: what the policies
        # admit is the prefill/decode graph's.
        CLIENTS | HTTP_BESIDE_NATS | PEERS,
        env={monitoring.PROMETHEUS_ENV: str(built["prometheus"]), monitoring.PROMTOOL_ENV: str(built["promtool"])},
    )
