"""The API server's rules for a pod template and the objects' metadata that its schema cannot
say (names, ports, volumes, resource quantities, what one field requires of another), for the
children a free-form spec field or a patch shaped (hooks/admission.py)."""

import re
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

from hooks.contract import is_string_map
from hooks.kubernetes_names import (
    MAX_ANNOTATIONS_BYTES,
    QUALIFIED_NAME,
    annotations_bytes,
    env_name_problem,
    is_extended_resource,
    label_value_valid,
    qualified_key_problem,
    shown,
)
from hooks.kubernetes_schema import Problem
from hooks.quantity import quantity_value

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
# What only an init container whose restartPolicy is Always (a sidecar) may set.
SIDECAR_FIELDS = ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe")
# Resource names the API server knows without a domain prefix.
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def metadata_problems(metadata: Any, where: str) -> Iterator[Problem]:
    """Labels and annotations (of any kind: custom kinds get no schema check)."""
    if not isinstance(metadata, dict):
        yield where, "must be an object"
        return
    for field in ("labels", "annotations"):
        if not is_string_map(metadata.get(field)):
            yield f"{where}.{field}", "must be an object of strings"
            return
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    for key, value in labels.items():
        if problem := qualified_key_problem(key):
            yield f"{where}.labels", problem
        if not label_value_valid(value):
            yield (
                f"{where}.labels.{key}",
                f"{shown(value)} is not a valid label value (at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends)",
            )
    for key in annotations:
        if problem := qualified_key_problem(key):
            yield f"{where}.annotations", problem
    size = annotations_bytes(annotations)
    if size > MAX_ANNOTATIONS_BYTES:
        yield (
            f"{where}.annotations",
            f"{size:,} bytes of annotations; the API server allows at most {MAX_ANNOTATIONS_BYTES:,}",
        )


def port_name_problem(name: str) -> str | None:
    """IANA service names: what a container port or a Service targetPort may be called."""
    if 1 <= len(name) <= 15 and DNS1123_LABEL.fullmatch(name) and "--" not in name and re.search("[a-z]", name):
        return None
    return f"{shown(name)} is not a valid port name (at most 15 lower-case letters, digits and '-', with a letter, no '--')"


def quantity_or_none(value: Any) -> Fraction | None:
    try:
        return quantity_value(str(value))
    except ValueError:
        return None


def _resources_problems(requirements: dict, where: str) -> Iterator[Problem]:
    requests, limits = requirements.get("requests") or {}, requirements.get("limits") or {}
    for bound, quantities in (("requests", requests), ("limits", limits)):
        for name, value in quantities.items():
            if not (
                name in STANDARD_RESOURCES
                or name.startswith("hugepages-")
                or ("/" in name and QUALIFIED_NAME.fullmatch(name))
            ):
                yield (
                    f"{where}.{bound}",
                    f"{shown(name)} is not a resource name (cpu, memory, ephemeral-storage, hugepages-<size> or a domain-prefixed name such as amd.com/gpu)",
                )
            elif quantity_or_none(value) is None:
                yield f"{where}.{bound}.{name}", f"{shown(value)} is not a Kubernetes quantity"
    for name in sorted(set(requests) & set(limits)):
        request, limit = quantity_or_none(requests[name]), quantity_or_none(limits[name])
        if request is None or limit is None:
            continue
        if is_extended_resource(name) and request != limit:
            yield f"{where}.requests.{name}", f"must equal the limit ({limits[name]}): {name} cannot be overcommitted"
        elif request > limit:
            yield f"{where}.requests.{name}", f"must not exceed the limit ({limits[name]})"
    for name in sorted(set(requests) - set(limits)):
        if is_extended_resource(name):
            yield f"{where}.limits", f"{name} is requested but has no limit: it cannot be overcommitted"


def _container_problems(container: dict, where: str, volumes: set[str]) -> Iterator[Problem]:
    image = container.get("image")
    if not image or image != image.strip():
        yield (
            f"{where}.image",
            "an image is required, without leading or trailing whitespace: its pods could not be created",
        )
    names: set[str] = set()
    for index, port in enumerate(container.get("ports") or []):
        at = f"{where}.ports[{index}]"
        if not 1 <= port["containerPort"] <= 65535:
            yield f"{at}.containerPort", f"{port['containerPort']} is not a port number (1-65535)"
        if port.get("hostPort") and not 1 <= port["hostPort"] <= 65535:
            yield f"{at}.hostPort", f"{port['hostPort']} is not a port number (1-65535)"
        if port.get("name"):
            if problem := port_name_problem(port["name"]):
                yield f"{at}.name", problem
            elif port["name"] in names:
                yield f"{at}.name", f"{shown(port['name'])} names two ports"
            names.add(port["name"])
    for index, var in enumerate(container.get("env") or []):
        at = f"{where}.env[{index}]"
        if problem := env_name_problem(var["name"]):
            yield f"{at}.name", problem
        source = var.get("valueFrom")
        if source is not None:
            if var.get("value"):
                yield f"{at}.valueFrom", "may not be set together with value"
            if sum(1 for key in ENV_SOURCES if source.get(key) is not None) != 1:
                yield f"{at}.valueFrom", f"must set exactly one of {', '.join(ENV_SOURCES)}"
    paths: set[str] = set()
    for index, mount in enumerate(container.get("volumeMounts") or []):
        at = f"{where}.volumeMounts[{index}]"
        if mount["name"] not in volumes:
            yield f"{at}.name", f"no volume named {shown(mount['name'])} in the pod"
        if not mount["mountPath"] or mount["mountPath"] in paths:
            yield f"{at}.mountPath", f"{shown(mount['mountPath'])} must be set and mounted once per container"
        paths.add(mount["mountPath"])
    yield from _resources_problems(container.get("resources") or {}, f"{where}.resources")


def _restart_policy_problems(container: dict, kind: str, where: str) -> Iterator[Problem]:
    """Kubernetes 1.33: only an init container takes a restartPolicy, and only Always. The field
    is a pointer, so the API server refuses "" too."""
    policy = container.get("restartPolicy")
    if kind == "containers" and policy is not None:
        yield f"{where}.restartPolicy", "may only be set on an init container"
    elif kind == "initContainers" and policy not in (None, "Always"):
        yield f"{where}.restartPolicy", f"{shown(policy)}: an init container's restartPolicy may only be Always"
    elif kind == "initContainers" and policy is None:
        for field in SIDECAR_FIELDS:
            if container.get(field) is not None:
                yield f"{where}.{field}", "may not be set on an init container without restartPolicy Always"


def _profile_problems(security_context: dict | None, where: str) -> Iterator[Problem]:
    """A Localhost seccomp or AppArmor profile names its file; the other types take none."""
    for field in ("seccompProfile", "appArmorProfile"):
        profile = (security_context or {}).get(field) or {}
        localhost = profile.get("localhostProfile") is not None
        if profile.get("type") == "Localhost" and not localhost:
            yield f"{where}.{field}.localhostProfile", "must be set when type is Localhost"
        elif profile.get("type") != "Localhost" and localhost:
            yield f"{where}.{field}.localhostProfile", "may only be set when type is Localhost"


def _toleration_problems(toleration: dict | None, where: str) -> Iterator[Problem]:
    toleration = toleration or {}  # the API server reads a null item as an empty toleration
    operator = toleration.get("operator")
    if not toleration.get("key") and operator != "Exists":
        yield f"{where}.operator", "must be Exists when key is empty (which tolerates every taint)"
    if operator == "Exists" and toleration.get("value"):
        yield f"{where}.value", "must be empty when operator is Exists"
    if toleration.get("tolerationSeconds") is not None and toleration.get("effect") != "NoExecute":
        yield f"{where}.effect", "must be NoExecute when tolerationSeconds is set"


def pod_problems(template: dict, where: str, claims: frozenset[str] = frozenset()) -> Iterator[Problem]:
    """`claims`: the volumes a StatefulSet adds to its pods, one per claim template."""
    yield from metadata_problems(template.get("metadata"), f"{where}.metadata")
    spec = template.get("spec") or {}
    at = f"{where}.spec"
    if spec.get("restartPolicy") not in (None, "", "Always"):  # "" is defaulted to Always
        yield f"{at}.restartPolicy", f"{shown(spec['restartPolicy'])}: a workload's pods must use Always"
    if spec.get("dnsPolicy") == "None" and not (spec.get("dnsConfig") or {}).get("nameservers"):
        yield f"{at}.dnsConfig.nameservers", "at least one is required when dnsPolicy is None"
    for index, toleration in enumerate(spec.get("tolerations") or []):
        yield from _toleration_problems(toleration, f"{at}.tolerations[{index}]")
    yield from _profile_problems(spec.get("securityContext"), f"{at}.securityContext")
    volumes: set[str] = set()
    for index, volume in enumerate(spec.get("volumes") or []):
        name = volume["name"]
        if not DNS1123_LABEL.fullmatch(name) or len(name) > 63:
            yield f"{at}.volumes[{index}].name", f"{shown(name)} is not a DNS label"
        elif name in volumes:
            yield f"{at}.volumes[{index}].name", f"{shown(name)} names two volumes"
        if sum(1 for key, value in volume.items() if key != "name" and value is not None) != 1:
            yield (
                f"{at}.volumes[{index}]",
                "must set exactly one volume source (emptyDir, configMap, persistentVolumeClaim, ...)",
            )
        volumes.add(name)
    if not spec.get("containers"):
        yield f"{at}.containers", "at least one container is required"
    mountable = volumes | claims
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or []):
            name = container["name"]
            if not DNS1123_LABEL.fullmatch(name) or len(name) > 63:
                yield f"{at}.{kind}[{index}].name", f"{shown(name)} is not a DNS label"
            elif name in names:
                yield f"{at}.{kind}[{index}].name", f"{shown(name)} names two containers"
            names.add(name)
            yield from _restart_policy_problems(container, kind, f"{at}.{kind}[{index}]")
            yield from _profile_problems(container.get("securityContext"), f"{at}.{kind}[{index}].securityContext")
            yield from _container_problems(container, f"{at}.{kind}[{index}]", mountable)


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (matchLabels and matchExpressions) selects `labels`."""
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True
