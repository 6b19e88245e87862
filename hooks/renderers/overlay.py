"""extraPodSpec: the user's PodSpec laid over the pod the operator renders from the flat fields.

One rule serves both ways of writing it. A full template (the upstream operator's way) sets the
primary container's command, image, env and resources, so those are the user's; a partial
overlay sets only pod-level fields or a few container fields and gets the rest from the flat
fields. The primary container is the one named `main` or `infera`, else the first.

| what | result |
|---|---|
| pod-level fields (nodeSelector, affinity, tolerations, hostNetwork, initContainers, ...) | the template's |
| volumes, containers | merged by name; the template wins on a clash |
| primary container fields (command, args, image, probes, ...) | the template's where set |
| its env, volumeMounts, ports | merged by name, mountPath, containerPort; the template wins |
| its resources, securityContext | merged key by key; the template wins (an extended resource such as a GPU gets one value for request and limit) |
| serviceAccountName | the template's, else the discovery account |

The worker's probes, preStop delay and grace period are then added where the result lacks them
(pods.pod_template), so a template's own always wins.
"""

import copy
from typing import Any

from hooks import kubernetes_schema
from hooks.api.fields import SpecError, primary_index
from hooks.kubernetes_names import is_extended_resource
from hooks.quantity import canonical_quantity

# Merged key by key rather than replaced (a probe is replaced whole: mixing handlers is invalid).
DEEP_MERGED = ("resources", "securityContext")

# The fields of PodSpec and Container in Kubernetes 1.33. The API server drops a field it does not
# know, so Metacontroller would re-apply it on every sync: such a template is refused instead
# (a field of a newer release can still be set with spec.patches).
POD_FIELDS = frozenset(
    {
        "activeDeadlineSeconds",
        "affinity",
        "automountServiceAccountToken",
        "containers",
        "dnsConfig",
        "dnsPolicy",
        "enableServiceLinks",
        "ephemeralContainers",
        "hostAliases",
        "hostIPC",
        "hostNetwork",
        "hostPID",
        "hostUsers",
        "hostname",
        "imagePullSecrets",
        "initContainers",
        "nodeName",
        "nodeSelector",
        "os",
        "overhead",
        "preemptionPolicy",
        "priority",
        "priorityClassName",
        "readinessGates",
        "resourceClaims",
        "resources",
        "restartPolicy",
        "runtimeClassName",
        "schedulerName",
        "schedulingGates",
        "securityContext",
        "serviceAccount",
        "serviceAccountName",
        "setHostnameAsFQDN",
        "shareProcessNamespace",
        "subdomain",
        "terminationGracePeriodSeconds",
        "tolerations",
        "topologySpreadConstraints",
        "volumes",
    }
)
CONTAINER_FIELDS = frozenset(
    {
        "args",
        "command",
        "env",
        "envFrom",
        "image",
        "imagePullPolicy",
        "lifecycle",
        "livenessProbe",
        "name",
        "ports",
        "readinessProbe",
        "resizePolicy",
        "resources",
        "restartPolicy",
        "securityContext",
        "startupProbe",
        "stdin",
        "stdinOnce",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "tty",
        "volumeDevices",
        "volumeMounts",
        "workingDir",
    }
)


def _known_fields(obj: dict, fields: frozenset[str], kind: str, where: str) -> dict:
    """`obj` without null fields (the API server stores them as absent), refusing unknown ones."""
    unknown = sorted(key for key in obj if key not in fields)
    if unknown:
        raise SpecError(
            f"{where}: {', '.join(map(repr, unknown))} {'is not a field' if len(unknown) == 1 else 'are not fields'} "
            f"of a Kubernetes {kind} (as of 1.33; set a newer field with spec.patches)"
        )
    return {key: value for key, value in obj.items() if value is not None}


def _named(items: list[dict], where: str, unnamed: int | None = None) -> list[dict]:
    """Every item has a name (but the one at `unnamed`, which may take the operator's)."""
    for index, item in enumerate(items):
        if index != unnamed and (not isinstance(item.get("name"), str) or not item["name"]):
            raise SpecError(f"{where}[{index}] needs a name")
    return items


def _string_value(var: dict) -> dict:
    """YAML reads `value: 8` as a number; whoever wrote it meant the string."""
    value = var.get("value")
    return {**var, "value": str(value)} if isinstance(value, int | float) and not isinstance(value, bool) else var


def checked_template(extra: dict, where: str) -> dict:
    """The template's pod and container fields as the API server would keep them."""
    template = _known_fields(extra, POD_FIELDS, "PodSpec", where)
    for kind in ("containers", "initContainers"):
        if kind in template:
            containers = _objects(template[kind], f"{where}.{kind}")
            _named(containers, f"{where}.{kind}", primary_index(containers) if kind == "containers" else None)
            template[kind] = [
                _known_fields(container, CONTAINER_FIELDS, "Container", f"{where}.{kind}[{index}]")
                for index, container in enumerate(containers)
            ]
            for index, container in enumerate(template[kind]):
                if "env" in container:
                    env = _objects(container["env"], f"{where}.{kind}[{index}].env")
                    container["env"] = [_string_value(var) for var in env]
    if "volumes" in template:
        _named(_objects(template["volumes"], f"{where}.volumes"), f"{where}.volumes")
    # Every value its type before anything is merged (nothing is required yet: the rendered pod
    # completes the template, and admission checks the whole child).
    problem = kubernetes_schema.problem("PartialPodSpec", template)
    if problem is not None:
        raise SpecError(f"{where}.{problem[0]}: {problem[1]}")
    return template


def _deep_merge(base: Any, top: Any) -> Any:
    if isinstance(base, dict) and isinstance(top, dict):
        return {**base, **{key: _deep_merge(base.get(key), value) for key, value in top.items()}}
    return copy.deepcopy(top)


def _merge_list(base: list[dict], top: list[dict], *keys: str) -> list[dict]:
    """The template's items in its order, then the operator's items whose keys it does not use."""
    taken = {(key, item.get(key)) for item in top for key in keys if key in item}
    return copy.deepcopy(top) + [item for item in base if not any((key, item.get(key)) in taken for key in keys)]


def _objects(value: Any, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise SpecError(f"{where} must be a list of objects")
    return value


def _merge_container(operator: dict, template: dict, where: str) -> dict:
    merged = copy.deepcopy(operator)
    for key, value in template.items():
        if key == "env":
            merged[key] = _merge_list(operator.get(key, []), _objects(value, f"{where}.env"), "name")
        elif key == "volumeMounts":
            merged[key] = _merge_list(operator.get(key, []), _objects(value, f"{where}.volumeMounts"), "mountPath")
        elif key == "ports":
            merged[key] = _merge_list(operator.get(key, []), _objects(value, f"{where}.ports"), "containerPort", "name")
        elif key in DEEP_MERGED:
            merged[key] = _deep_merge(operator.get(key), value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _one_value_per_extended_resource(resources: dict, template: dict) -> None:
    """Kubernetes requires request == limit for extended resources (GPUs, RDMA devices): the
    template's value, limit first, is used for both."""
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    chosen = {**(template.get("requests") or {}), **(template.get("limits") or {})}
    for name in set(requests) | set(limits):
        if is_extended_resource(name):
            value = chosen.get(name, limits.get(name, requests.get(name)))
            resources.setdefault("requests", {})[name] = resources.setdefault("limits", {})[name] = value


def overlay(operator: dict, extra: dict, where: str) -> dict:
    """`operator`'s pod spec with the user's `extra` pod spec laid over it."""
    extra = checked_template(extra, where)
    spec = {
        **copy.deepcopy(operator),
        **{k: copy.deepcopy(v) for k, v in extra.items() if k not in ("containers", "volumes")},
    }

    template_containers = _objects(extra.get("containers"), f"{where}.containers")
    containers = copy.deepcopy(template_containers)
    operator_main, *operator_rest = operator["containers"]
    index = primary_index(containers)
    if index is None:
        containers = [copy.deepcopy(operator_main)]
    else:
        template = containers[index]
        containers[index] = _merge_container(operator_main, template, f"{where}.containers[{index}]")
        if isinstance(containers[index].get("resources"), dict):
            _one_value_per_extended_resource(containers[index]["resources"], template.get("resources") or {})
    names = {container.get("name") for container in containers}
    spec["containers"] = containers + [c for c in operator_rest if c["name"] not in names]

    # Operator volumes that no container mounts any more (the template took over /dev/shm) go.
    mounted = {m.get("name") for c in spec["containers"] for m in c.get("volumeMounts", [])}
    template_volumes = _objects(extra.get("volumes"), f"{where}.volumes")
    operator_volumes = [v for v in operator.get("volumes", []) if v["name"] in mounted]
    volumes = _merge_list(operator_volumes, template_volumes, "name")
    if volumes:
        spec["volumes"] = volumes
    else:
        spec.pop("volumes", None)

    return spec


def _canonical(value: Any, where: str) -> str:
    try:
        return canonical_quantity(str(value))
    except ValueError as error:
        raise SpecError(f"{where}: {error}") from None


def normalize(spec: dict, where: str) -> dict:
    """Write what the template says the way the API server stores it (quantities canonical,
    empty env values absent), or it would be re-applied on every sync."""
    for kind in ("containers", "initContainers"):
        for index, container in enumerate(_objects(spec.get(kind), f"{where}.{kind}")):
            for bound in ("requests", "limits"):
                quantities = (container.get("resources") or {}).get(bound) or {}
                for name, value in quantities.items():
                    quantities[name] = _canonical(value, f"{where}.{kind}[{index}].resources.{bound}.{name}")
            for var in _objects(container.get("env"), f"{where}.{kind}[{index}].env"):
                if var.get("value") == "":
                    del var["value"]
    for index, volume in enumerate(_objects(spec.get("volumes"), f"{where}.volumes")):
        empty_dir = volume.get("emptyDir")
        if isinstance(empty_dir, dict) and "sizeLimit" in empty_dir:
            empty_dir["sizeLimit"] = _canonical(empty_dir["sizeLimit"], f"{where}.volumes[{index}].emptyDir.sizeLimit")
    return spec
