"""spec.monitoring through the hook app and the simulated Metacontroller: the PodMonitor is one
more child that converges, goes when monitoring is turned off, and is withheld with a reason
where the CompositeController does not register it."""

from typing import Any

from tests.graph.test_blue_green import checked_sync, new_image
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import need_schemas
from tests.support.requests import PD, children_by_key, controller, parent, request_body
from tests.support.simulator import Metacontroller

WITH_MONITORING = controller("monitoring")


def monitored(**monitoring: Any) -> GraphBuilder:
    """The PD graph with spec.monitoring `monitoring`."""
    return graph().monitoring(**monitoring)


def test_the_pod_monitor_converges_and_goes_with_monitoring(hooks) -> None:
    need_schemas()
    mc = Metacontroller(hooks, monitored().obj(), composite=WITH_MONITORING)
    mc.converge()
    assert mc.sync() == []
    assert ("PodMonitor", "qwen-pd-metrics") in mc.children
    mc.edit(lambda spec: spec["monitoring"].update(natsExporter={"enabled": True}))
    # The exporter joins the broker's pod, and the PodMonitor scrapes it.
    assert sorted(mc.child_writes(mc.sync())) == [
        ("update", "PodMonitor", "qwen-pd-metrics"),
        ("update", "StatefulSet", "qwen-pd-nats"),
    ]
    mc.converge()
    mc.edit(lambda spec: spec.pop("monitoring"))
    assert sorted(mc.child_writes(mc.sync())) == [
        ("delete", "PodMonitor", "qwen-pd-metrics"),
        ("update", "StatefulSet", "qwen-pd-nats"),
    ]
    mc.converge()
    assert mc.sync() == []


def test_an_unregistered_pod_monitor_is_withheld_with_a_reason(hooks) -> None:
    answer = hooks.hook("/sync", request_body(monitored().obj(), composite=controller()))
    assert answer["status"]["state"] == "failed"
    assert answer["status"]["message"] == (
        "PodMonitor qwen-pd-metrics cannot be created: this CompositeController does not register PodMonitor "
        "(monitoring.coreos.com/v1); enable the kustomize component metacontroller/components/monitoring; "
        "creating 3 services"
    )
    # The rest of the graph is exactly what it is without monitoring.
    plain = hooks.hook("/sync", request_body(parent(PD), composite=controller()))
    assert children_by_key(answer) == children_by_key(plain)


def test_teardown_removes_the_pod_monitor_with_the_plane(hooks) -> None:
    """Prometheus sees the workers drain: the PodMonitor goes with the broker, after them."""
    need_schemas()
    mc = Metacontroller(hooks, monitored().obj(), composite=WITH_MONITORING)
    mc.converge()
    for _ in range(8):
        writes = mc.finalize()
        if ("delete", "PodMonitor", "qwen-pd-metrics") in writes:
            assert ("delete", "StatefulSet", "qwen-pd-nats") in writes
            # The workers went before, in a step of their own.
            assert not [write for write in writes if write[1] == "Deployment"]
            break
        assert ("PodMonitor", "qwen-pd-metrics") in mc.children
        mc.pods_finish_draining()
    else:
        raise AssertionError(f"the PodMonitor outlived teardown: {sorted(mc.children)}")


def test_one_pod_monitor_watches_both_generations_of_a_blue_green_rollout(hooks) -> None:
    """Under BlueGreen the PodMonitor belongs to the graph, not a generation: a rollout creates,
    switches and drains generations without writing it, and its series say which generation
    they come from by the pods' label."""
    need_schemas()
    mc = Metacontroller(hooks, monitored().blue_green().obj(), composite=WITH_MONITORING).serve()
    pod_monitor = mc.children[("PodMonitor", "qwen-pd-metrics")]
    mc.edit(new_image)
    writes = []
    for _ in range(6):
        writes += checked_sync(mc)
        mc.mark_ready()
    assert mc.parent["status"]["rollout"]["phase"] == "Stable"
    assert {write[0] for write in writes} == {"create", "update", "delete"}
    assert [write for write in writes if write[1] == "PodMonitor"] == []
    assert mc.children[("PodMonitor", "qwen-pd-metrics")] == pod_monitor
