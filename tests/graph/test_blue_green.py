"""BlueGreen rollouts through the simulator, step by step: the writes each sync makes, and after
every step the invariant: no router or picker sees workers of two generations, and once the
graph has served, the generation behind the front door has every pool ready."""

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooks.contract import LAST_APPLIED_ANNOTATION
from hooks.vocabulary import COMPONENT_LABEL, GENERATION_LABEL
from tests.support.graphs import graph
from tests.support.prerequisites import REPO
from tests.support.requests import PD, controller, controller_for, load_yaml
from tests.support.simulator import Metacontroller
from tests.support.specs import idep, valid_specs

GAIE_PD = REPO / "examples" / "gaie-pd.yaml"
MODEL_CACHE = REPO / "examples" / "pd-model-cache.yaml"
AUTOSCALED = REPO / "examples" / "pd-autoscaling.yaml"
SELECTOR_FLAG = "--k8s-label-selector"
SELECTOR_ENV = "INFERA_K8S_LABEL_SELECTOR"
WORKLOADS = ("Deployment", "LeaderWorkerSet")


def blue_green(path: Any) -> dict[str, Any]:
    """The graph of `path` (an example, or a parent) under BlueGreen."""
    return graph(source=path).blue_green().obj()


def templates(child: dict[str, Any]) -> list[dict[str, Any]]:
    spec = child.get("spec") or {}
    if child["kind"] == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        return [group[key] for key in ("leaderTemplate", "workerTemplate") if key in group]
    return [spec["template"]]


def selector_of(container: dict[str, Any]) -> str | None:
    """The label selector a router container watches workers with: its flag, else its env."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    for index, arg in enumerate(argv):
        if arg == SELECTOR_FLAG:
            return argv[index + 1]
        if arg.startswith(f"{SELECTOR_FLAG}="):
            return arg.split("=", 1)[1]
    return next((var["value"] for var in container.get("env") or [] if var["name"] == SELECTOR_ENV), None)


def matches(selector: str, labels: dict[str, str]) -> bool:
    terms = [term.split("=", 1) for term in selector.split(",")]
    return all(labels.get(key) == value for key, value in terms)


def pod_templates(mc: Metacontroller) -> list[dict[str, Any]]:
    return [t for (kind, _), child in sorted(mc.children.items()) if kind in WORKLOADS for t in templates(child)]


def assert_generations_apart(mc: Metacontroller, handover: bool = False) -> None:
    """Every router (server, frontend sidecar, Endpoint Picker) sees workers of its own
    generation only. In a `handover` between RollingUpdate and BlueGreen the unlabelled
    generation's routers see every worker: then what those workers run must be the same."""
    pods = pod_templates(mc)
    workers = [t["metadata"]["labels"] for t in pods if t["metadata"]["labels"].get(COMPONENT_LABEL) == "worker"]
    for template in pods:
        own = template["metadata"]["labels"].get(GENERATION_LABEL, "")
        for container in template["spec"]["containers"]:
            selector = selector_of(container)
            if selector is None:
                continue
            seen = {labels.get(GENERATION_LABEL, "") for labels in workers if matches(selector, labels)}
            if handover and own == "":
                runs: dict[str, set[str]] = {}
                for t in pods:
                    if t["metadata"]["labels"].get(COMPONENT_LABEL) == "worker":
                        service = t["metadata"]["labels"]["infera.amd.com/service"]
                        primary = t["spec"]["containers"][0]
                        run = [primary.get("image"), primary.get("command"), primary.get("args")]
                        runs.setdefault(service, set()).add(json.dumps(run))
                assert all(len(run) == 1 for run in runs.values()), runs
                continue
            assert seen <= {own}, f"{container['name']} of generation {own!r} sees workers of {seen}"


def front_door_generations(mc: Metacontroller) -> set[str]:
    """The generations the servers' Services select, and the one the HTTPRoute's pool is of."""
    doors = set()
    for (kind, _), child in mc.children.items():
        labels = child["metadata"].get("labels") or {}
        if kind == "Service" and labels.get("infera.amd.com/service") in servers(mc):
            doors.add(child["spec"]["selector"].get(GENERATION_LABEL, ""))
        if kind == "HTTPRoute":
            pool = mc.children[("InferencePool", child["spec"]["rules"][0]["backendRefs"][0]["name"])]
            doors.add(pool["metadata"]["labels"].get(GENERATION_LABEL, ""))
    return doors


def servers(mc: Metacontroller) -> set[str]:
    return {name for name, svc in mc.parent["spec"]["services"].items() if svc["componentType"] == "server"}


def ready_behind_the_door(mc: Metacontroller) -> dict[str, int]:
    """Ready replicas per service of the generation the front door selects."""
    (generation,) = front_door_generations(mc)
    ready = {}
    for (kind, name), child in mc.children.items():
        labels = child["metadata"]["labels"]
        if kind in WORKLOADS and labels.get(GENERATION_LABEL, "") == generation and not name.endswith("-nats"):
            status = child.get("status") or {}
            ready[labels["infera.amd.com/service"]] = min(
                status.get("readyReplicas", 0), status.get("updatedReplicas", 0)
            )
    return ready


def checked_sync(mc: Metacontroller, handover: bool = False) -> list[tuple[str, str, str]]:
    """One sync; then the invariant: generations apart, and no service behind the front door
    has fewer ready replicas than before (nor than its desired count, if that is fewer)."""
    before = ready_behind_the_door(mc) if front_door_generations(mc) else {}
    writes = mc.child_writes(mc.sync())
    assert_generations_apart(mc, handover)
    after = ready_behind_the_door(mc)
    for service, ready in before.items():
        wanted = mc.parent["spec"]["services"].get(service, {}).get("replicas", 1)
        assert after.get(service, 0) >= min(ready, wanted), f"{service}: {ready} ready before, {after} after"
    return writes


def serving(mc: Metacontroller) -> Metacontroller:
    """Converged with every pool ready: the graph serves one generation."""
    mc.serve()
    assert mc.parent["status"].get("rollout", {"phase": "Stable"})["phase"] == "Stable"
    return mc


def generation_names(mc: Metacontroller, generation: str) -> list[tuple[str, str]]:
    return sorted(
        (kind, name)
        for (kind, name), child in mc.children.items()
        if (child["metadata"].get("labels") or {}).get(GENERATION_LABEL) == generation
    )


def only_ready(mc: Metacontroller, generation: str) -> Callable[[str, str], int | None]:
    """Workloads of `generation` report none ready; the others all."""
    return lambda kind, name: 0 if name.endswith(f"-{generation}") else None


def new_image(spec: dict[str, Any]) -> None:
    spec["image"] = "rocm/infera:sglang-v0.1.2"


def test_image_change_starts_a_generation_beside_the_serving_one_then_moves_the_door(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    old_children = generation_names(mc, old)
    assert [name for _, name in old_children] == [f"qwen-pd-{s}-{old}" for s in ("decode", "prefill", "server")]
    kept = {key: json.dumps(mc.children[key], sort_keys=True) for key in mc.children}

    mc.edit(new_image)
    writes = checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert new != old
    assert writes == [("create", "Deployment", f"qwen-pd-{s}-{new}") for s in ("decode", "prefill", "server")]
    assert mc.parent["status"]["rollout"]["phase"] == "Progressing"

    # The new pools come up one by one: nothing of the serving generation is touched meanwhile.
    mc.mark_ready(lambda kind, name: 0 if name == f"qwen-pd-decode-{new}" else None)
    assert checked_sync(mc) == []
    assert mc.parent["status"]["rollout"]["pools"]["decode"] == {"replicas": 1, "readyReplicas": 0}
    assert mc.parent["status"]["state"] == "ready"  # the old generation still serves
    assert all(json.dumps(mc.children[key], sort_keys=True) == kept[key] for key in old_children)

    mc.mark_ready()
    assert checked_sync(mc) == [("update", "Service", "qwen-pd-server")]
    assert mc.children[("Service", "qwen-pd-server")]["spec"]["selector"][GENERATION_LABEL] == new
    assert mc.parent["status"]["rollout"]["phase"] == "Switching"
    assert checked_sync(mc) == [("delete", *key) for key in old_children]
    assert mc.parent["status"]["rollout"]["phase"] == "Draining"
    assert checked_sync(mc) == []
    assert mc.parent["status"]["rollout"] == {
        "strategy": "BlueGreen",
        "phase": "Stable",
        "servingGeneration": new,
        "message": f"generation {new} serves",
    }
    progressing = next(c for c in mc.parent["status"]["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "RolloutComplete")
    assert mc.sync() == []


def test_reverting_mid_rollout_removes_the_new_generation_and_never_writes_the_old(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    before = copy.deepcopy(mc.children)
    image = mc.parent["spec"]["image"]
    mc.edit(new_image)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.mark_ready(only_ready(mc, new))
    mc.edit(lambda spec: spec.update(image=image))
    assert checked_sync(mc) == [("delete", "Deployment", f"qwen-pd-{s}-{new}") for s in ("decode", "prefill", "server")]
    assert mc.parent["status"]["rollout"]["servingGeneration"] == old
    assert checked_sync(mc) == []
    assert {key: child for key, child in mc.children.items()} == before


def test_a_second_change_mid_rollout_replaces_the_incoming_generation_never_the_serving_one(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    mc.edit(new_image)
    checked_sync(mc)
    first = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.edit(lambda spec: spec.update(image="rocm/infera:sglang-v0.1.3"))
    writes = checked_sync(mc)
    second = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert sorted(writes) == sorted(
        [("create", "Deployment", f"qwen-pd-{s}-{second}") for s in ("decode", "prefill", "server")]
        + [("delete", "Deployment", f"qwen-pd-{s}-{first}") for s in ("decode", "prefill", "server")]
    )
    assert mc.parent["status"]["rollout"]["servingGeneration"] == old


@pytest.mark.parametrize(
    ("path", "change", "updated", "created"),
    [
        (PD, lambda spec: spec["services"]["decode"].update(replicas=3), "qwen-pd-decode", []),
        (PD, lambda spec: spec["services"]["decode"].update(podLabels={"team": "infer"}), "qwen-pd-decode", []),
        # Several routers or pickers are spread across nodes, and a drain keeps one of them.
        (
            PD,
            lambda spec: spec["services"]["server"].update(replicas=2),
            "qwen-pd-server",
            [("PodDisruptionBudget", "qwen-pd-server")],
        ),
        (
            GAIE_PD,
            lambda spec: spec["gaie"].update(eppReplicas=2),
            "qwen-gaie-epp",
            [("PodDisruptionBudget", "qwen-gaie-epp-{generation}")],
        ),
    ],
    ids=["replicas", "pod labels", "routers", "pickers"],
)
def test_scaling_and_relabelling_change_the_serving_generation_in_place(hooks, path, change, updated, created) -> None:
    mc = serving(Metacontroller(hooks, blue_green(path), composite=controller_for(load_yaml(path)[0])))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    mc.edit(change)
    writes = checked_sync(mc)
    assert sorted(writes) == sorted(
        [("update", "Deployment", f"{updated}-{old}")]
        + [("create", kind, name.format(generation=old)) for kind, name in created]
    )
    assert mc.parent["status"]["rollout"]["servingGeneration"] == old
    assert "incomingGeneration" not in mc.parent["status"]["rollout"]


def test_a_stalled_generation_says_so_and_the_old_one_keeps_serving(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    mc.edit(lambda spec: (new_image(spec), spec["rollout"].update(progressDeadlineSeconds=600)))
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    for key in generation_names(mc, new):
        mc.children[key]["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    mc.mark_ready(only_ready(mc, new))
    assert checked_sync(mc) == []
    status = mc.parent["status"]
    assert status["rollout"]["phase"] == "Stalled"
    assert status["state"] == "ready"
    assert status["rollout"]["message"].startswith(f"generation {new} is not ready 600s after it was created")
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")


def test_switching_a_running_graph_to_blue_green_hands_over_without_mixing_code(hooks) -> None:
    mc = serving(Metacontroller(hooks, load_yaml(PD)[0]))
    plain = sorted(key for key in mc.children if key[0] == "Deployment" and not key[1].endswith("nats"))
    mc.edit(lambda spec: spec.update(rollout={"strategy": "BlueGreen"}))
    writes = checked_sync(mc, handover=True)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert writes == [("create", "Deployment", f"qwen-pd-{s}-{new}") for s in ("decode", "prefill", "server")]
    assert mc.parent["status"]["rollout"]["servingGeneration"] == ""
    mc.mark_ready()
    assert checked_sync(mc, handover=True) == [("update", "Service", "qwen-pd-server")]
    assert checked_sync(mc, handover=True) == [("delete", *key) for key in plain]
    # And back: the plain names return the same way.
    mc.edit(lambda spec: spec.update(rollout={"strategy": "RollingUpdate"}))
    assert checked_sync(mc, handover=True) == [("create", *key) for key in plain]
    mc.mark_ready()
    assert checked_sync(mc, handover=True) == [("update", "Service", "qwen-pd-server")]
    assert checked_sync(mc, handover=True) == [
        ("delete", "Deployment", f"qwen-pd-{s}-{new}") for s in ("decode", "prefill", "server")
    ]
    assert mc.parent["status"]["rollout"]["phase"] == "Draining"
    assert checked_sync(mc) == []
    assert "rollout" not in mc.parent["status"]
    assert mc.sync() == []


@pytest.mark.parametrize("strategy", ["BlueGreen", "RollingUpdate"])
def test_a_strategy_switch_that_also_changes_what_runs_is_refused(hooks, strategy: str) -> None:
    start = load_yaml(PD)[0] if strategy == "BlueGreen" else blue_green(PD)
    mc = serving(Metacontroller(hooks, start))
    message = mc.refusal(lambda spec: (new_image(spec), spec.update(rollout={"strategy": strategy})))
    assert message.startswith("spec.rollout.strategy: the running pods (generation ")
    assert "change the strategy in a change of its own" in message


def test_gaie_graph_moves_the_route_to_the_new_generations_pool(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(GAIE_PD), composite=controller("gaie")))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    assert ("InferencePool", f"{mc.parent['metadata']['name']}-pool-{old}") in mc.children
    mc.edit(new_image)
    writes = checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    created = {name for verb, _, name in writes if verb == "create"}
    name = mc.parent["metadata"]["name"]
    assert {f"{name}-epp-{new}", f"{name}-pool-{new}"} <= created
    mc.mark_ready()
    mc.gateway_accepts()
    switch = checked_sync(mc)
    assert ("update", "HTTPRoute", f"{name}-route") in switch
    route = mc.children[("HTTPRoute", f"{name}-route")]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == f"{name}-pool-{new}"
    removed = checked_sync(mc)
    assert ("delete", "InferencePool", f"{name}-pool-{old}") in removed
    assert ("delete", "Deployment", f"{name}-epp-{old}") in removed


def test_autoscaled_pool_starts_at_the_autoscalers_count_and_the_autoscaler_follows_the_door(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(AUTOSCALED)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    name = mc.parent["metadata"]["name"]
    scaled = next(s for s, svc in mc.parent["spec"]["services"].items() if "autoscaling" in svc)
    kind = "Deployment"
    mc.autoscale(kind, f"{name}-{scaled}-{old}", 3)
    mc.mark_ready()
    checked_sync(mc)
    mc.edit(new_image)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert mc.children[(kind, f"{name}-{scaled}-{new}")]["spec"]["replicas"] == 3
    assert mc.children[("HorizontalPodAutoscaler", f"{name}-{scaled}")]["spec"]["scaleTargetRef"]["name"] == (
        f"{name}-{scaled}-{old}"
    )
    mc.mark_ready()
    checked_sync(mc)
    assert mc.children[("HorizontalPodAutoscaler", f"{name}-{scaled}")]["spec"]["scaleTargetRef"]["name"] == (
        f"{name}-{scaled}-{new}"
    )


def test_a_new_model_source_downloads_before_its_generation_starts_its_workers(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(MODEL_CACHE)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    old_jobs = sorted(key for key in mc.children if key[0] == "Job")
    mc.edit(lambda spec: spec["modelCache"].update(source="hf://Qwen/Qwen3-8B"))
    writes = checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert not [write for write in writes if write[0] == "delete"]  # the serving pools keep their budgets
    created = sorted((kind, name) for verb, kind, name in writes if verb == "create")
    workers = [s for s, svc in mc.parent["spec"]["services"].items() if svc["componentType"] == "worker"]
    assert not any(name.endswith(new) and any(f"-{w}-" in name for w in workers) for _, name in created)
    assert any(kind == "Job" for kind, _ in created)
    assert all(key in mc.children for key in old_jobs)  # the serving generation still mounts its source
    mc.mark_ready(only_ready(mc, new))  # the download completes
    writes = checked_sync(mc)
    assert sorted(write for write in writes if write[0] == "create") == sorted(
        ("create", "Deployment", f"{mc.parent['metadata']['name']}-{w}-{new}") for w in workers
    )
    assert mc.parent["status"]["rollout"]["servingGeneration"] == old


def test_patches_aim_at_every_generation_by_the_plain_name(hooks) -> None:
    doc = (
        graph()
        .blue_green()
        .patch(
            "Deployment",
            "qwen-pd-decode",
            {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"pool": "decode"}},
        )
        .obj()
    )
    mc = serving(Metacontroller(hooks, doc))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    assert mc.children[("Deployment", f"qwen-pd-decode-{old}")]["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "decode"
    }
    mc.edit(new_image)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    assert mc.children[("Deployment", f"qwen-pd-decode-{new}")]["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "decode"
    }


def test_a_restarted_hook_mid_rollout_answers_the_same(hooks) -> None:
    """State comes from what exists: a fresh hook (no memo) and a resync storm change nothing."""
    from hooks.app import create_app
    from tests.support.service import InProcessClient

    mc = serving(Metacontroller(hooks, blue_green(PD)))
    mc.edit(new_image)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.mark_ready(only_ready(mc, new))
    assert checked_sync(mc) == []
    mc.client = InProcessClient(create_app())
    for _ in range(3):
        assert mc.sync() == []


def test_the_generation_label_is_the_hooks_alone(hooks) -> None:
    doc = graph().blue_green().service("decode", podLabels={GENERATION_LABEL: "mine"}).obj()
    mc = serving(Metacontroller(hooks, doc))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    labels = mc.children[("Deployment", f"qwen-pd-decode-{old}")]["spec"]["template"]["metadata"]["labels"]
    assert labels[GENERATION_LABEL] == old


def test_last_applied_of_the_serving_generation_never_changes_during_a_rollout(hooks) -> None:
    mc = serving(Metacontroller(hooks, blue_green(PD)))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    records = {
        key: mc.children[key]["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] for key in generation_names(mc, old)
    }
    mc.edit(new_image)
    for _ in range(3):
        checked_sync(mc)
    assert {key: mc.children[key]["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] for key in records} == records


def _with_server(spec: dict[str, Any]) -> bool:
    return any(svc["componentType"] == "server" for svc in spec["services"].values())


CHANGES: list[Callable[[dict[str, Any]], None]] = [
    lambda spec: spec.update(image="engine:v9"),
    lambda spec: next(iter(spec["services"].values())).setdefault("args", []).append("--trust-remote-code"),
    lambda spec: next(iter(spec["services"].values())).update(replicas=2),
    lambda spec: spec.update(envs=[{"name": "ROLLOUT", "value": "2"}]),
]


@settings(max_examples=25)
@given(
    spec=valid_specs().filter(_with_server).filter(lambda spec: spec.get("discoveryBackend") != "etcd"),
    changes=st.lists(st.sampled_from(range(len(CHANGES))), min_size=1, max_size=3),
    steps=st.lists(st.sampled_from(["sync", "some ready", "all ready"]), min_size=4, max_size=12),
)
def test_generated_graphs_and_changes_never_mix_generations(hooks, spec, changes, steps) -> None:
    mc = Metacontroller(hooks, graph(source=idep(spec)).blue_green().obj())
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert_generations_apart(mc)
    for index in changes:
        mc.edit(CHANGES[index])
        for step in steps:
            if step == "sync":
                checked_sync(mc)
            elif step == "some ready":
                rollout = mc.parent["status"]["rollout"]
                mc.mark_ready(only_ready(mc, rollout.get("incomingGeneration") or "none"))
            else:
                mc.mark_ready()
            assert_generations_apart(mc)
    mc.mark_ready()
    mc.converge()
    mc.mark_ready()
    mc.converge()
    assert mc.parent["status"]["rollout"]["phase"] == "Stable"
    (generation,) = {
        (child["metadata"].get("labels") or {}).get(GENERATION_LABEL)
        for (kind, _), child in mc.children.items()
        if kind in WORKLOADS and "-nats" not in child["metadata"]["name"]
    }
    assert generation == mc.parent["status"]["rollout"]["servingGeneration"]


def test_deleting_a_graph_mid_rollout_tears_down_both_generations_in_order(hooks) -> None:
    doc = blue_green(GAIE_PD)
    mc = serving(Metacontroller(hooks, doc, composite=controller("gaie")))
    old = mc.parent["status"]["rollout"]["servingGeneration"]
    mc.edit(new_image)
    checked_sync(mc)
    new = mc.parent["status"]["rollout"]["incomingGeneration"]
    mc.run_pods()
    name = mc.parent["metadata"]["name"]
    first = {(kind, child) for verb, kind, child in mc.finalize() if verb == "delete"}
    # The front door and both generations' pickers and pools go first; no worker yet.
    assert ("HTTPRoute", f"{name}-route") in first
    for generation in (old, new):
        assert {("Deployment", f"{name}-epp-{generation}"), ("InferencePool", f"{name}-pool-{generation}")} <= first
    workers = {
        (kind, child_name)
        for (kind, child_name), child in mc.children.items()
        if child["metadata"]["labels"].get(GENERATION_LABEL) and kind in WORKLOADS
    }
    assert workers and all(
        child_name.endswith((f"-{old}", f"-{new}")) and ("prefill" in child_name or "decode" in child_name)
        for _, child_name in workers
    )
    # Both generations' worker pods, owned by their ReplicaSets (`<idep>-<service>-<generation>-<hash>`),
    # hold the plane.
    pods = {name: pod for name, pod in mc.pods.items() if pod["metadata"]["labels"].get(COMPONENT_LABEL) == "worker"}
    assert {pod["metadata"]["labels"][GENERATION_LABEL] for pod in pods.values()} == {old, new}
    messages = []
    while not mc.finalized:
        if not mc.finalize():
            mc.pods_finish_draining()
        messages.append(mc.parent["status"]["message"])
    named = ", ".join(sorted(pods)[:3])
    assert f"waiting for {len(pods)} worker pods to finish draining: {named} and {len(pods) - 3} more" in messages
    assert mc.children == {}


# --- the routers' label selector is the hook's ---------------------------------------------------

WHOLE_GRAPH = "infera.amd.com/deployment=qwen-pd"
WHOLE_GAIE = "infera.amd.com/deployment=qwen-gaie"
TOKENIZER = ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]
SECRET_ENV = {"name": "ROUTER_FLAGS", "valueFrom": {"secretKeyRef": {"name": "router", "key": "flags"}}}
Change = Callable[[dict[str, Any]], None]


def owned(name: str) -> str:
    return (
        f"under rollout.strategy BlueGreen it is the hook's (infera.amd.com/deployment={name},"
        "infera.amd.com/generation=<generation> for each generation's routers), and with another a router would see "
        "workers of other generations"
    )


def server_args(*words: str) -> Change:
    return lambda spec: spec["services"]["server"]["args"].extend(words)


def template(service: str, *containers: dict[str, Any]) -> Change:
    return lambda spec: spec["services"][service].update(extraPodSpec={"containers": list(containers)})


def patch(name: str, *operations: dict[str, Any]) -> Change:
    return lambda spec: spec.update(
        patches=[{"target": {"kind": "Deployment", "name": name}, "patch": list(operations)}]
    )


SERVER = "/spec/template/spec/containers/0"
FRONTEND = {"name": "infera-frontend", "image": "rocm/infera:sglang-v0.1.1"}
FRONTEND_COMMAND = ["python3", "-m", "infera.server", "--router-mode", "direct", *TOKENIZER]


@dataclass(frozen=True)
class Setting:
    """A way a spec sets a router's label selector: the change, the spec field the refusal names,
    the container it sets it in, how (the flag or the variable), and whether the router would read
    it (else the hook's flag, which wins over the variable, or its own value is read)."""

    change: Change
    field: str
    container: str
    how: str
    read: bool = True


# Every way a spec can set a router's selector.
SELECTOR_SETTINGS: dict[str, Setting] = {
    "server args": Setting(
        server_args(SELECTOR_FLAG, WHOLE_GRAPH), "spec.services.server.args[4]", "infera", SELECTOR_FLAG
    ),
    "server args, --flag=value": Setting(
        server_args(f"{SELECTOR_FLAG}={WHOLE_GRAPH}"),
        "spec.services.server.args[4]",
        "infera",
        SELECTOR_FLAG,
    ),
    # The routers' parsers take any unambiguous prefix of a flag.
    "server args, abbreviated": Setting(
        server_args("--k8s-l", WHOLE_GRAPH),
        "spec.services.server.args[4]",
        "infera",
        SELECTOR_FLAG,
    ),
    "server args, abbreviated=": Setting(
        server_args("--router-policy", "round-robin", f"--k8s-label={WHOLE_GRAPH}"),
        "spec.services.server.args[6]",
        "infera",
        SELECTOR_FLAG,
    ),
    # Even the hook's own value: the selector is not the spec's to write.
    "server args, the hook's own value": Setting(
        server_args(f"{SELECTOR_FLAG}=$({SELECTOR_ENV})"),
        "spec.services.server.args[4]",
        "infera",
        SELECTOR_FLAG,
        read=False,
    ),
    "server env": Setting(
        lambda spec: spec["services"]["server"].update(env=[{"name": SELECTOR_ENV, "value": WHOLE_GRAPH}]),
        "spec.services.server.env[0]",
        "infera",
        SELECTOR_ENV,
        read=False,
    ),
    "extraPodSpec args": Setting(
        template("server", {"name": "infera", "args": [*TOKENIZER, SELECTOR_FLAG, WHOLE_GRAPH]}),
        "spec.services.server.extraPodSpec.containers[0].args",
        "infera",
        SELECTOR_FLAG,
    ),
    "extraPodSpec command": Setting(
        template(
            "server",
            {
                "name": "main",
                "command": ["python3", "-m", "infera.server", *TOKENIZER, f"--k8s-label-sel={WHOLE_GRAPH}"],
            },
        ),
        "spec.services.server.extraPodSpec.containers[0].command",
        "main",
        SELECTOR_FLAG,
    ),
    # A variable the shell splits into words.
    "extraPodSpec sh -c": Setting(
        template(
            "server",
            {
                "name": "main",
                "command": ["/bin/sh", "-c", 'exec python3 -m infera.server "$@" $SELECT', "--", *TOKENIZER],
                "env": [{"name": "SELECT", "value": f"{SELECTOR_FLAG} {WHOLE_GRAPH}"}],
            },
        ),
        "spec.services.server.extraPodSpec.containers[0].command",
        "main",
        SELECTOR_FLAG,
    ),
    "extraPodSpec sh -c, the variable": Setting(
        template(
            "server",
            {
                "name": "main",
                "command": ["sh", "-c", f'{SELECTOR_ENV}={WHOLE_GRAPH} exec python3 -m infera.server "$@"', "sh"],
                "args": TOKENIZER,
            },
        ),
        "spec.services.server.extraPodSpec.containers[0].command",
        "main",
        SELECTOR_ENV,
    ),
    "extraPodSpec env": Setting(
        template("server", {"name": "infera", "env": [{"name": SELECTOR_ENV, "value": WHOLE_GRAPH}]}),
        "spec.services.server.extraPodSpec.containers[0].env[0]",
        "infera",
        SELECTOR_ENV,
        read=False,
    ),
    "extraPodSpec env from a Secret": Setting(
        template(
            "server", {"name": "infera", "env": [{"name": "X", "value": "1"}, {**SECRET_ENV, "name": SELECTOR_ENV}]}
        ),
        "spec.services.server.extraPodSpec.containers[0].env[1]",
        "infera",
        SELECTOR_ENV,
        read=False,
    ),
    "a patch appending the flag": Setting(
        patch("qwen-pd-server", {"op": "add", "path": f"{SERVER}/args/-", "value": f"{SELECTOR_FLAG}={WHOLE_GRAPH}"}),
        "patches[0] (Deployment qwen-pd-server)",
        "infera",
        SELECTOR_FLAG,
    ),
    "a patch replacing the flag's value": Setting(
        patch("qwen-pd-server", {"op": "replace", "path": f"{SERVER}/command/10", "value": WHOLE_GRAPH}),
        "patches[0] (Deployment qwen-pd-server)",
        "infera",
        SELECTOR_FLAG,
    ),
    "a patch replacing the variable": Setting(
        patch("qwen-pd-server", {"op": "replace", "path": f"{SERVER}/env/5/value", "value": WHOLE_GRAPH}),
        "patches[0] (Deployment qwen-pd-server)",
        "infera",
        SELECTOR_ENV,
        read=False,
    ),
}


@pytest.fixture(scope="module")
def serving_pd(hooks) -> Metacontroller:
    return serving(Metacontroller(hooks, blue_green(PD)))


@pytest.mark.parametrize("case", SELECTOR_SETTINGS)
def test_a_selector_the_spec_sets_is_refused_naming_its_field(serving_pd: Metacontroller, case: str) -> None:
    setting = SELECTOR_SETTINGS[case]
    assert serving_pd.refusal(setting.change) == (
        f"{setting.field}: sets the label selector of container {setting.container} ({setting.how}): "
        f"{owned('qwen-pd')}: remove it"
    )


def test_spec_envs_may_not_name_the_selector(serving_pd: Metacontroller) -> None:
    envs = [{"name": "LOG_LEVEL", "value": "info"}, {"name": SELECTOR_ENV, "value": WHOLE_GRAPH}]
    assert serving_pd.refusal(lambda spec: spec.update(envs=envs)) == (
        f"spec.envs[1]: sets the label selector of every router ({SELECTOR_ENV}): {owned('qwen-pd')}: remove it"
    )


def test_a_router_flag_the_hook_cannot_read_is_refused(serving_pd: Metacontroller) -> None:
    def secret_flags(spec: dict[str, Any]) -> None:
        spec["services"]["server"]["args"].append("$(ROUTER_FLAGS)")
        spec["services"]["server"]["env"] = [SECRET_ENV]

    assert serving_pd.refusal(secret_flags) == (
        "spec.services.server.args[4]: the hook cannot tell which label selector container infera watches "
        f"($(ROUTER_FLAGS) may hold any flag): {owned('qwen-pd')}: write the router's flags out"
    )


def test_a_selector_set_mid_rollout_keeps_both_generations(serving_pd: Metacontroller) -> None:
    mc = copy.deepcopy(serving_pd)
    mc.edit(new_image)
    checked_sync(mc)
    assert mc.parent["status"]["rollout"]["phase"] == "Progressing"
    message = mc.refusal(server_args(SELECTOR_FLAG, WHOLE_GRAPH))
    assert message.startswith("spec.services.server.args[4]: sets the label selector of container infera")


@pytest.fixture(scope="module")
def serving_gaie(hooks) -> Metacontroller:
    return serving(Metacontroller(hooks, blue_green(GAIE_PD), composite=controller("gaie")))


GATEWAY_SELECTOR_SETTINGS: dict[str, tuple[Change, str]] = {
    "a patch on the Endpoint Picker": (
        patch(
            "qwen-gaie-epp", {"op": "add", "path": f"{SERVER}/command/-", "value": f"--k8s-label-selector={WHOLE_GAIE}"}
        ),
        f"patches[0] (Deployment qwen-gaie-epp): sets the label selector of container epp ({SELECTOR_FLAG})",
    ),
    "a template's own frontend": (
        template("decode", {"name": "main"}, {**FRONTEND, "command": [*FRONTEND_COMMAND, f"--k8s-l={WHOLE_GAIE}"]}),
        "spec.services.decode.extraPodSpec.containers[1].command: sets the label selector of container "
        f"infera-frontend ({SELECTOR_FLAG})",
    ),
}


@pytest.mark.parametrize("case", GATEWAY_SELECTOR_SETTINGS)
def test_the_gateway_routers_selector_is_the_hooks(serving_gaie: Metacontroller, case: str) -> None:
    change, said = GATEWAY_SELECTOR_SETTINGS[case]
    assert serving_gaie.refusal(change) == f"{said}: {owned('qwen-gaie')}: remove it"


def test_a_router_container_the_hook_gives_no_selector_is_refused(serving_gaie: Metacontroller) -> None:
    """A template's own frontend replaces the hook's, whose variable it then lacks: it could only
    read a selector from envFrom, or none."""
    frontend = {**FRONTEND, "command": FRONTEND_COMMAND, "envFrom": [{"configMapRef": {"name": "router"}}]}
    assert serving_gaie.refusal(template("decode", {"name": "main"}, frontend)) == (
        "spec.services.decode.extraPodSpec.containers[1]: container infera-frontend runs infera.server without the "
        "label selector the hook gives a router (a container of a template's own, or patched, gets none): "
        f"{owned('qwen-gaie')}: leave the router's container to the hook"
    )


def test_outside_blue_green_a_broader_selector_stays_the_users_choice(hooks) -> None:
    doc = graph().add_args("server", f"--k8s-l={WHOLE_GRAPH}").obj()
    mc = Metacontroller(hooks, doc)
    mc.converge()
    assert mc.parent["status"]["state"] != "failed", mc.parent["status"]["message"]
