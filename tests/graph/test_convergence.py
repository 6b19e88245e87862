"""Zero churn, proven with the simulator for every example users start from."""

from pathlib import Path

import pytest

from tests.support.prerequisites import REPO
from tests.support.requests import PD
from tests.support.simulator import Metacontroller

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
IDS = [path.name for path in EXAMPLES]


def workload_kind(service: dict) -> str:
    return "LeaderWorkerSet" if service.get("numberOfNodes", 1) > 1 else "Deployment"


def converged(hooks, path: Path) -> Metacontroller:
    return Metacontroller(hooks, path).serve()


def serving_generation(mc: Metacontroller) -> str | None:
    """Under BlueGreen, the generation that serves, whose name each of its workloads carries."""
    return (mc.parent["status"].get("rollout") or {}).get("servingGeneration")


def workload_name(mc: Metacontroller, service: str) -> str:
    name = f"{mc.parent['metadata']['name']}-{service}"
    generation = serving_generation(mc)
    return f"{name}-{generation}" if generation else name


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_first_sync_creates_everything_then_quiet(hooks, path: Path) -> None:
    mc = Metacontroller(hooks, path)
    writes = mc.sync()
    name = mc.parent["metadata"]["name"]
    # Metacontroller's finalizer on the parent first, then every child once, then the status.
    assert writes[0] == ("finalizer", "InferaDeployment", name) and writes[-1] == ("status", "InferaDeployment", name)
    assert sorted(writes[1:-1]) == sorted(("create", *key) for key in mc.children)
    assert mc.sync() == [("status", "InferaDeployment", mc.parent["metadata"]["name"])]  # initializing -> pending
    assert mc.sync() == []


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_second_sync_of_unchanged_world_writes_nothing(hooks, path: Path) -> None:
    mc = converged(hooks, path)
    assert mc.sync() == []
    assert mc.sync() == []


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_scaling_one_pool_writes_exactly_that_child(hooks, path: Path) -> None:
    mc = converged(hooks, path)
    worker = next(
        name
        for name, svc in sorted(mc.parent["spec"]["services"].items())
        if svc["componentType"] == "worker" and "autoscaling" not in svc  # an autoscaler owns that count
    )
    mc.edit(lambda spec: spec["services"][worker].update(replicas=spec["services"][worker].get("replicas", 1) + 2))
    kind = workload_kind(mc.parent["spec"]["services"][worker])
    name = workload_name(mc, worker)
    writes = mc.sync()
    assert mc.child_writes(writes) == [("update", kind, name)]
    assert mc.children[(kind, name)]["spec"]["replicas"] == mc.parent["spec"]["services"][worker]["replicas"]


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_removing_a_service_prunes_exactly_its_objects(hooks, path: Path) -> None:
    mc = converged(hooks, path)
    idep = mc.parent["metadata"]["name"]
    services = dict(mc.parent["spec"]["services"])
    blue_green = serving_generation(mc) is not None
    # Remove the server when there is one (it owns a Service too), else one of several workers.
    # Under BlueGreen a worker: the server is the front door a rollout moves.
    victim = "server" if "server" in services and not blue_green else sorted(services)[0]
    expected = [] if blue_green else [("delete", workload_kind(services[victim]), f"{idep}-{victim}")]
    if services[victim]["componentType"] == "server":
        expected.append(("delete", "Service", f"{idep}-{victim}"))
    # A worker pool has a disruption budget; a server, when it keeps more than one replica.
    if services[victim]["componentType"] == "worker" or services[victim].get("replicas", 1) > 1:
        expected.append(("delete", "PodDisruptionBudget", f"{idep}-{victim}"))
    if "monitoring" in mc.parent["spec"]:
        # Its scrape no longer names the service's role.
        expected.append(("update", "PodMonitor", f"{idep}-metrics"))
    if mc.parent["spec"].get("networkPolicy", {}).get("isolate") == "graph":
        expected.append(("delete", "NetworkPolicy", f"{idep}-{victim}"))
        # The last server gone, the workers no longer admit servers.
        servers = [s for s in services if services[s]["componentType"] == "server"]
        if servers == [victim]:
            expected += [("update", "NetworkPolicy", f"{idep}-{s}") for s in services if s != victim]
    mc.edit(lambda spec: spec["services"].pop(victim))
    writes = mc.child_writes(mc.sync())
    if blue_green:
        # A change to what runs: the other services start as a generation of their own beside
        # the serving one, which (the victim's workload with it) goes once the new one serves.
        new = mc.parent["status"]["rollout"]["incomingGeneration"]
        expected += [("create", workload_kind(svc), f"{idep}-{s}-{new}") for s, svc in services.items() if s != victim]
    assert sorted(writes) == sorted(expected)
    if blue_green:
        mc.serve()
        assert not [name for _, name in mc.children if name.startswith(f"{idep}-{victim}")]
    assert mc.sync() == []


@pytest.mark.parametrize("path", EXAMPLES, ids=IDS)
def test_fixing_a_failed_spec_converges_back(hooks, path: Path) -> None:
    mc = converged(hooks, path)
    before = {key: child["metadata"]["resourceVersion"] for key, child in mc.children.items()}
    original = mc.parent["spec"]["backendFramework"] if "backendFramework" in mc.parent["spec"] else None
    mc.edit(lambda spec: spec.update(backendFramework="tensorrt"))
    writes = mc.sync()
    assert writes == [("status", "InferaDeployment", mc.parent["metadata"]["name"])]
    assert mc.parent["status"]["state"] == "failed"
    assert mc.sync() == []  # a failed spec is steady too
    mc.edit(lambda spec: spec.update(backendFramework=original) if original else spec.pop("backendFramework"))
    writes = mc.sync()
    assert mc.child_writes(writes) == []
    assert mc.parent["status"]["state"] == "ready"
    assert {key: child["metadata"]["resourceVersion"] for key, child in mc.children.items()} == before
    assert mc.sync() == []


def test_switching_to_etcd_discovery_releases_the_identity_cleanly(hooks) -> None:
    mc = converged(hooks, PD)
    mc.edit(lambda spec: spec.update(discoveryBackend="etcd", etcdEndpoint="etcd:2379"))
    writes = mc.child_writes(mc.sync())
    assert sorted(w for w in writes if w[0] == "delete") == [
        ("delete", kind, f"qwen-pd-{account}")
        for kind in ("Role", "RoleBinding", "ServiceAccount")
        for account in ("disc", "register")
    ]
    assert sorted(w for w in writes if w[0] == "update") == [
        ("update", "Deployment", f"qwen-pd-{name}") for name in ("decode", "prefill", "server")
    ]
    # What the API server stores must not point pods at the deleted account (the deprecated
    # serviceAccount alias survives a merge that merely drops serviceAccountName).
    for (kind, _), child in mc.children.items():
        if kind == "Deployment":
            pod = child["spec"]["template"]["spec"]
            assert pod["serviceAccountName"] == pod["serviceAccount"] == "default"
    # The status of the sync that starts the rollout is about the new generation: not ready yet.
    assert mc.parent["status"]["state"] == "pending"
    mc.converge()
    assert mc.parent["status"]["state"] == "pending"  # pods roll out with the new command
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["state"] == "ready"
    assert mc.sync() == []


def test_storage_size_change_keeps_the_claim_template_and_says_so(hooks) -> None:
    mc = converged(hooks, PD)
    mc.edit(lambda spec: spec.update(nats={"deploy": True, "storageSize": "20Gi"}))
    assert mc.child_writes(mc.sync()) == []
    claim = mc.children[("StatefulSet", "qwen-pd-nats")]["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "4Gi"
    assert (
        "nats.storageSize/storageClassName change not applied to StatefulSet qwen-pd-nats"
        in mc.parent["status"]["message"]
    )
    assert mc.sync() == []


def test_non_canonical_quantities_do_not_churn(hooks) -> None:
    mc = Metacontroller(hooks, PD)
    mc.edit(
        lambda spec: spec["services"]["decode"]["resources"].update(cpu="16000m", memory="1024Gi", sharedMemory="0.5Ti")
    )
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.sync() == []
