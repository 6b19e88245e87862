"""The status contract: truthful states, stable conditions, integers, nothing the CRD would prune."""

from datetime import UTC, datetime, timedelta
from typing import Any

from hooks import reconcile
from hooks.contract import parse_request
from tests.support.prerequisites import REPO
from tests.support.requests import PD, controller, load_yaml, parent
from tests.support.simulator import Metacontroller

LONG_AGO = "2026-01-01T00:00:00Z"


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_initializing_then_pending_then_ready(hooks) -> None:
    mc = Metacontroller(hooks, PD)
    mc.sync()
    status = mc.parent["status"]
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "state": "initializing",
        "message": "creating 3 services",
        "readyServices": "0/3",
        "observedGeneration": 1,
        # What the workloads have, and nothing exists yet.
        "services": {
            "decode": {"kind": "Deployment", "replicas": 0, "readyReplicas": 0},
            "prefill": {"kind": "Deployment", "replicas": 0, "readyReplicas": 0},
            "server": {"kind": "Deployment", "replicas": 0, "readyReplicas": 0},
        },
    }
    ready = conditions(status)["Ready"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("False", "Initializing", 1)

    mc.converge()
    assert mc.parent["status"]["state"] == "pending"
    assert mc.parent["status"]["message"] == (
        "decode 0/1 ready; prefill 0/1 ready; server 0/1 ready; waiting on 3 of 3 services; NATS broker 0/1 ready"
    )
    assert conditions(mc.parent["status"])["Ready"]["reason"] == "ServicesNotReady"

    mc.mark_ready(lambda kind, name: 0 if name == "qwen-pd-decode" else None)
    mc.converge()
    assert mc.parent["status"]["message"] == "decode 0/1 ready; waiting on 1 of 3 services"
    assert mc.parent["status"]["readyServices"] == "2/3"

    mc.mark_ready()
    mc.converge()
    status = mc.parent["status"]
    assert (status["state"], status["message"], status["readyServices"]) == ("ready", "all 3 services ready", "3/3")
    assert conditions(status)["Ready"]["status"] == "True"
    assert conditions(status)["SpecValid"] == {
        **conditions(status)["SpecValid"],
        "status": "True",
        "reason": "Valid",
        "message": "spec is valid and rendered",
        "observedGeneration": 1,
    }
    assert all(isinstance(s["readyReplicas"], int) for s in status["services"].values())


def test_never_created_replicas_are_not_ready_and_zero_blocks_nothing(hooks) -> None:
    mc = Metacontroller(hooks, PD)
    mc.edit(lambda spec: spec["services"]["decode"].update(replicas=0))
    mc.converge()
    # prefill asks for 1 and reports 0: never created (no free GPU) is not ready.
    mc.mark_ready(lambda kind, name: 0 if name == "qwen-pd-prefill" else None)
    mc.converge()
    assert mc.parent["status"]["message"] == "prefill 0/1 ready; waiting on 1 of 3 services"
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.parent["status"]["services"]["decode"] == {"kind": "Deployment", "replicas": 0, "readyReplicas": 0}


def test_transition_time_carried_over_unless_status_changes(hooks) -> None:
    obj = parent(PD)
    obj["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "ServicesNotReady",
                "message": "old",
                "observedGeneration": 1,
                "lastTransitionTime": LONG_AGO,
            },
            {
                "type": "SpecValid",
                "status": "True",
                "reason": "Valid",
                "message": "old",
                "observedGeneration": 1,
                "lastTransitionTime": LONG_AGO,
            },
        ]
    }
    mc = Metacontroller(hooks, obj)
    mc.converge()
    assert conditions(mc.parent["status"])["Ready"]["lastTransitionTime"] == LONG_AGO
    assert conditions(mc.parent["status"])["SpecValid"]["lastTransitionTime"] == LONG_AGO
    mc.mark_ready()
    mc.converge()
    ready = conditions(mc.parent["status"])["Ready"]
    assert ready["status"] == "True" and ready["lastTransitionTime"] != LONG_AGO
    assert conditions(mc.parent["status"])["SpecValid"]["lastTransitionTime"] == LONG_AGO


def test_resync_of_unchanged_world_gives_byte_identical_status(hooks) -> None:
    mc = Metacontroller(hooks, PD)
    mc.mark_ready()
    mc.converge()
    mc.mark_ready()
    mc.converge()
    # The same world an hour apart: a clock read leaking into status would show.
    noon = datetime(2026, 6, 1, 12, tzinfo=UTC)
    first = reconcile.sync_answer(parse_request(mc.body()), lambda: noon).json()
    assert reconcile.sync_answer(parse_request(mc.body()), lambda: noon + timedelta(hours=1)).json() == first
    assert hooks.post("/sync", mc.body()).body == first
    assert mc.sync() == []


def ready_graph(hooks) -> Metacontroller:
    mc = Metacontroller(hooks, PD)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    return mc


def test_failed_spec_status_and_recovery_conditions(hooks) -> None:
    mc = ready_graph(hooks)
    mc.edit(lambda spec: spec["services"]["server"].update(role="decode"))
    mc.converge()
    status = mc.parent["status"]
    assert status["state"] == "failed"
    assert status["message"] == (
        "invalid spec: spec.services.server: role applies to workers only: remove role from a server (or set it to mixed)"
    )
    assert conditions(status)["SpecValid"]["status"] == "False"
    assert conditions(status)["Ready"]["status"] == "Unknown"
    assert conditions(status)["Ready"]["observedGeneration"] == 2
    mc.edit(lambda spec: spec["services"]["server"].pop("role"))
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert conditions(mc.parent["status"])["SpecValid"]["observedGeneration"] == 3


def test_rollout_in_progress_is_not_ready(hooks) -> None:
    mc = ready_graph(hooks)
    mc.edit(lambda spec: spec["services"]["decode"].update(image="example.com/engine:v2"))
    mc.converge()
    # The Deployment's controller has not caught up with the new template yet.
    assert mc.parent["status"]["state"] == "pending"
    assert mc.parent["status"]["message"] == "decode 0/1 ready; waiting on 1 of 3 services"
    assert mc.parent["status"]["services"]["decode"]["readyReplicas"] == 1  # as the Deployment reports it
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"


def test_spec_error_keeps_the_registration_condition_as_it_was(hooks) -> None:
    obj = parent(PD)
    mc = Metacontroller(hooks, obj)
    mc.converge()
    before = conditions(mc.parent["status"])["ChildKindsRegistered"]
    mc.edit(lambda spec: spec.update(backendFramework="tensorrt"))
    mc.converge()
    assert conditions(mc.parent["status"])["ChildKindsRegistered"] == before
    mc.edit(lambda spec: spec.update(backendFramework="sglang"))
    mc.converge()
    assert conditions(mc.parent["status"])["ChildKindsRegistered"]["lastTransitionTime"] == before["lastTransitionTime"]


def test_service_replicas_are_what_the_workload_has_now(hooks) -> None:
    """The router's scaling API reads status.services.*.replicas as the current count."""
    mc = Metacontroller(hooks, PD)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(replicas=3))
    mc.converge()  # the Deployment is asked for 3 but still reports what it had
    assert mc.parent["status"]["services"]["decode"] == {"kind": "Deployment", "replicas": 1, "readyReplicas": 1}
    # (and its controller has not observed the change yet, so none counts as ready)
    assert mc.parent["status"]["message"] == "decode 0/3 ready; waiting on 1 of 3 services"
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["services"]["decode"] == {"kind": "Deployment", "replicas": 3, "readyReplicas": 3}


def test_the_sync_that_starts_a_rollout_does_not_call_the_new_generation_ready(hooks) -> None:
    """Its status is the first with the new observedGeneration, but the workloads it reads still
    report the pods of the old template (the real control plane showed `kubectl wait` passing
    on it)."""
    mc = ready_graph(hooks)
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.2"))
    mc.sync()
    assert mc.parent["status"]["state"] == "pending"
    assert mc.parent["status"]["message"] == (
        "decode 0/1 ready; prefill 0/1 ready; server 0/1 ready; waiting on 3 of 3 services"
    )
    assert conditions(mc.parent["status"])["Ready"]["status"] == "False"


def test_a_switch_of_workload_kind_is_not_ready_on_the_old_kind(hooks) -> None:
    mixed = parent(REPO / "examples" / "single-node-mixed.yaml")
    (multinode,) = load_yaml(REPO / "examples" / "multinode-tp.yaml")
    mc = Metacontroller(hooks, mixed, controller("lws"))
    mc.converge()
    mc.mark_ready()
    mc.converge()
    mc.edit(lambda spec: (spec.clear(), spec.update(multinode["spec"])))
    assert ("create", "LeaderWorkerSet", "qwen-mixed-worker") in mc.sync()
    assert mc.parent["status"]["state"] == "pending"
    assert mc.parent["status"]["services"]["worker"]["kind"] == "Deployment"  # what still runs


def test_a_replica_change_alone_keeps_a_ready_graph_ready(hooks) -> None:
    mc = ready_graph(hooks)
    mc.edit(lambda spec: spec["services"]["decode"].update(replicas=2))
    assert mc.child_writes(mc.sync()) == [("update", "Deployment", "qwen-pd-decode")]
    # The second decode pod is counted against the new count once its controller reports it.
    assert mc.parent["status"]["message"] == "decode 1/2 ready; waiting on 1 of 3 services"
