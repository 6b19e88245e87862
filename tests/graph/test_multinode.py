"""Multi-node worker pools on LeaderWorkerSet, and the opt-in registration of optional kinds."""

from typing import Any

import pytest

from tests.support.argv import entry_point, flags
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import need_schemas
from tests.support.requests import PD, controller, request_body
from tests.support.simulator import Metacontroller

WITH_LWS = controller("lws")
# The flags a multi-node SGLang group meets by, which the hook adds when the user has not.
RENDEZVOUS = {"--nnodes", "--node-rank", "--dist-init-addr"}


def multinode_pd(nodes: int = 2, **decode: Any) -> GraphBuilder:
    """Single-node prefill, a decode pool spanning `nodes` nodes per group."""
    return graph().service("decode", numberOfNodes=nodes, **decode)


def sync_lws(hooks, obj: dict[str, Any]) -> dict[str, Any]:
    need_schemas()  # LeaderWorkerSets are validated against the upstream CRD
    return hooks.hook("/sync", request_body(obj, composite=WITH_LWS))


def lws_of(answer: dict[str, Any], name: str = "qwen-pd-decode") -> dict[str, Any]:
    (lws,) = [c for c in answer["children"] if c["kind"] == "LeaderWorkerSet" and c["metadata"]["name"] == name]
    return lws


def test_two_pool_graph_with_one_multinode_pool(hooks) -> None:
    answer = sync_lws(hooks, multinode_pd(replicas=2).obj())
    kinds = sorted(
        (c["kind"], c["metadata"]["name"])
        for c in answer["children"]
        if c["metadata"]["labels"]["infera.amd.com/service"] != "disc"
    )
    assert kinds == [
        ("Deployment", "qwen-pd-prefill"),
        ("Deployment", "qwen-pd-server"),
        ("LeaderWorkerSet", "qwen-pd-decode"),
        ("NetworkPolicy", "qwen-pd-nats"),
        # Every rank of the pool, so a node drain takes at most one group down at a time.
        ("PodDisruptionBudget", "qwen-pd-decode"),
        ("PodDisruptionBudget", "qwen-pd-prefill"),
        ("Service", "qwen-pd-nats"),
        ("Service", "qwen-pd-server"),
        ("StatefulSet", "qwen-pd-nats"),
    ]
    spec = lws_of(answer)["spec"]
    assert spec["replicas"] == 2
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
    }
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    # Nothing exists yet: no replica is there, whatever the spec asks.
    assert answer["status"]["services"]["decode"] == {"kind": "LeaderWorkerSet", "replicas": 0, "readyReplicas": 0}


def test_leader_keeps_readiness_and_workers_carry_none(hooks) -> None:
    template = lws_of(sync_lws(hooks, multinode_pd().obj()))["spec"]["leaderWorkerTemplate"]
    (leader,) = template["leaderTemplate"]["spec"]["containers"]
    (worker,) = template["workerTemplate"]["spec"]["containers"]
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    assert [leader[probe]["httpGet"]["path"] for probe in probes] == ["/health"] * 3
    assert not set(probes) & set(worker)  # the other ranks restart with their group
    # Apart from the probes, every rank is the same pod: GPU, memory, shm, env, identity, account.
    assert {k: v for k, v in leader.items() if k not in probes} == worker
    leader_pod = {k: v for k, v in template["leaderTemplate"]["spec"].items() if k != "containers"}
    worker_pod = {k: v for k, v in template["workerTemplate"]["spec"].items() if k != "containers"}
    assert leader_pod == worker_pod
    assert leader_pod["serviceAccountName"] == "qwen-pd-register"
    assert leader_pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}},
        {"name": "boot-config", "hostPath": {"path": "/boot", "type": "Directory"}},
    ]
    assert template["leaderTemplate"]["metadata"] == template["workerTemplate"]["metadata"]
    assert template["leaderTemplate"]["metadata"]["labels"]["infera.amd.com/service"] == "decode"
    assert worker["resources"]["limits"] == {"amd.com/gpu": "1"}
    assert worker["command"][worker["command"].index("--disaggregation-mode") + 1] == "decode"


def test_skip_readiness_probe_applies_to_the_leader(hooks) -> None:
    template = lws_of(sync_lws(hooks, multinode_pd(skipReadinessProbe=True).obj()))["spec"]["leaderWorkerTemplate"]
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(
        template["leaderTemplate"]["spec"]["containers"][0]
    )


def test_sglang_rendezvous_is_injected(hooks) -> None:
    template = lws_of(sync_lws(hooks, multinode_pd(nodes=4).obj()))["spec"]["leaderWorkerTemplate"]
    for rank in ("leaderTemplate", "workerTemplate"):
        command = template[rank]["spec"]["containers"][0]["command"]
        assert command[-6:] == [
            "--nnodes",
            "4",
            "--node-rank",
            "$(LWS_WORKER_INDEX)",
            "--dist-init-addr",
            "$(LWS_LEADER_ADDRESS):5000",
        ]


@pytest.mark.parametrize(
    ("user_args", "injected"),
    [
        (["--nnodes", "4"], ["--node-rank", "$(LWS_WORKER_INDEX)", "--dist-init-addr", "$(LWS_LEADER_ADDRESS):5000"]),
        (["--dist-init-addr=$(LWS_LEADER_ADDRESS):6000"], ["--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)"]),
        (["--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--dist-init-addr", "leader:1"], []),
    ],
)
def test_rendezvous_flags_the_user_sets_are_left_to_them(hooks, user_args: list[str], injected: list[str]) -> None:
    obj = (
        multinode_pd()
        .args("decode", "--model-path", "m", "--disaggregation-transfer-backend", "mori", *user_args)
        .obj()
    )
    (main,) = lws_of(sync_lws(hooks, obj))["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"]
    options = entry_point(main["command"])[1]
    assert {flag: options[flag] for flag in RENDEZVOUS if flag in options} == flags(injected)
    assert main["args"][4:] == user_args


def test_vllm_gets_no_rendezvous_flags(hooks) -> None:
    obj = multinode_pd().vllm().obj()
    (main,) = lws_of(sync_lws(hooks, obj))["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
    module, options = entry_point(main["command"])
    assert module == "infera.engine.vllm"
    assert not RENDEZVOUS & set(options)


def test_readiness_rolls_up_from_lws_groups(hooks) -> None:
    mc = Metacontroller(hooks, multinode_pd(replicas=2).obj(), composite=WITH_LWS)
    mc.converge()
    mc.mark_ready(lambda kind, name: 1 if kind == "LeaderWorkerSet" else None)
    mc.converge()
    assert mc.parent["status"]["services"]["decode"] == {"kind": "LeaderWorkerSet", "replicas": 2, "readyReplicas": 1}
    assert mc.parent["status"]["message"] == "decode 1/2 ready; waiting on 1 of 3 services"
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.sync() == []


def test_switching_between_deployment_and_lws_replaces_the_workload(hooks) -> None:
    mc = Metacontroller(hooks, PD, composite=WITH_LWS)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(numberOfNodes=2))
    assert sorted(mc.child_writes(mc.sync())) == [
        ("create", "LeaderWorkerSet", "qwen-pd-decode"),
        ("delete", "Deployment", "qwen-pd-decode"),  # never left running on GPUs
    ]
    # Status describes what was observed: the Deployment still served during that sync.
    assert mc.parent["status"]["services"]["decode"]["kind"] == "Deployment"
    mc.converge()
    assert mc.parent["status"]["services"]["decode"]["kind"] == "LeaderWorkerSet"
    mc.edit(lambda spec: spec["services"]["decode"].update(numberOfNodes=1))
    assert sorted(mc.child_writes(mc.sync())) == [
        ("create", "Deployment", "qwen-pd-decode"),
        ("delete", "LeaderWorkerSet", "qwen-pd-decode"),
    ]
    mc.converge()
    assert mc.sync() == []


def test_unregistered_kind_keeps_that_service_and_renders_the_rest(hooks) -> None:
    mc = Metacontroller(hooks, PD)  # the base bundle: no LeaderWorkerSet registered
    mc.converge()
    mc.mark_ready()
    mc.converge()
    decode_before = mc.children[("Deployment", "qwen-pd-decode")]
    mc.edit(
        lambda spec: (
            spec["services"]["decode"].update(numberOfNodes=2),
            spec["services"]["prefill"].update(replicas=2),
        )
    )
    writes = mc.child_writes(mc.sync())
    # prefill is still reconciled; decode keeps its running Deployment and gets no LWS.
    assert writes == [("update", "Deployment", "qwen-pd-prefill")]
    assert mc.children[("Deployment", "qwen-pd-decode")] == decode_before
    status = mc.parent["status"]
    assert status["state"] == "failed"
    message = (
        "LeaderWorkerSet qwen-pd-decode cannot be created: this CompositeController does not register "
        "LeaderWorkerSet (leaderworkerset.x-k8s.io/v1); enable the kustomize component metacontroller/components/lws"
    )
    assert status["message"].startswith(message)
    (condition,) = [c for c in status["conditions"] if c["type"] == "ChildKindsRegistered"]
    assert (condition["status"], condition["reason"], condition["message"]) == ("False", "KindNotRegistered", message)
    mc.converge()  # the prefill update changes its reported replicas once
    assert mc.children[("Deployment", "qwen-pd-decode")] == decode_before
    assert mc.sync() == []
    # Enabling the component (the controller now registers LWS) converges the switch.
    mc.composite = WITH_LWS
    mc.registered |= {("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1")}
    mc.converge()
    assert ("LeaderWorkerSet", "qwen-pd-decode") in mc.children and ("Deployment", "qwen-pd-decode") not in mc.children


def test_multinode_server_is_rejected(hooks) -> None:
    obj = graph().nodes(server=2).obj()
    status = hooks.sync(obj)["status"]
    assert status["state"] == "failed"
    assert "numberOfNodes applies to workers only" in status["message"]


def test_changing_the_group_size_replaces_the_lws(hooks) -> None:
    """The simulator fails any in-place size change, as older LeaderWorkerSet webhooks do."""
    mc = Metacontroller(hooks, multinode_pd(nodes=2).obj(), composite=WITH_LWS)
    mc.converge()
    mc.mark_ready()
    mc.converge()
    mc.edit(lambda spec: spec["services"]["decode"].update(numberOfNodes=4))
    assert mc.child_writes(mc.sync()) == [("delete", "LeaderWorkerSet", "qwen-pd-decode")]
    assert (
        "LeaderWorkerSet qwen-pd-decode is being replaced: numberOfNodes changed from 2 to 4"
        in mc.parent["status"]["message"]
    )
    assert mc.child_writes(mc.sync()) == [("create", "LeaderWorkerSet", "qwen-pd-decode")]
    assert mc.children[("LeaderWorkerSet", "qwen-pd-decode")]["spec"]["leaderWorkerTemplate"]["size"] == 4
    mc.converge()
    assert mc.parent["status"]["state"] == "pending"
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready" and mc.sync() == []
