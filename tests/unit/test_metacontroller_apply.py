"""The simulator applies an answer as Metacontroller v4.17 does, where Python's own habits would
differ from Go's: equality by type, JSON as Go writes it, the selector label set only where the
hook left it out, and each kind's declared updateStrategy. The real program is the judge of the
same rules in tests/cluster/test_differential.py."""

import copy
import json
import subprocess
from typing import Any

import pytest

from hooks.api.graph import InferaDeployment
from hooks.contract import LAST_APPLIED_ANNOTATION
from hooks.observed import pod_templates
from hooks.render import render_children
from tests.support import apiserver
from tests.support.apply import SyncFailed, go_equal, go_json, merge
from tests.support.metacontroller import merge_program
from tests.support.prerequisites import REPO
from tests.support.requests import parent
from tests.support.simulator import Metacontroller

PARENT = {
    "apiVersion": "infera.amd.com/v1alpha1",
    "kind": "InferaDeployment",
    "metadata": {"name": "g", "namespace": "ns", "uid": "parent-uid", "generation": 1},
    "spec": {},
}


def composite(method: str | None) -> dict[str, Any]:
    strategy = {"updateStrategy": {"method": method}} if method else {}
    return {"spec": {"childResources": [{"apiVersion": "v1", "resource": "services", **strategy}], "hooks": {}}}


class ScriptedHooks:
    """Hooks that answer each sync with the next of `answers` (the last one again once they run out)."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)

    def hook(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return copy.deepcopy(answer)


def service(port: Any = 80, labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "door"}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": {"ports": [{"port": port}]}}


def answer(*children: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"children": list(children), "status": {"state": "ready", **status}}


def simulated(method: str | None, *answers: dict[str, Any]) -> Metacontroller:
    return Metacontroller(ScriptedHooks(*answers), copy.deepcopy(PARENT), composite(method))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (1, 1, True),
        (1, 1.0, False),
        (True, 1, False),
        (0, False, False),
        ({"a": [1, "x"]}, {"a": [1, "x"]}, True),
        ({"a": [1]}, {"a": [1.0]}, False),
        ({"a": None}, {}, False),
        (float("nan"), float("nan"), False),
    ],
)
def test_equality_is_gos_typed_deep_equality(left: Any, right: Any, equal: bool) -> None:
    assert go_equal(left, right) is equal
    assert go_equal(right, left) is equal


def test_json_is_written_as_go_writes_it() -> None:
    value = {"b": 1.0, "a": "x<y>&z \u2028 é", "c": [2.5, 1e21]}
    assert go_json(value) == '{"a":"x\\u003cy\\u003e\\u0026z \\u2028 é","b":1,"c":[2.5,1e+21]}'


def test_an_integer_written_as_a_float_is_applied_on_every_sync() -> None:
    """The API server stores 1.0 as 1; Metacontroller compares the merge (holding 1.0) with what
    is stored by type, so the answer is never in place and every sync updates the child."""
    mc = simulated("InPlace", answer(service(port=80.0)))
    assert mc.sync() == [("create", "Service", "door"), ("status", "InferaDeployment", "g")]
    assert mc.children[("Service", "door")]["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    for _ in range(3):
        assert mc.sync() == [("update", "Service", "door")]


def test_a_status_holding_a_whole_float_is_written_on_every_sync() -> None:
    mc = simulated("InPlace", answer(service(), ready=2.0))
    assert mc.sync() == [("create", "Service", "door"), ("status", "InferaDeployment", "g")]
    assert mc.parent["status"]["ready"] == 2 and type(mc.parent["status"]["ready"]) is int
    assert mc.sync() == [("status", "InferaDeployment", "g")]


def test_the_selector_label_is_added_only_where_the_hook_left_it_out() -> None:
    mc = simulated("InPlace", answer(service(labels={"controller-uid": "parent-uid", "app": "x"})))
    mc.sync()
    stored = mc.children[("Service", "door")]
    assert stored["metadata"]["labels"] == {"controller-uid": "parent-uid", "app": "x"}
    assert json.loads(stored["metadata"]["annotations"][LAST_APPLIED_ANNOTATION])["metadata"]["labels"] == {
        "controller-uid": "parent-uid",
        "app": "x",
    }


def test_a_child_labelled_for_another_parent_fails_the_whole_sync() -> None:
    """Metacontroller checks every desired child against the parent's selector before it writes
    anything: neither the children nor the status is written."""
    other = service(labels={"controller-uid": "someone-else"})
    mc = simulated("InPlace", answer(service(), message="first"), answer(other, service(), message="second"))
    mc.sync()
    stored, status = copy.deepcopy(mc.children), copy.deepcopy(mc.parent["status"])
    with pytest.raises(SyncFailed, match="labels on desired child Service ns/door don't match parent selector"):
        mc.sync()
    assert mc.children == stored and mc.parent["status"] == status


@pytest.mark.parametrize(
    ("method", "writes"),
    [
        (None, [[], []]),
        ("OnDelete", [[], []]),
        ("InPlace", [[("update", "Service", "door")], []]),
        ("Recreate", [[("delete", "Service", "door")], [("create", "Service", "door")]]),
    ],
)
def test_a_changed_child_is_written_as_its_kinds_update_strategy_says(
    method: str | None, writes: list[list[tuple[str, str, str]]]
) -> None:
    mc = simulated(method, answer(service(port=80)), answer(service(port=81)))
    mc.sync()
    uid = mc.children[("Service", "door")]["metadata"]["uid"]
    assert [mc.child_writes(mc.sync()) for _ in writes] == writes
    kept = mc.children[("Service", "door")]
    assert [p["port"] for p in kept["spec"]["ports"]] == [80 if method in (None, "OnDelete") else 81]
    assert (kept["metadata"]["uid"] == uid) is (method != "Recreate")


def test_a_list_of_objects_with_a_conventional_key_merges_item_by_item() -> None:
    """What another writer added to a list map is kept; what the hook dropped since its last
    answer goes; a list without a common key is replaced."""
    observed = {"ports": [{"port": 80, "nodePort": 30080}, {"port": 90}], "args": ["a", "b"]}
    last = {"ports": [{"port": 80}, {"port": 90}], "args": ["a", "b"]}
    desired = {"ports": [{"port": 80}, {"port": 100}], "args": ["c"]}
    assert merge(observed, last, desired) == {"ports": [{"port": 80, "nodePort": 30080}, {"port": 100}], "args": ["c"]}


def test_two_items_with_one_merge_key_come_out_as_the_last_of_them_twice() -> None:
    """Go's merge keys the observed list by the merge key, so TCP and UDP on one port become two
    copies of the UDP one: the merge never equals what is stored, and every sync writes."""
    ports = [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]
    assert merge({"ports": ports}, {"ports": ports}, {"ports": ports}) == {"ports": [ports[1], ports[1]]}


@pytest.mark.parametrize(
    ("observed", "last_applied", "desired", "merged"),
    [
        ({"a": 1, "b": 2}, {"a": 1}, "scalar", {"b": 2}),  # a map stays a map, less what was applied
        (["x"], ["x"], {"not": "a list"}, None),
        ({"a": 1}, "not a map", {"c": 3}, {"a": 1, "c": 3}),
        (
            [{"port": 80.0, "protocol": "TCP"}],
            [],
            [{"port": 80, "name": "http"}],
            [{"port": 80, "name": "http", "protocol": "TCP"}],
        ),
    ],
)
def test_the_merge_takes_values_of_another_type_as_go_does(
    observed: Any, last_applied: Any, desired: Any, merged: Any
) -> None:
    assert merge(observed, last_applied, desired) == merged


def merge_cases() -> list[tuple[Any, Any, Any]]:
    """[observed, lastApplied, desired] for Metacontroller's merge: edge cases of its rules, and
    every example's children as the API server stores them, applied again and with their pod
    templates' first container gaining an env var and losing its ports."""
    cases: list[tuple[Any, Any, Any]] = [
        ({"spec": {"ports": [{"port": 53, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}},) * 3,
        ({"a": 1, "b": 2}, {"a": 1}, {"a": "scalar"}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}}, {"a": "scalar"}),
        ({"a": ["x"]}, {"a": ["x"]}, {"a": {"not": "a list"}}),
        ({"a": {"b": 1}}, {"a": "not a map"}, {"a": {"c": 3}}),
        ({"p": [{"port": 80.5, "protocol": "TCP"}]}, {}, {"p": [{"port": 80.5, "name": "http"}]}),
        ({"p": [{"port": 80, "x": 1}, {"port": 90}]}, {"p": [{"port": 80}, {"port": 90}]}, {"p": [{"port": 100}]}),
        ({"p": [{"name": True, "v": 1}]}, {}, {"p": [{"name": True, "w": 2}]}),
        ({"a": 1, "b": None}, {"b": None}, {"a": None}),
        (
            {"l": [{"mountPath": "/a", "name": "n"}, {"name": "m", "mountPath": "/b"}]},
            {},
            {"l": [{"name": "n", "mountPath": "/c"}]},
        ),
    ]
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for child in render_children(InferaDeployment.model_validate(parent(path))):
            stored = apiserver.store(child)
            cases.append((stored, child, child))
            changed = copy.deepcopy(child)
            for template, _ in pod_templates(changed):
                container = template["spec"]["containers"][0]
                container["env"] = [*container.get("env", []), {"name": "ADDED", "value": "1"}]
                container.pop("ports", None)
            cases.append((stored, child, changed))
    return cases


def test_the_merge_is_metacontrollers_own() -> None:
    """tests/support/apply.py's merge against Metacontroller's pkg/dynamic/apply.Merge itself, built
    from its release source: the same result for every case."""
    cases = merge_cases()
    ran = subprocess.run(
        [str(merge_program())], input=json.dumps(cases), capture_output=True, text=True, timeout=120, check=True
    )
    theirs = json.loads(ran.stdout)
    ours = [merge(copy.deepcopy(observed), last, desired) for observed, last, desired in cases]
    assert len(theirs) == len(cases) > 100
    assert [i for i, (mine, go) in enumerate(zip(ours, theirs, strict=True)) if mine != go] == []
