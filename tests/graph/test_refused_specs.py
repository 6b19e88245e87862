"""Specs whose children the API server would refuse fail in the hook, naming the spec field, and
keep every observed child: nothing is left for Metacontroller to apply and fail on."""

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.prerequisites import REPO, need_go_module
from tests.support.requests import PD, children_by_key, parent, request_body
from tests.support.schemas import KUBERNETES_MODULE, hook_schema
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller

Change = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def converged(hooks) -> Metacontroller:
    mc = Metacontroller(hooks, parent(PD))
    mc.converge()
    return mc


def rename_service(old: str, new: str) -> Change:
    return lambda spec: spec["services"].__setitem__(new, spec["services"].pop(old))


TRAILING_NEWLINES = {
    "service name": (
        rename_service("decode", "decode\n"),
        "invalid spec: spec.services: service name 'decode\\n' must be a DNS label: lower-case letters, digits "
        "and '-', starting with a letter",
    ),
    "pod label key": (
        lambda spec: spec["services"]["decode"].update(podLabels={"team\n": "a"}),
        "invalid spec: spec.services.decode.podLabels: 'team\\n' is not a valid label or annotation key "
        "(e.g. example.com/team)",
    ),
    "pod label value": (
        lambda spec: spec["services"]["decode"].update(podLabels={"team": "a\n"}),
        "invalid spec: spec.services.decode.podLabels.team: String should match pattern "
        "'^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'",
    ),
    "gateway name": (
        lambda spec: spec.update(gaie={"enabled": True, "tokenizerPath": "t", "gatewayName": "gw\n"}),
        "invalid spec: spec.gaie.gatewayName: String should match pattern "
        "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
    ),
}


@pytest.mark.parametrize("case", TRAILING_NEWLINES)
def test_a_trailing_newline_is_not_a_valid_name(converged: Metacontroller, case: str) -> None:
    change, message = TRAILING_NEWLINES[case]
    assert converged.refusal(change) == message


def test_a_child_over_the_object_size_limit_is_refused(converged: Metacontroller) -> None:
    big = {"name": "BLOB", "value": "x" * (1536 * 1024)}
    message = converged.refusal(lambda spec: spec.update(envs=[big]))
    assert re.fullmatch(
        r"Deployment qwen-pd-decode would be 1,5\d\d,\d\d\d bytes; the API server stores at most 1,572,864 bytes "
        r"\(1\.5 MiB\) per object: shorten what the spec puts in it \(envs, args, extraPodSpec, patches\)",
        message,
    ), message


def test_an_answer_over_the_size_bound_is_refused(converged: Metacontroller) -> None:
    def many_services_with_long_envs(spec: dict[str, Any]) -> None:
        spec["envs"] = [{"name": "BLOB", "value": "x" * (600 * 1024)}]
        for index in range(20):
            spec["services"][f"pool{index:02d}"] = copy.deepcopy(spec["services"]["decode"])

    message = converged.refusal(many_services_with_long_envs)
    # Rendering stops at the first child past the bound (8 MiB at 600 KiB per pool: the 14th pool).
    assert re.fullmatch(
        r"the graph's children would be 8,\d\d\d,\d\d\d bytes together, past the hook's bound of 8,388,608 bytes "
        r"\(8 MiB\) per InferaDeployment \(reached at Deployment qwen-pd-pool1\d\): use fewer services or smaller "
        r"envs, args, extraPodSpec and patches",
        message,
    ), message


MISSPELT_FIELDS = {
    "top level, the real field then missing": (
        lambda spec: spec.__setitem__("servces", spec.pop("services")),
        "invalid spec: spec.services: Field required; spec.servces: unknown field; did you mean services?",
    ),
    "in a service": (
        lambda spec: spec["services"]["decode"].__setitem__("replcas", 2),
        "invalid spec: spec.services.decode.replcas: unknown field; did you mean replicas?",
    ),
    "in nats": (
        lambda spec: spec.update(nats={"deplyo": False}),
        "invalid spec: spec.nats.deplyo: unknown field; did you mean deploy?",
    ),
    "in gaie, by case": (
        lambda spec: spec.update(gaie={"tokenizerpath": "Qwen/Qwen3-0.6B"}),
        "invalid spec: spec.gaie.tokenizerpath: unknown field; did you mean tokenizerPath?",
    ),
    "in a list item": (
        lambda spec: spec.update(envs=[{"name": "A", "valeu": "1"}]),
        "invalid spec: spec.envs.0.valeu: unknown field; did you mean value?",
    ),
    "nothing close": (
        lambda spec: spec["services"]["decode"].__setitem__("colour", "blue"),
        "invalid spec: spec.services.decode.colour: unknown field",
    ),
}


@pytest.mark.parametrize("case", MISSPELT_FIELDS)
def test_an_unknown_field_names_the_field_it_likely_misspells(converged: Metacontroller, case: str) -> None:
    change, message = MISSPELT_FIELDS[case]
    assert converged.refusal(change) == message


def test_a_failure_message_stays_short_whatever_it_quotes(converged: Metacontroller) -> None:
    key = "k" * 100_000 + "\n"
    message = converged.refusal(lambda spec: spec["services"]["decode"].update(podLabels={key: "a"}))
    assert message == (
        "invalid spec: spec.services.decode.podLabels: '"
        + "k" * 99
        + "... (100,004 characters) is not a valid label or "
        "annotation key (e.g. example.com/team)"
    )
    # However many things it lists, a message is cut to 2048 characters, saying so.
    unknown = {f"field{index:04d}": 1 for index in range(1000)}
    message = converged.refusal(extra("decode", **unknown))
    assert len(message) <= 2048
    assert message.startswith("spec.services.decode.extraPodSpec: 'field0000', 'field0001', ")
    assert message.endswith(" more characters)")


def extra(service: str, **pod_spec: Any) -> Change:
    return lambda spec: spec["services"][service].update(extraPodSpec=pod_spec)


def patch(kind: str, name: str, *operations: dict[str, Any]) -> Change:
    return lambda spec: spec.update(patches=[{"target": {"kind": kind, "name": name}, "patch": list(operations)}])


EPS = "spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-pd-decode made from it: "
PATCHED = "patches[0] (Deployment qwen-pd-decode): the API server would refuse the patched Deployment: "
REFUSED_BY_THE_API_SERVER = {
    "extraPodSpec command as a string": (
        extra("decode", containers=[{"name": "main", "command": "python3 -m infera.engine.sglang"}]),
        "spec.services.decode.extraPodSpec.containers[0].command: must be array or null",
    ),
    "extraPodSpec hostNetwork as a string": (
        extra("decode", hostNetwork="yes"),
        "spec.services.decode.extraPodSpec.hostNetwork: must be boolean or null",
    ),
    "extraPodSpec port out of range": (
        extra("decode", containers=[{"name": "main", "ports": [{"containerPort": 70000}]}]),
        EPS + "spec.template.spec.containers[0].ports[0].containerPort: 70000 is not a port number (1-65535)",
    ),
    "extraPodSpec port name too long": (
        extra(
            "decode", containers=[{"name": "main", "ports": [{"containerPort": 9000, "name": "metrics-endpoint-x"}]}]
        ),
        EPS + "spec.template.spec.containers[0].ports[0].name: 'metrics-endpoint-x' is not a valid port name "
        "(at most 15 lower-case letters, digits and '-', with a letter, no '--')",
    ),
    "extraPodSpec unnamed sidecar": (
        extra("decode", containers=[{"name": "main"}, {"image": "busybox"}]),
        "spec.services.decode.extraPodSpec.containers[1] needs a name",
    ),
    "extraPodSpec container name with upper case": (
        extra("decode", containers=[{"name": "main"}, {"name": "Sidecar", "image": "busybox"}]),
        EPS + "spec.template.spec.containers[1].name: 'Sidecar' is not a DNS label",
    ),
    "extraPodSpec env name with '='": (
        extra("decode", containers=[{"name": "main", "env": [{"name": "A=B", "value": "1"}]}]),
        EPS + "spec.template.spec.containers[0].env[0].name: 'A=B' is not a valid environment variable name "
        "(printable ASCII characters other than '=')",
    ),
    "extraPodSpec garbage valueFrom": (
        extra("decode", containers=[{"name": "main", "env": [{"name": "A", "valueFrom": {"garbage": 1}}]}]),
        "spec.services.decode.extraPodSpec.containers[0].env[0].valueFrom: unknown field 'garbage'",
    ),
    "extraPodSpec unknown fields, named in a stable order": (
        extra(
            "decode",
            containers=[{"name": "main", "env": [{"name": "A", "valueFrom": {"zz": 1, "garbage": 1, "aa": 1}}]}],
        ),
        "spec.services.decode.extraPodSpec.containers[0].env[0].valueFrom: unknown fields 'aa', 'garbage', 'zz'",
    ),
    "extraPodSpec mount of a missing volume": (
        extra("decode", containers=[{"name": "main", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}]),
        EPS + "spec.template.spec.containers[0].volumeMounts[0].name: no volume named 'models' in the pod",
    ),
    "extraPodSpec GPU request above its limit": (
        extra("decode", containers=[{"name": "main", "resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}}]),
        EPS + "spec.template.spec.containers[0].resources.requests.cpu: must not exceed the limit (4)",
    ),
    "extraPodSpec restartPolicy Never": (
        extra("decode", restartPolicy="Never"),
        EPS + "spec.template.spec.restartPolicy: 'Never': a workload's pods must use Always",
    ),
    "env name with '='": (
        lambda spec: spec.update(envs=[{"name": "A=B", "value": "1"}]),
        "invalid spec: spec.envs.0.name: 'A=B' is not a valid environment variable name (printable ASCII characters "
        "other than '=')",
    ),
    "garbage valueFrom": (
        lambda spec: spec["services"]["decode"].update(env=[{"name": "A", "valueFrom": {"garbage": 1}}]),
        "invalid spec: spec.services.decode.env.0.valueFrom.garbage: unknown field",
    ),
    "valueFrom of an unknown pod field": (
        lambda spec: spec.update(envs=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]),
        "invalid spec: spec.envs.0.valueFrom.fieldRef.fieldPath: 'status.phase' is not a pod field an environment "
        "variable can read (metadata.name, metadata.namespace, metadata.uid, spec.nodeName, spec.serviceAccountName, "
        "status.hostIP, status.hostIPs, status.podIP, status.podIPs, metadata.labels['<key>'], "
        "metadata.annotations['<key>'])",
    ),
    "gpuType that is not an extended resource": (
        lambda spec: spec["services"]["decode"]["resources"].update(gpuType="gpu"),
        "invalid spec: spec.services.decode.resources.gpuType: 'gpu' is not an extended resource name: a domain "
        "outside kubernetes.io, '/' and a name, e.g. amd.com/gpu",
    ),
    "replicas past int32": (
        lambda spec: spec["services"]["decode"].update(replicas=2**31),
        "invalid spec: spec.services.decode.replicas: Input should be less than or equal to 2147483647",
    ),
    "pod annotations over 256 KiB": (
        lambda spec: spec["services"]["decode"].update(podAnnotations={"example.com/blob": "x" * (256 * 1024)}),
        "invalid spec: spec.services.decode.podAnnotations: the pods would carry 262,160 bytes of annotations (with "
        "the InferaDeployment's infera* annotations); the API server allows at most 262,144",
    ),
    "image with a space": (
        lambda spec: spec.update(image="rocm/infera latest"),
        "invalid spec: spec.image: String should match pattern '^\\S*$'",
    ),
    "patch that breaks the selector": (
        patch(
            "Deployment",
            "qwen-pd-decode",
            {"op": "add", "path": "/spec/selector/matchLabels/team", "value": "other"},
        ),
        PATCHED + "spec.template.metadata.labels: do not match spec.selector",
    ),
    "patch that removes the template": (
        patch("Deployment", "qwen-pd-decode", {"op": "remove", "path": "/spec/template"}),
        PATCHED + "spec: must contain ['template'] properties",
    ),
    "patch that makes a rollout impossible": (
        patch(
            "Deployment",
            "qwen-pd-decode",
            {"op": "replace", "path": "/spec/strategy/rollingUpdate/maxUnavailable", "value": 0},
        ),
        PATCHED + "spec.strategy.rollingUpdate.maxUnavailable: may not be 0 while maxSurge is 0",
    ),
    "patch with a string replica count": (
        patch("Deployment", "qwen-pd-decode", {"op": "replace", "path": "/spec/replicas", "value": "2"}),
        PATCHED + "spec.replicas: must be integer or null",
    ),
    "patch that makes metadata a string": (
        patch("Deployment", "qwen-pd-decode", {"op": "replace", "path": "/metadata", "value": "x"}),
        "patches[0] (Deployment qwen-pd-decode): a patch must not change apiVersion, kind, metadata.name or the identity "
        "labels",
    ),
    "patch with annotations of the wrong type": (
        patch("Deployment", "qwen-pd-decode", {"op": "add", "path": "/metadata/annotations", "value": ["a"]}),
        PATCHED + "metadata.annotations: must be object or null",
    ),
    "patch with a huge invalid label value, quoted short": (
        patch(
            "Deployment",
            "qwen-pd-decode",
            {"op": "add", "path": "/spec/template/metadata/labels/example.com~1x", "value": "!" * 100_000},
        ),
        PATCHED
        + "spec.template.metadata.labels.example.com/x: '"
        + "!" * 99
        + "... (100,002 characters) is not a valid label "
        "value (at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends)",
    ),
    "patch on a Service port": (
        lambda spec: spec.update(
            patches=[
                {
                    "target": {"kind": "Service", "name": "qwen-pd-server"},
                    "patch": [{"op": "replace", "path": "/spec/ports/0/port", "value": 0}],
                }
            ]
        ),
        "patches[0] (Service qwen-pd-server): the API server would refuse the patched Service: "
        "spec.ports[0].port: 0 is not a port number (1-65535)",
    ),
}


MERGED_AWAY = ": Metacontroller merges this list by {key} and would keep only the last of the two, so give each item its own {key}"
# Lists Metacontroller's merge would mangle: it takes a list of objects sharing a key as a map
# by that key, so of two items with one value of it only the last would stay.
MANGLED_BY_METACONTROLLER = {
    "extraPodSpec port on TCP and UDP": (
        extra(
            "decode",
            containers=[
                {
                    "name": "main",
                    "ports": [{"containerPort": 53, "protocol": "TCP"}, {"containerPort": 53, "protocol": "UDP"}],
                }
            ],
        ),
        "spec.services.decode.extraPodSpec (Deployment qwen-pd-decode): spec.template.spec.containers[0].ports[1]"
        ".containerPort: 53 is also spec.template.spec.containers[0].ports[0]'s"
        + MERGED_AWAY.format(key="containerPort"),
    ),
    "patch adding a Service port's UDP twin": (
        patch(
            "Service",
            "qwen-pd-server",
            {"op": "add", "path": "/spec/ports/-", "value": {"port": 8000, "protocol": "UDP", "name": "udp"}},
        ),
        "patches[0] (Service qwen-pd-server): spec.ports[1].port: 8000 is also spec.ports[0]'s"
        + MERGED_AWAY.format(key="port"),
    ),
}


@pytest.mark.parametrize("case", MANGLED_BY_METACONTROLLER)
def test_a_list_metacontrollers_merge_would_mangle_fails_in_the_hook(converged: Metacontroller, case: str) -> None:
    change, message = MANGLED_BY_METACONTROLLER[case]
    assert converged.refusal(change) == message


@pytest.mark.parametrize("case", REFUSED_BY_THE_API_SERVER)
def test_what_the_api_server_would_refuse_fails_in_the_hook(converged: Metacontroller, case: str) -> None:
    change, message = REFUSED_BY_THE_API_SERVER[case]
    assert converged.refusal(change) == message


def test_committed_kubernetes_schema_is_what_the_generator_prints() -> None:
    need_go_module(KUBERNETES_MODULE)  # the enums' source
    committed = (REPO / "hooks" / "kubernetes-schema.json").read_text()
    assert committed == hook_schema(), "regenerate: python -m tests.support.schemas > hooks/kubernetes-schema.json"


def test_a_patch_may_set_a_field_newer_than_the_shipped_schemas(hooks: HookClient) -> None:
    obj = parent(PD)
    patch("Deployment", "qwen-pd-decode", {"op": "add", "path": "/spec/template/spec/hostnameOverride", "value": "d"})(
        obj["spec"]
    )
    # Not hooks.sync: the test suite's own validation is Kubernetes 1.33's, which lacks the field.
    answer = hooks.hook_raw("/sync", request_body(obj))
    assert answer["status"]["state"] != "failed", answer["status"]["message"]
    decode = children_by_key(answer)[("Deployment", "qwen-pd-decode")]
    assert decode["spec"]["template"]["spec"]["hostnameOverride"] == "d"


def test_a_patched_statefulset_mounts_its_claim_templates(hooks: HookClient) -> None:
    """The NATS pod mounts its store from a claim template, which is no volume of the template."""
    obj = parent(PD)
    patch("StatefulSet", "qwen-pd-nats", {"op": "add", "path": "/spec/minReadySeconds", "value": 5})(obj["spec"])
    answer = hooks.sync(obj)
    assert answer["status"]["state"] != "failed", answer["status"]["message"]
    assert children_by_key(answer)[("StatefulSet", "qwen-pd-nats")]["spec"]["minReadySeconds"] == 5


# The routers' parsers take the selector flag abbreviated and keep its last value.
NARROW_SELECTORS = {
    "abbreviated": ["--k8s-l", "app=x"],
    "abbreviated=": ["--k8s-label=app=x"],
    "the last of two": ["--k8s-label-selector", "infera.amd.com/deployment=qwen-pd", "--k8s-label-sel", "app=x"],
}


@pytest.mark.parametrize("case", NARROW_SELECTORS)
def test_a_selector_that_misses_the_workers_is_read_as_the_router_reads_it(
    converged: Metacontroller, case: str
) -> None:
    message = converged.refusal(lambda spec: spec["services"]["server"]["args"].extend(NARROW_SELECTORS[case]))
    assert message == (
        "spec.services.server (infera): its label selector 'app=x' misses the graph's worker pods, so it would "
        "never see them register: use infera.amd.com/deployment=qwen-pd"
    )
