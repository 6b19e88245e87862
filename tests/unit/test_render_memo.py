"""The render memo: a memoised answer is the fresh answer, byte for byte, and the memo stays
bounded and belongs to one build.

A fresh answer is computed through a memo of no bytes (RenderMemo(0)), the path the CLI and
every in-process test take; the service's workers keep one memo each for their whole life.
"""

import copy
import gc
import importlib.metadata
import itertools
import json
import shutil
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hooks import memo as memo_module
from hooks import reconcile, render, status
from hooks.contract import LAST_APPLIED_ANNOTATION, parse_request
from hooks.encoding import canonical_json
from hooks.memo import RenderMemo
from tests.support.graphs import GraphBuilder, graph
from tests.support.prerequisites import REPO
from tests.support.requests import controller, converged_bodies, observed_as_applied, parent, request_body
from tests.support.specs import idep, mutated_specs, valid_specs

START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
# One memo for every generated example, as a worker keeps one for every parent it answers:
# a key that mixed two parents' inputs up would answer one with the other's children.
SHARED = RenderMemo()


def worlds(obj: dict[str, Any], draw: st.DrawFn) -> list[dict[str, Any]]:
    """Requests for one parent as Metacontroller sends them over a graph's life: nothing yet,
    everything created, pods becoming ready, an autoscaler's count, a resourceVersion moving,
    and a world seen before again (a memo hit)."""
    composite = controller("lws", "gaie")
    first = reconcile.sync(parse_request(request_body(obj, [], composite=composite)))
    created = [c for c in first["children"] if "metadata" in c and "name" in c["metadata"]]
    states = [
        {},
        {"replicas": 1, "readyReplicas": 0, "updatedReplicas": 1, "observedGeneration": 1},
        {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1},
        {"replicas": draw(st.integers(0, 5)), "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1},
    ]
    bodies = [request_body(obj, [], composite=composite)]
    for version, state in enumerate(draw(st.lists(st.sampled_from(states), min_size=1, max_size=4)), start=2):
        world = copy.deepcopy(obj)
        world["metadata"]["resourceVersion"] = str(version)
        world["status"] = first["status"]
        observed = observed_as_applied(created, state, version)
        scaled = draw(st.none() | st.integers(0, 5))  # what an autoscaler set, if one did
        for child in observed:
            if scaled is not None and child["kind"] in ("Deployment", "LeaderWorkerSet"):
                child["spec"]["replicas"] = scaled
        bodies.append(request_body(world, observed, composite=composite))
    return bodies + [copy.deepcopy(draw(st.sampled_from(bodies)))]


AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 4,
    "metrics": [
        {"type": "Pods", "pods": {"metric": {"name": "queue"}, "target": {"type": "AverageValue", "averageValue": "4"}}}
    ],
}


@st.composite
def request_sequences(draw: st.DrawFn) -> list[dict[str, Any]]:
    spec = draw(st.one_of(valid_specs(), mutated_specs()))
    if draw(st.booleans()) and isinstance(spec.get("services"), dict):
        autoscaled = draw(st.sampled_from(sorted(spec["services"])))
        if isinstance(spec["services"][autoscaled], dict):
            spec["services"][autoscaled]["autoscaling"] = AUTOSCALING
    return worlds(idep(spec), draw)


@settings(max_examples=60)
@given(bodies=request_sequences())
def test_memoised_answers_are_the_fresh_answers_byte_for_byte(bodies: list[dict[str, Any]]) -> None:
    # A clock that moves between requests: a status that read it must not be served later.
    clock = (START + timedelta(seconds=seconds) for seconds in itertools.count())
    for body in bodies:
        now = next(clock)
        memoised = reconcile.sync_answer(parse_request(body), lambda: now, SHARED).json()
        fresh = reconcile.sync_answer(parse_request(copy.deepcopy(body)), lambda: now, RenderMemo(0)).json()
        assert memoised == fresh
        # The splice is what encoding the whole answer at once writes.
        assert memoised == canonical_json(json.loads(memoised))


def test_the_service_answers_distinct_requests_as_a_fresh_render(hooks) -> None:
    """Over HTTP, every worker's memo warm after the first few: each distinct request (no answer
    cache hit) gets exactly the in-process fresh answer. Their statuses are converged, so no
    condition moves and the clock plays no part."""
    for body in converged_bodies(12):
        reply = hooks.request("POST", "/sync", body)
        assert reply.status == 200
        assert reply.body == reconcile.sync_answer(parse_request(json.loads(body))).json()


def small_parent(name: str) -> dict[str, Any]:
    return graph(name).obj()


def test_the_memo_keeps_to_its_bound_least_recently_used_out() -> None:
    bound = 100_000
    memo = RenderMemo(bound)
    names = [f"g{i}" for i in range(12)]
    for name in names:
        request = parse_request(request_body(small_parent(name)))
        reconcile.sync_answer(request, memo=memo)
        assert memo.size <= bound
    # A PD graph's entry counts about 32 KB: the last three fit, the first ones were evicted.
    kept = [name for name in names if memo.holds(small_parent(name))]
    assert kept == names[-len(kept) :] and 2 <= len(kept) < len(names)


# The services of the PD example.
PD_SERVICES = ("server", "prefill", "decode")


def memo_shapes() -> dict[str, GraphBuilder]:
    """Parents whose memory is mostly parsed models, plain JSON objects, short or long strings."""
    shapes = {"a PD graph": graph("g")}

    def shaped(name: str, **service: Any) -> GraphBuilder:
        shapes[name] = graph(name)
        for each in PD_SERVICES:
            shapes[name].service(each, **service)
        return shapes[name]

    shaped("6,000 envs").envs(*({"name": f"VAR_{j:05d}", "value": f"value-{j}"} for j in range(6000)))
    field_ref = {"fieldRef": {"fieldPath": "status.podIP"}}
    shaped("1,000 envs from fields").envs(*({"name": f"V{j}", "valueFrom": field_ref} for j in range(1000)))
    many_args = shaped("1,000 args each")
    for each in PD_SERVICES:
        many_args.add_args(each, *(f"--flag-{j}" for j in range(1000)))
    shaped("1,000 annotations each", podAnnotations={f"example.com/k{j}": "x" * 50 for j in range(1000)})
    env = [{"name": f"E{j}", "value": "v"} for j in range(500)]
    shaped("extraPodSpec", extraPodSpec={"containers": [{"name": "main", "env": env}]})
    shaped("a long annotation each", podAnnotations={"example.com/note": "x" * 60_000})
    return shapes


def test_the_memo_counts_what_its_entries_take() -> None:
    """What the memo counts is what tracemalloc sees it keep (parsed models, children,
    statuses and its own bookkeeping), within a few percent, whatever a spec is made of."""
    for shape, (name, built) in enumerate(memo_shapes().items()):
        bodies = []
        for index in range(2):
            distinct = built.name(f"g{shape}-{index}").obj()
            bodies.append(json.dumps(request_body(distinct)).encode())
        first = reconcile.sync_answer(parse_request(json.loads(bodies[0])), memo=RenderMemo(0))  # caches filled
        assert first.state != "failed", name
        memo = RenderMemo(1 << 40)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for body in bodies:
                reconcile.sync_answer(parse_request(json.loads(body)), memo=memo)
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 0.95 * kept <= memo.size <= 1.2 * kept, f"{name}: {memo.size:,} bytes counted, {kept:,} kept"


def test_a_memo_of_no_bytes_keeps_nothing() -> None:
    memo = RenderMemo(0)
    request = parse_request(request_body(small_parent("g")))
    reconcile.sync_answer(request, memo=memo)
    assert memo.size == 0 and not memo.holds(small_parent("g"))


def test_each_parent_keeps_its_latest_renders_only() -> None:
    memo = RenderMemo()
    cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}
    obj = (
        graph("g")
        .autoscaling("decode", minReplicas=1, maxReplicas=10, metrics=[{"type": "Resource", "resource": cpu}])
        .obj()
    )
    first = reconcile.sync(parse_request(request_body(obj)))["children"]
    for replicas in range(1, 9):  # the autoscaler moves: a new render each time
        observed = observed_as_applied(first, {}, replicas)
        for child in observed:
            if child["kind"] == "Deployment" and child["metadata"]["name"] == "g-decode":
                child["spec"]["replicas"] = replicas
        reconcile.sync_answer(parse_request(request_body(obj, observed)), memo=memo)
    entry = memo.parent(obj)
    assert len(entry.kept(render.desired_children)) == memo_module.KEPT_PER_PARENT
    assert memo.size == entry.size  # the one parent's entry, its evicted renders given back


def test_a_new_build_renders_afresh(monkeypatch) -> None:
    memo = RenderMemo()
    obj = small_parent("g")
    reconcile.sync_answer(parse_request(request_body(obj)), memo=memo)
    assert memo.holds(obj)
    monkeypatch.setattr(memo_module, "BUILD_DIGEST", b"another build")
    assert not memo.holds(obj)


def test_the_build_digest_covers_the_package_data_and_the_dependencies(tmp_path: Path) -> None:
    package = Path(memo_module.__file__).parent
    versions = memo_module.dependency_versions("infera-hooks")
    # What decodes, validates, patches and encodes an answer, among every distribution it runs on.
    assert {"pydantic", "pydantic-core", "orjson", "jsonpatch", "pyyaml", "fastjsonschema"} <= set(versions)
    assert versions["pydantic-core"] == importlib.metadata.version("pydantic-core")
    copied = tmp_path / "hooks"
    shutil.copytree(package, copied, ignore=shutil.ignore_patterns("__pycache__"))
    assert memo_module.build_digest(copied, versions) == memo_module.BUILD_DIGEST  # the same build
    schema = copied / "kubernetes-schema.json"
    schema.write_text(schema.read_text().replace('"additionalProperties": false', '"additionalProperties": true', 1))
    assert memo_module.build_digest(copied, versions) != memo_module.BUILD_DIGEST
    for name in ("pydantic-core", "orjson"):
        other = {**versions, name: versions[name] + ".post1"}
        assert memo_module.build_digest(package, other) != memo_module.BUILD_DIGEST


def test_a_status_that_read_the_clock_is_not_kept() -> None:
    memo = RenderMemo()
    body = request_body(small_parent("g"))  # no previous status: every condition is new
    answers = [
        json.loads(reconcile.sync_answer(parse_request(body), lambda: now, memo).json())
        for now in (START, START + timedelta(hours=1))
    ]
    stamps = [{c["lastTransitionTime"] for c in answer["status"]["conditions"]} for answer in answers]
    assert stamps == [{"2026-11-30T12:00:00Z"}, {"2026-11-30T13:00:00Z"}]
    assert not memo.parent(small_parent("g")).kept(status.encoded_status)


# Found by review: inputs the memo keys must tell apart, and what a fresh render would refuse.


def test_numbers_that_are_not_finite_are_refused(hooks) -> None:
    """orjson writes NaN and Infinity as null, so a memo key could not tell them from null:
    the hook refuses them, as no Kubernetes object holds one."""
    good = json.dumps(request_body(small_parent("g")))
    for number in ("NaN", "Infinity", "-Infinity", "1e400"):
        body = good.replace('"generation": 1', f'"generation": {number}', 1).encode()
        reply = hooks.request("POST", "/sync", body)
        assert (reply.status, reply.json) == (
            400,
            {"error": f"the number {number} is not finite: JSON holds no NaN or Infinity"},
        )


def test_a_replica_count_set_to_null_is_not_an_absent_one() -> None:
    """The GAIE status reads an absent spec.replicas of the EPP as 1 and null as 0: the status
    key holds whether it is set."""
    obj = parent(REPO / "examples" / "gaie-pd.yaml")
    composite = controller("gaie")
    children = reconcile.sync(parse_request(request_body(obj, composite=composite)))["children"]
    memo = RenderMemo()
    for replicas in ("absent", None):
        observed = observed_as_applied(children, {"readyReplicas": 1}, 2)
        for child in observed:
            if child["kind"] == "Deployment" and child["metadata"]["name"].endswith("-epp"):
                child["spec"].pop("replicas", None)
                if replicas != "absent":
                    child["spec"]["replicas"] = replicas
        body = request_body(obj, observed, composite=composite)
        now = lambda: START  # noqa: E731
        fresh = reconcile.sync_answer(parse_request(copy.deepcopy(body)), now, RenderMemo(0)).json()
        assert reconcile.sync_answer(parse_request(body), now, memo).json() == fresh


def test_an_immutable_field_is_kept_verbatim() -> None:
    """1 and 1.0 are equal in Python, not on the wire: the stored value is answered as stored."""
    from hooks.answer import recorded_fields, records_to_read
    from hooks.immutable import encoded, keep_immutable_fields

    wanted = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "s"},
        "spec": {"selector": {"a": "b"}, "volumeClaimTemplates": [{"spec": {"x": 1.0}}]},
    }
    stored = copy.deepcopy(wanted)
    stored["spec"]["volumeClaimTemplates"] = [{"spec": {"x": 1}}]
    stored["metadata"]["annotations"] = {LAST_APPLIED_ANNOTATION: json.dumps(wanted)}
    recorded = recorded_fields(records_to_read([stored]))
    (child,), notices = keep_immutable_fields([encoded(wanted)], {("StatefulSet", "s"): stored}, recorded)
    assert notices == [] and json.loads(child.body)["spec"]["volumeClaimTemplates"] == [{"spec": {"x": 1}}]
    assert b'"x":1}' in child.body


def test_a_last_applied_record_holding_nan_is_no_record() -> None:
    """Answered again, a NaN would be written as null (deleting the field): such a record is
    ignored, and the child is kept as the API server holds it."""
    from hooks.contract import as_last_applied

    child = {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": {"name": "d", "annotations": {LAST_APPLIED_ANNOTATION: '{"spec": {"replicas": NaN}}'}},
        "spec": {"replicas": 3},
        "status": {"replicas": 3},
    }
    assert as_last_applied(child)["spec"] == {"replicas": 3}
