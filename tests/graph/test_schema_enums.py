"""The enums of Kubernetes' generated OpenAPI definitions, shipped in hooks/kubernetes-schema.json:
a value the API server would refuse fails in the hook naming its field, "" is no refusal, and
the generator reads them from the Go module or says why it cannot. Also the API server's rules
on what an enum's value requires elsewhere in the object, which admission checks."""

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from hooks.kubernetes_schema import path, problem
from tests.support.prerequisites import REPO
from tests.support.requests import PD, children_by_key, parent
from tests.support.schemas import openapi_enums
from tests.support.service import HookClient
from tests.support.simulator import Metacontroller

SHIPPED = json.loads((REPO / "hooks" / "kubernetes-schema.json").read_text())
DEFINITIONS = SHIPPED["definitions"]
POD_SPEC = DEFINITIONS["io.k8s.api.core.v1.PodSpec"]
BOGUS = "NotAnEnumValue"
MAP_VALUE = "example.com/key"  # in a FieldPath: a map's key (no Kubernetes field is called so)
FieldPath = tuple[str | int, ...]  # ("containers", 0, "imagePullPolicy")


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = DEFINITIONS[node["$ref"].rsplit("/", 1)[1]]
    return node


def enum_paths(node: dict[str, Any], at: FieldPath = (), seen: frozenset[str] = frozenset()) -> Iterator[FieldPath]:
    """Every enum-constrained field below `node`, through objects, arrays (index 0) and maps
    (key MAP_VALUE); a definition met again on the way down is not entered again."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        if name not in seen:
            yield from enum_paths(DEFINITIONS[name], at, seen | {name})
        return
    if "enum" in node:
        yield at
    for name, sub in (node.get("properties") or {}).items():
        yield from enum_paths(sub, (*at, name), seen)
    if isinstance(node.get("items"), dict):
        yield from enum_paths(node["items"], (*at, 0), seen)
    if isinstance(node.get("additionalProperties"), dict):
        yield from enum_paths(node["additionalProperties"], (*at, MAP_VALUE), seen)


def child_schema(node: dict[str, Any], name: str) -> dict[str, Any]:
    return node["additionalProperties"] if name == MAP_VALUE else node["properties"][name]


def node_at(node: dict[str, Any], at: FieldPath) -> dict[str, Any]:
    for part in at:
        node = resolved(node)
        node = node["items"] if isinstance(part, int) else child_schema(node, part)
    return resolved(node)


def values(node: dict[str, Any]) -> list[str]:
    """An enum's values as a refusal lists them: "" is never one."""
    return [value for value in node["enum"] if value != ""]


def placeholder(node: dict[str, Any]) -> Any:
    """A valid value of `node`, as small as its schema allows."""
    node = resolved(node)
    if "enum" in node:
        return values(node)[0]
    if "anyOf" in node:  # int-or-string, quantity
        return 1
    kind = node.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        return {name: placeholder(node["properties"][name]) for name in node.get("required", ())}
    return {"array": [], "string": "x", "integer": 1, "number": 1, "boolean": False}[kind]


def built(node: dict[str, Any], at: FieldPath, value: Any) -> Any:
    """The smallest valid value of `node` holding `value` at `at`: every object on the way gets
    its required fields."""
    node = resolved(node)
    if not at:
        return value
    head, rest = at[0], at[1:]
    if isinstance(head, int):
        return [built(node["items"], rest, value)]
    required = {name: placeholder(node["properties"][name]) for name in node.get("required", ()) if name != head}
    return {**required, head: built(child_schema(node, head), rest, value)}


def extra_pod_spec(at: FieldPath, value: Any) -> dict[str, Any]:
    """An extraPodSpec with `value` at `at`: nothing at the pod level is required of it (the
    rendered pod completes it)."""
    return {at[0]: built(POD_SPEC["properties"][at[0]], at[1:], value)}


def not_one_of(node: dict[str, Any]) -> str:
    """What a refusal of BOGUS for the enum `node` says."""
    return f"must be one of {', '.join(values(node))} (not {BOGUS!r})"


@pytest.fixture(scope="module")
def converged(hooks: HookClient) -> Metacontroller:
    mc = Metacontroller(hooks, parent(PD))
    mc.converge()
    return mc


def on_decode(pod_spec: dict[str, Any]) -> Any:
    return lambda spec: spec["services"]["decode"].update(extraPodSpec=pod_spec)


# Every one can be set through extraPodSpec: its check takes all of PodSpec's and Container's fields.
POD_SPEC_ENUMS = sorted(enum_paths(POD_SPEC), key=str)


def test_the_pod_spec_has_enums_to_check() -> None:
    assert len(POD_SPEC_ENUMS) > 50, POD_SPEC_ENUMS
    assert ("containers", 0, "imagePullPolicy") in POD_SPEC_ENUMS and ("dnsPolicy",) in POD_SPEC_ENUMS


@pytest.mark.parametrize("at", POD_SPEC_ENUMS, ids=path)
def test_every_pod_spec_enum_refuses_a_value_it_lacks(converged: Metacontroller, at: FieldPath) -> None:
    # The same structure with a valid value is a valid pod: only the value is refused.
    valid = extra_pod_spec(at, values(node_at(POD_SPEC, at))[0])
    assert problem("PodTemplateSpec", {"spec": {"containers": [{"name": "main"}], **valid}}) is None
    message = converged.refusal(on_decode(extra_pod_spec(at, BOGUS)))
    assert message == f"spec.services.decode.extraPodSpec.{path(at)}: {not_one_of(node_at(POD_SPEC, at))}"


def test_a_value_the_api_server_lacks_fails_the_sync_naming_its_field(converged: Metacontroller) -> None:
    message = converged.refusal(on_decode({"containers": [{"name": "main", "imagePullPolicy": "Sometimes"}]}))
    assert message == (
        "spec.services.decode.extraPodSpec.containers[0].imagePullPolicy: must be one of Always, IfNotPresent, Never "
        "(not 'Sometimes')"
    )
    message = converged.refusal(on_decode({"dnsPolicy": "Whatever"}))
    assert message == (
        "spec.services.decode.extraPodSpec.dnsPolicy: must be one of ClusterFirst, ClusterFirstWithHostNet, Default, "
        "None (not 'Whatever')"
    )


def decode_pod(hooks: HookClient, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The decode Deployment's pod spec for this extraPodSpec; asserts the spec is accepted."""
    obj = parent(PD)
    on_decode(pod_spec)(obj["spec"])
    answer = hooks.sync(obj)
    assert answer["status"]["state"] != "failed", answer["status"]["message"]
    return children_by_key(answer)[("Deployment", "qwen-pd-decode")]["spec"]["template"]["spec"]


# The API server cannot tell "" from an absent field here: defaulting fills it (or, for a
# toleration's effect, it means every effect).
EMPTY_ENUM_VALUES = {
    "imagePullPolicy": (
        {"containers": [{"name": "main", "imagePullPolicy": ""}]},
        ("containers", 0, "imagePullPolicy"),
    ),
    "dnsPolicy": ({"dnsPolicy": ""}, ("dnsPolicy",)),
    "toleration effect": (
        {"tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": ""}]},
        ("tolerations", 0, "effect"),
    ),
    "port protocol": (
        {"containers": [{"name": "main", "ports": [{"containerPort": 9000, "protocol": ""}]}]},
        ("containers", 0, "ports", 0, "protocol"),
    ),
    "pod restartPolicy": ({"restartPolicy": ""}, ("restartPolicy",)),
}


def value_at(obj: Any, at: FieldPath) -> Any:
    for part in at:
        obj = obj[part]
    return obj


@pytest.mark.parametrize("case", EMPTY_ENUM_VALUES)
def test_an_empty_value_of_an_enforced_enum_is_no_refusal(hooks: HookClient, case: str) -> None:
    pod_spec, at = EMPTY_ENUM_VALUES[case]
    bogus = copy.deepcopy(pod_spec)
    value_at(bogus, at[:-1])[at[-1]] = BOGUS
    assert problem("PartialPodSpec", bogus) == (path(at), not_one_of(node_at(POD_SPEC, at)))
    assert value_at(decode_pod(hooks, pod_spec), at) == ""


def every_value(base: dict[str, Any], at: FieldPath) -> list[tuple[dict[str, Any], FieldPath]]:
    """The valid extraPodSpec `base` with each value of the enum at `at`."""
    cases = []
    for value in values(node_at(POD_SPEC, at)):
        pod_spec = copy.deepcopy(base)
        value_at(pod_spec, at[:-1])[at[-1]] = value
        cases.append((pod_spec, at))
    return cases


ACCEPTED = [
    *every_value({"containers": [{"name": "main"}]}, ("containers", 0, "imagePullPolicy")),
    # dnsPolicy None takes its nameservers from dnsConfig.
    *every_value({"dnsConfig": {"nameservers": ["10.96.0.10"]}}, ("dnsPolicy",)),
    *every_value({"tolerations": [{"key": "amd.com/gpu", "operator": "Exists"}]}, ("tolerations", 0, "effect")),
]


@pytest.mark.parametrize(("pod_spec", "at"), ACCEPTED, ids=lambda case: json.dumps(case, separators=(",", ":")))
def test_every_value_of_an_enum_is_accepted(hooks: HookClient, pod_spec: dict[str, Any], at: FieldPath) -> None:
    assert value_at(decode_pod(hooks, pod_spec), at) == value_at(pod_spec, at)


# A patch that changes them is refused before any schema check (a patch must keep the child's identity).
IDENTITY = {("apiVersion",), ("kind",)}


def pointer(at: FieldPath) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in at)


def operation_setting(child: dict[str, Any], schema: dict[str, Any], at: FieldPath, value: Any) -> dict[str, Any]:
    """The JSON patch operation that sets `value` at `at` in `child`, adding what is missing."""
    node: Any = child
    for depth, part in enumerate(at):
        if part not in (range(len(node)) if isinstance(node, list) else node):
            below = at[: depth + 1]
            return {"op": "add", "path": pointer(below), "value": built(node_at(schema, below), at[depth + 1 :], value)}
        node = node[part]
    return {"op": "replace", "path": pointer(at), "value": value}


def patched(kind: str, name: str, *operations: dict[str, Any]) -> Any:
    return lambda spec: spec.update(patches=[{"target": {"kind": kind, "name": name}, "patch": list(operations)}])


def test_every_enum_of_a_rendered_core_kind_refuses_a_value_it_lacks_through_patches(converged: Metacontroller) -> None:
    """One child of each kind the PD graph renders. Its pod template's PodSpec is the one the
    extraPodSpec test walks; a status (the child's, or a claim template's) is not the spec's to set."""
    rendered = children_by_key(converged.last_answer)
    first_of_kind: dict[str, str] = {}
    for kind, name in sorted(rendered):
        first_of_kind.setdefault(kind, name)
    checked, wrong = [], []
    for kind, name in sorted(first_of_kind.items()):
        if kind not in SHIPPED["roots"]:
            continue
        schema = DEFINITIONS[SHIPPED["roots"][kind]]
        for at in enum_paths(schema):
            if at in IDENTITY or "status" in at or at[:3] == ("spec", "template", "spec"):
                continue
            operation = operation_setting(rendered[(kind, name)], schema, at, BOGUS)
            message = converged.refusal(patched(kind, name, operation))
            expected = f"patches[0] ({kind} {name}): the API server would refuse the patched {kind}: "
            expected += f"{path(at)}: {not_one_of(node_at(schema, at))}"
            checked.append(f"{kind} {path(at)}")
            if message != expected:
                wrong.append((message, expected))
    assert wrong == [], "\n".join(map(str, wrong))
    assert {"Deployment spec.strategy.type", "Service spec.type", "Service spec.ports[0].protocol"} <= set(checked)


def test_a_patched_service_type_the_api_server_lacks_fails_the_sync_naming_patch_and_field(
    converged: Metacontroller,
) -> None:
    message = converged.refusal(
        patched("Service", "qwen-pd-server", {"op": "add", "path": "/spec/type", "value": "Bogus"})
    )
    assert message == (
        "patches[0] (Service qwen-pd-server): the API server would refuse the patched Service: spec.type: must be one "
        "of ClusterIP, ExternalName, LoadBalancer, NodePort (not 'Bogus')"
    )
    message = converged.refusal(
        patched("Deployment", "qwen-pd-decode", {"op": "replace", "path": "/spec/strategy/type", "value": "Rolling"})
    )
    assert message == (
        "patches[0] (Deployment qwen-pd-decode): the API server would refuse the patched Deployment: "
        "spec.strategy.type: must be one of Recreate, RollingUpdate (not 'Rolling')"
    )


def test_an_empty_service_port_protocol_is_no_refusal(hooks: HookClient) -> None:
    obj = parent(PD)
    patched("Service", "qwen-pd-server", {"op": "replace", "path": "/spec/ports/0/protocol", "value": ""})(obj["spec"])
    answer = hooks.sync(obj)
    assert answer["status"]["state"] != "failed", answer["status"]["message"]
    assert children_by_key(answer)[("Service", "qwen-pd-server")]["spec"]["ports"][0]["protocol"] == ""


# --- What a value requires elsewhere ------------------------------------------------------------

EPS = "spec.services.decode.extraPodSpec: the API server would refuse Deployment qwen-pd-decode made from it: "
POD = EPS + "spec.template.spec."
SIDECAR_PROBE = {"readinessProbe": {"exec": {"command": ["true"]}}}
GPU_TAINT = {"key": "amd.com/gpu", "operator": "Exists"}
ON_DELETE_ROLLING = {"type": "OnDelete", "rollingUpdate": {"partition": 0}}
# A refused spec, what the refusal says, and the spec that fixes it.
CONTEXTUAL = {
    "restartPolicy on a regular container": (
        on_decode({"containers": [{"name": "main", "restartPolicy": "Always"}]}),
        POD + "containers[0].restartPolicy: may only be set on an init container",
        on_decode({"initContainers": [{"name": "proxy", "image": "busybox", "restartPolicy": "Always"}]}),
    ),
    "an init container's restartPolicy other than Always": (
        on_decode({"initContainers": [{"name": "proxy", "image": "busybox", "restartPolicy": "OnFailure"}]}),
        POD + "initContainers[0].restartPolicy: 'OnFailure': an init container's restartPolicy may only be Always",
        on_decode({"initContainers": [{"name": "proxy", "image": "busybox", "restartPolicy": "Always"}]}),
    ),
    "a probe on an init container that is not a sidecar": (
        on_decode({"initContainers": [{"name": "proxy", "image": "busybox", **SIDECAR_PROBE}]}),
        POD + "initContainers[0].readinessProbe: may not be set on an init container without restartPolicy Always",
        on_decode(
            {"initContainers": [{"name": "proxy", "image": "busybox", "restartPolicy": "Always", **SIDECAR_PROBE}]}
        ),
    ),
    "dnsPolicy None without nameservers": (
        on_decode({"dnsPolicy": "None"}),
        POD + "dnsConfig.nameservers: at least one is required when dnsPolicy is None",
        on_decode({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["10.96.0.10"]}}),
    ),
    "a toleration without key or Exists": (
        on_decode({"tolerations": [{"operator": "Equal", "value": "x"}]}),
        POD + "tolerations[0].operator: must be Exists when key is empty (which tolerates every taint)",
        on_decode({"tolerations": [{"operator": "Exists"}]}),
    ),
    "a toleration that is Exists with a value": (
        on_decode({"tolerations": [{**GPU_TAINT, "value": "present"}]}),
        POD + "tolerations[0].value: must be empty when operator is Exists",
        on_decode({"tolerations": [{**GPU_TAINT, "operator": "Equal", "value": "present"}]}),
    ),
    "tolerationSeconds without NoExecute": (
        on_decode({"tolerations": [{**GPU_TAINT, "effect": "NoSchedule", "tolerationSeconds": 60}]}),
        POD + "tolerations[0].effect: must be NoExecute when tolerationSeconds is set",
        on_decode({"tolerations": [{**GPU_TAINT, "effect": "NoExecute", "tolerationSeconds": 60}]}),
    ),
    "a Localhost seccomp profile without its file": (
        on_decode({"securityContext": {"seccompProfile": {"type": "Localhost"}}}),
        POD + "securityContext.seccompProfile.localhostProfile: must be set when type is Localhost",
        on_decode({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "infera.json"}}}),
    ),
    "an AppArmor profile file without Localhost": (
        on_decode(
            {
                "containers": [
                    {
                        "name": "main",
                        "securityContext": {
                            "appArmorProfile": {"type": "RuntimeDefault", "localhostProfile": "infera"}
                        },
                    }
                ]
            }
        ),
        POD + "containers[0].securityContext.appArmorProfile.localhostProfile: may only be set when type is Localhost",
        on_decode(
            {
                "containers": [
                    {
                        "name": "main",
                        "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "infera"}},
                    }
                ]
            }
        ),
    ),
    "a patch to Recreate that keeps the rendered rollingUpdate": (
        patched("Deployment", "qwen-pd-decode", {"op": "replace", "path": "/spec/strategy/type", "value": "Recreate"}),
        "patches[0] (Deployment qwen-pd-decode): the API server would refuse the patched Deployment: "
        "spec.strategy.rollingUpdate: may not be set when spec.strategy.type is Recreate: remove it with the same patch",
        patched(
            "Deployment", "qwen-pd-decode", {"op": "replace", "path": "/spec/strategy", "value": {"type": "Recreate"}}
        ),
    ),
    "a patched StatefulSet that is OnDelete with a rollingUpdate": (
        patched(
            "StatefulSet", "qwen-pd-nats", {"op": "add", "path": "/spec/updateStrategy", "value": ON_DELETE_ROLLING}
        ),
        "patches[0] (StatefulSet qwen-pd-nats): the API server would refuse the patched StatefulSet: "
        "spec.updateStrategy.rollingUpdate: may not be set when spec.updateStrategy.type is OnDelete: remove it with "
        "the same patch",
        patched(
            "StatefulSet", "qwen-pd-nats", {"op": "add", "path": "/spec/updateStrategy", "value": {"type": "OnDelete"}}
        ),
    ),
}


@pytest.mark.parametrize("case", CONTEXTUAL)
def test_what_a_value_requires_elsewhere_is_checked_and_its_fix_accepted(
    converged: Metacontroller, hooks: HookClient, case: str
) -> None:
    refused, message, fixed = CONTEXTUAL[case]
    assert converged.refusal(refused) == message
    obj = parent(PD)
    fixed(obj["spec"])
    status = hooks.sync(obj)["status"]
    assert status["state"] != "failed", status["message"]


# --- The generator ----------------------------------------------------------------------------

# Made-up definitions in the shape openapi-gen writes (zz_generated.openapi.go).
GENERATED = """
package openapi

func GetOpenAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	return map[string]common.OpenAPIDefinition{
		"example.com/widgets/v1.Widget": schema_example_com_widgets_v1_Widget(ref),
		"example.com/widgets/v1.Plain":  schema_example_com_widgets_v1_Plain(ref),
	}
}

func schema_example_com_widgets_v1_Widget(ref common.ReferenceCallback) common.OpenAPIDefinition {
	return common.OpenAPIDefinition{
		Schema: spec.Schema{
			SchemaProps: spec.SchemaProps{
				Description: "A widget. Braces { and keys Enum: in a description are text.",
				Type:        []string{"object"},
				Properties: map[string]spec.Schema{
					"color": {
						SchemaProps: spec.SchemaProps{
							Description: "Possible enum values:\n - `\"Red\"` is red",
							Default:     "",
							Type:        []string{"string"},
							Enum:        []interface{}{"Blue", "Red"},
						},
					},
					"sizes": {
						VendorExtensible: spec.VendorExtensible{
							Extensions: spec.Extensions{
								"x-kubernetes-list-type": "atomic",
							},
						},
						SchemaProps: spec.SchemaProps{
							Type: []string{"array"},
							Items: &spec.SchemaOrArray{
								Schema: &spec.Schema{
									SchemaProps: spec.SchemaProps{
										Type: []string{"string"},
										Enum: []interface{}{"", "L", "S"},
									},
								},
							},
						},
					},
					"labels": {
						SchemaProps: spec.SchemaProps{
							AdditionalProperties: &spec.SchemaOrBool{
								Allows: true,
								Schema: &spec.Schema{
									SchemaProps: spec.SchemaProps{
										Default: map[string]interface{}{},
										Enum:    []interface{}{`x`},
									},
								},
							},
						},
					},
				},
				Required: []string{"color"},
			},
		},
		Dependencies: []string{
			"example.com/widgets/v1.Plain"},
	}
}

func schema_example_com_widgets_v1_Plain(ref common.ReferenceCallback) common.OpenAPIDefinition {
	return common.OpenAPIDefinition{
		Schema: spec.Schema{
			SchemaProps: spec.SchemaProps{
				Type: []string{"object"},
			},
		},
	}
}
"""


def test_the_generator_reads_enums_of_properties_items_and_map_values() -> None:
    assert openapi_enums(GENERATED) == {
        "com.example.widgets.v1.Widget": {
            ("properties", "color"): ["Blue", "Red"],
            ("properties", "sizes", "items"): ["", "L", "S"],
            ("properties", "labels", "additionalProperties"): ["x"],
        },
        "com.example.widgets.v1.Plain": {},
    }


UNEXPECTED_SHAPES = {
    "an enum of numbers": (
        GENERATED.replace('{"Blue", "Red"}', "{1, 2}"),
        "an Enum in schema_example_com_widgets_v1_Widget holds 1, not only strings",
    ),
    "an enum in a place the reader does not know": (
        GENERATED.replace("Items: &spec.SchemaOrArray{", "AllOf: &spec.SchemaOrArray{"),
        "an Enum in schema_example_com_widgets_v1_Widget at [None, 'Schema', 'SchemaProps', 'Properties', 'sizes', "
        "'SchemaProps', 'AllOf', 'Schema', 'SchemaProps'], a place this reader does not know",
    ),
    "no map of definitions": (
        GENERATED.replace("GetOpenAPIDefinitions", "Definitions"),
        "read 0 definition names and 3 of the 3 Enums it declares: its shape is not what this reader expects",
    ),
    "no enums": (
        GENERATED.replace("Enum:", "Values:"),
        "read 2 definition names and 0 of the 0 Enums it declares: its shape is not what this reader expects",
    ),
    "an Enum line the reader does not see as one": (
        GENERATED.replace(
            '"A widget. Braces { and keys Enum: in a description are text."', "`A widget.\nEnum: a line`"
        ),
        "read 2 definition names and 3 of the 4 Enums it declares: its shape is not what this reader expects",
    ),
    "a definition the map does not name": (
        GENERATED.replace('"example.com/widgets/v1.Widget": schema_example_com_widgets_v1_Widget(ref),', ""),
        "GetOpenAPIDefinitions names no type for schema_example_com_widgets_v1_Widget",
    ),
}


@pytest.mark.parametrize("case", UNEXPECTED_SHAPES)
def test_the_generator_fails_naming_what_it_did_not_find(case: str) -> None:
    source, message = UNEXPECTED_SHAPES[case]
    with pytest.raises(ValueError) as error:
        openapi_enums(source)
    assert str(error.value) == f"pkg/generated/openapi/zz_generated.openapi.go: {message}"
