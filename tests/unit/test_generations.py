"""What a generation is made of, and how a server Service's selector may change."""

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from hooks import generations
from hooks.api.graph import InferaDeployment
from hooks.contract import LAST_APPLIED_ANNOTATION
from hooks.immutable import encoded, keep_immutable_fields
from hooks.observed import pod_templates
from hooks.render import render_children
from tests.support.graphs import GraphBuilder, graph
from tests.support.requests import EXAMPLES

GAIE_PD = EXAMPLES / "gaie-pd.yaml"


def rendered(built: GraphBuilder | None = None) -> list[dict[str, Any]]:
    """The children of `built` (the PD graph unless given) under BlueGreen."""
    return render_children(InferaDeployment.from_parent((built or graph()).blue_green().obj()))


BASE = generations.digest(rendered())


def test_replicas_pod_metadata_and_autoscaling_bounds_are_not_part_of_a_generation() -> None:
    scaled = (
        graph()
        .service("decode", replicas=4, podLabels={"team": "a"}, podAnnotations={"note": "b"})
        .service("prefill", disruptionBudget={"maxUnavailable": 2})
    )
    assert generations.digest(rendered(scaled)) == BASE


CPU = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}
SPREAD = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}


PATCHED = graph().patch(
    "Deployment",
    "qwen-pd-prefill",
    {"op": "add", "path": "/spec/template/spec/topologySpreadConstraints", "value": [SPREAD]},
)


@pytest.mark.parametrize(
    ("spread", "unspread"),
    [
        (graph().replicas(server=2), None),
        (graph().autoscaling("server", minReplicas=1, maxReplicas=3, metrics=[CPU]), None),
        # A template of its own drops the worker's /boot mount; the spread is all that differs.
        (
            graph().extra_pod_spec("decode", topologySpreadConstraints=[SPREAD]),
            graph().extra_pod_spec("decode"),
        ),
        (PATCHED, None),
    ],
    ids=["two routers", "autoscaled routers", "extraPodSpec", "patch"],
)
def test_placement_across_nodes_is_not_part_of_a_generation(spread, unspread) -> None:
    """The spread the hook gives several routers follows their count; the user's own spread
    (a template, a patch) is left out alike: it says where pods run, not what they run."""
    children = rendered(spread)
    assert any("topologySpreadConstraints" in spec for spec in template_specs(children))
    assert generations.digest(children) == generations.digest(rendered(unspread))


def test_several_endpoint_pickers_are_the_same_generation_as_one() -> None:
    spread = rendered(graph(source=GAIE_PD).epp_replicas(3))
    assert any("topologySpreadConstraints" in spec for spec in template_specs(spread))
    assert generations.digest(spread) == generations.digest(rendered(graph(source=GAIE_PD)))


def template_specs(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [template["spec"] for child in children for template, _ in pod_templates(child)]


def digest_of_whole_templates(children: list[dict[str, Any]]) -> str:
    """generations.digest as it was before placement was left out (up to a2fc70b): every
    template's whole spec."""
    runs = [
        [
            child["kind"],
            child["metadata"]["name"],
            (child["spec"].get("leaderWorkerTemplate") or {}).get("size"),
            [template["spec"] for template, _ in pod_templates(child)],
        ]
        for child in children
        if child["kind"] in ("Deployment", "LeaderWorkerSet")
    ]
    runs.sort(key=lambda run: (run[0], run[1]))
    return hashlib.sha256(json.dumps(runs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:8]


# Every example BlueGreen accepts (etcd discovery keeps no generations apart).
BLUE_GREEN_EXAMPLES = sorted(path for path in EXAMPLES.glob("*.yaml") if path.name != "etcd-discovery.yaml")
# Those with several routers or pickers, which the hook spreads across nodes.
SPREAD_EXAMPLES = {"pd-blue-green.yaml", "pd-monitored.yaml"}


@pytest.mark.parametrize("example", BLUE_GREEN_EXAMPLES, ids=lambda path: path.name)
def test_a_graph_without_spread_keeps_the_generation_it_had(example: Path) -> None:
    """Leaving placement out renames no running generation whose pods have none: upgrading the
    hook starts no rollout of them."""
    children = rendered(graph(source=example))
    spread = any("topologySpreadConstraints" in spec for spec in template_specs(children))
    assert spread == (example.name in SPREAD_EXAMPLES)
    assert (generations.digest(children) == digest_of_whole_templates(children)) != spread


def test_what_a_process_runs_is_part_of_a_generation() -> None:
    changes = [
        graph().image("rocm/infera:other"),
        graph().add_args("decode", "--enable-metrics"),
        graph().add_args("server", "--router-policy", "round-robin"),
        graph().envs({"name": "A", "value": "1"}),
        graph().resources("decode", gpu=2, memory="64Gi"),
    ]
    digests = [generations.digest(rendered(change)) for change in changes]
    assert BASE not in digests and len(set(digests)) == len(changes)


def test_a_generation_is_eight_hex_digits_and_every_rendered_pod_carries_it() -> None:
    assert len(BASE) == 8 and int(BASE, 16) >= 0
    obj = graph().blue_green().obj()
    children = render_children(InferaDeployment.from_parent(obj).at_generation(BASE))
    workloads = [c for c in children if c["kind"] == "Deployment" and not c["metadata"]["name"].endswith("nats")]
    assert sorted(c["metadata"]["name"] for c in workloads) == [
        f"qwen-pd-{s}-{BASE}" for s in ("decode", "prefill", "server")
    ]
    for child in workloads:
        assert child["spec"]["template"]["metadata"]["labels"]["infera.amd.com/generation"] == BASE
        assert child["spec"]["selector"]["matchLabels"]["infera.amd.com/generation"] == BASE
    server = next(c for c in workloads if c["metadata"]["name"].startswith("qwen-pd-server"))
    command = server["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--k8s-label-selector") + 1] == (
        f"infera.amd.com/deployment=qwen-pd,infera.amd.com/generation={BASE}"
    )


def service(selector: dict[str, str], applied: dict[str, str] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"selector": selector},
    }
    if applied is not None:
        record = copy.deepcopy(obj)
        record["spec"]["selector"] = applied
        obj["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: json.dumps(record)}
    return obj


def test_a_service_selector_the_hook_applied_changes_in_place() -> None:
    stored = service({"a": "1", "g": "x"}, applied={"a": "1", "g": "x"})
    desired = service({"a": "1", "g": "y"}, applied=None)
    answer, notices = keep_immutable_fields([encoded(desired)], {("Service", "s"): stored}, {})
    assert [child.name for child in answer] == ["s"] and notices == []
    dropped = service({"a": "1"}, applied=None)  # back to RollingUpdate: the merge removes g
    answer, notices = keep_immutable_fields([encoded(dropped)], {("Service", "s"): stored}, {})
    assert [child.name for child in answer] == ["s"] and notices == []


def test_a_service_selector_with_a_key_the_hook_never_applied_is_replaced() -> None:
    for stored in (service({"a": "1", "other": "z"}, applied={"a": "1"}), service({"a": "1", "other": "z"}, None)):
        answer, notices = keep_immutable_fields(
            [encoded(service({"a": "1", "g": "y"}, None))], {("Service", "s"): stored}, {}
        )
        assert answer == [] and len(notices) == 1 and "is being replaced" in notices[0]


def generation(name: str, ready: bool) -> dict[tuple[str, str], dict[str, Any]]:
    """The workloads of generation `name` of the PD graph, as observed, all ready or none."""
    idep = InferaDeployment.from_parent(graph().blue_green().obj()).at_generation(name)
    observed = {}
    for child in render_children(idep):
        if child["kind"] != "Deployment" or child["metadata"]["name"].endswith("-nats"):
            continue
        child = copy.deepcopy(child)
        count = 1 if ready else 0
        child["metadata"]["generation"] = 1
        child["status"] = {"observedGeneration": 1, "readyReplicas": count, "updatedReplicas": count}
        observed[("Deployment", child["metadata"]["name"])] = child
    return observed


def door(selected: str | None) -> dict[tuple[str, str], dict[str, Any]]:
    """The server's Service, selecting generation `selected` (None: deleted)."""
    if selected is None:
        return {}
    labels = {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/service": "server"}
    selector = {**labels, "infera.amd.com/generation": selected}
    return {
        ("Service", "qwen-pd-server"): {
            "kind": "Service",
            "metadata": {"name": "qwen-pd-server"},
            "spec": {"selector": selector},
        }
    }


def blue_green_pd() -> InferaDeployment:
    return InferaDeployment.from_parent(graph().blue_green().obj())


# (what is observed: generations present and whether ready, the door, the recorded serving
# generation), the desired generation -> the generation that serves and those kept.
PLANS = {
    "nothing yet": ({}, None, None, "d", ("d", set())),
    "progressing": ({"s": True, "d": False}, "s", "s", "d", ("s", {"s"})),
    "the incoming generation is ready: the door moves": ({"s": True, "d": True}, "s", "s", "d", ("d", {"s"})),
    "the door has moved: the old generation goes": ({"s": True, "d": True}, "d", "d", "d", ("d", set())),
    "the door deleted": ({"s": True, "d": False}, None, "s", "d", ("s", {"s"})),
    "the door edited to the incoming generation": ({"s": True, "d": False}, "d", "s", "d", ("s", {"s"})),
    "the door deleted, the status lost": ({"s": True, "d": False}, None, None, "d", ("s", {"s"})),
    "the door edited, the status lost": ({"s": True, "d": False}, "d", None, "d", ("s", {"s"})),
    "no witness, nothing ready: the older generation": ({"s": False, "d": False}, None, None, "d", ("s", {"s"})),
    "reverted: the incoming generation goes": ({"s": True, "d": False}, "s", "s", "s", ("s", set())),
    "a second change replaces the incoming one": ({"s": True, "d": False}, "s", "s", "e", ("s", {"s"})),
    "switched, then unready: both witnesses agree, it serves": ({"s": True, "d": False}, "d", "d", "d", ("d", set())),
    "the status edited, the door agrees with it: it serves": ({"s": True, "d": False}, "d", "d", "e", ("d", {"d"})),
    "a witness of a generation that is gone is passed over": ({"d": False}, "s", "s", "d", ("d", set())),
    "serving and unready, the incoming not ready": ({"s": False, "d": False}, "s", "s", "d", ("s", {"s"})),
}


@pytest.mark.parametrize("case", PLANS, ids=list(PLANS))
def test_which_generation_serves_is_read_from_every_witness(case: str) -> None:
    present, selected, recorded, desired, (serving, kept) = PLANS[case]
    names = {"s": "1111aaaa", "d": "2222bbbb", "e": "3333cccc"}
    observed: dict[tuple[str, str], dict[str, Any]] = door(names.get(selected or ""))
    for short, ready in present.items():
        observed |= generation(names[short], ready)
    rollout = generations.plan(blue_green_pd().at_generation(names[desired]), observed, names.get(recorded or ""))
    assert (rollout.serving, set(rollout.kept)) == (names[serving], {names[k] for k in kept})
