"""What the API server would refuse, caught before Metacontroller applies it.

Children rendered from typed fields are valid by construction (the test suite validates every
one against Kubernetes' schemas). Three inputs are free-form: a service's `extraPodSpec`, its
autoscaling metrics and behavior, and `spec.patches`. The children they shape are checked here, against Kubernetes 1.33's schemas
(hooks/kubernetes_schema.py, enums included) and the API server's own rules for what a schema
cannot say (names, ports, selectors, sizes, what a value such as dnsPolicy None requires
elsewhere), so that a bad spec fails in status naming its field instead
of every apply failing where only events show it. They are held to the rules the spec's own
fields are held to as well (_broken_rule): a patch must not get around them.

Custom kinds (LeaderWorkerSet, InferencePool, HTTPRoute) get their pod templates checked; the
rest of a patch on them is left to the API server.
"""

import hashlib
import itertools
import json
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

from hooks import kubernetes_schema
from hooks.api.fields import SpecError, max_unavailable_valid
from hooks.api.graph import InferaDeployment
from hooks.api.rules import READY_TIMEOUT_ENV, UNEVICTABLE, ready_timeout_problem
from hooks.contract import field_at, is_string_map
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
from hooks.observed import POD_TEMPLATE_PATHS, service_of
from hooks.quantity import quantity_value
from hooks.renderers.patches import targeting

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
# What only an init container whose restartPolicy is Always (a sidecar) may set.
SIDECAR_FIELDS = ("lifecycle", "livenessProbe", "readinessProbe", "startupProbe")
# A workload's strategy field, and its type that takes no rollingUpdate.
WITHOUT_ROLLING_UPDATE = {"Deployment": ("strategy", "Recreate"), "StatefulSet": ("updateStrategy", "OnDelete")}
# Resource names the API server knows without a domain prefix.
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _metadata_problems(metadata: Any, where: str) -> Iterator[Problem]:
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


def _port_name_problem(name: str) -> str | None:
    """IANA service names: what a container port or a Service targetPort may be called."""
    if 1 <= len(name) <= 15 and DNS1123_LABEL.fullmatch(name) and "--" not in name and re.search("[a-z]", name):
        return None
    return f"{shown(name)} is not a valid port name (at most 15 lower-case letters, digits and '-', with a letter, no '--')"


def _quantity(value: Any) -> Fraction | None:
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
            elif _quantity(value) is None:
                yield f"{where}.{bound}.{name}", f"{shown(value)} is not a Kubernetes quantity"
    for name in sorted(set(requests) & set(limits)):
        request, limit = _quantity(requests[name]), _quantity(limits[name])
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
            if problem := _port_name_problem(port["name"]):
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


def _pod_problems(template: dict, where: str, claims: frozenset[str] = frozenset()) -> Iterator[Problem]:
    """`claims`: the volumes a StatefulSet adds to its pods, one per claim template."""
    yield from _metadata_problems(template.get("metadata"), f"{where}.metadata")
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


def _selects(selector: dict, labels: dict) -> bool:
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


def _zero(value: Any) -> bool:
    return value in (0, "0%")


def _workload_problems(child: dict) -> Iterator[Problem]:
    spec = child.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    selector = spec.get("selector") or {}
    if child["kind"] in ("Deployment", "StatefulSet"):
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if not (selector.get("matchLabels") or selector.get("matchExpressions")):
            yield "spec.selector", "must select the template's pods"
        elif not _selects(selector, labels):
            yield "spec.template.metadata.labels", "do not match spec.selector"
    if child["kind"] in WITHOUT_ROLLING_UPDATE:
        field, without = WITHOUT_ROLLING_UPDATE[child["kind"]]
        strategy = spec.get(field) or {}
        if strategy.get("type") == without and strategy.get("rollingUpdate") is not None:
            yield (
                f"spec.{field}.rollingUpdate",
                f"may not be set when spec.{field}.type is {without}: remove it with the same patch",
            )
    rolling = field_at(spec, "strategy", "rollingUpdate")
    # Both default to 25% when absent.
    if (
        isinstance(rolling, dict)
        and _zero(rolling.get("maxSurge", "25%"))
        and _zero(rolling.get("maxUnavailable", "25%"))
    ):
        yield "spec.strategy.rollingUpdate.maxUnavailable", "may not be 0 while maxSurge is 0"
    claims = frozenset(field_at(claim, "metadata", "name") for claim in spec.get("volumeClaimTemplates") or ())
    for path in POD_TEMPLATE_PATHS.get(child["kind"], ()):
        template = field_at(child, *path)
        if isinstance(template, dict):
            yield from _pod_problems(template, ".".join(path), claims)


def _service_problems(child: dict) -> Iterator[Problem]:
    ports = (child.get("spec") or {}).get("ports") or []
    names: set[str] = set()
    for index, port in enumerate(ports):
        at = f"spec.ports[{index}]"
        if not 1 <= port["port"] <= 65535:
            yield f"{at}.port", f"{port['port']} is not a port number (1-65535)"
        target = port.get("targetPort")
        if isinstance(target, int) and not 1 <= target <= 65535:
            yield f"{at}.targetPort", f"{target} is not a port number (1-65535)"
        elif isinstance(target, str) and (problem := _port_name_problem(target)):
            yield f"{at}.targetPort", problem
        name = port.get("name")
        if len(ports) > 1 and not name:
            yield f"{at}.name", "every port of a Service with several ports needs a name"
        elif name and name in names:
            yield f"{at}.name", f"{shown(name)} names two ports"
        names.add(name or "")
    for key, value in ((child.get("spec") or {}).get("selector") or {}).items():
        if not label_value_valid(value):
            yield f"spec.selector.{key}", f"{shown(value)} is not a valid label value"


# autoscaling/v2 metric types: the source field each must set alone, and the target types it takes.
METRIC_SOURCES = {
    "Object": ("object", ("Value", "AverageValue")),
    "Pods": ("pods", ("AverageValue",)),
    "Resource": ("resource", ("Utilization", "AverageValue")),
    "ContainerResource": ("containerResource", ("Utilization", "AverageValue")),
    "External": ("external", ("Value", "AverageValue")),
}
TARGET_FIELDS = {"Utilization": "averageUtilization", "Value": "value", "AverageValue": "averageValue"}
SELECT_POLICIES = ("Max", "Min", "Disabled")
SCALING_POLICY_TYPES = ("Pods", "Percent")
MAX_STABILIZATION_SECONDS = 3600
MAX_POLICY_PERIOD_SECONDS = 1800


def _metric_problems(metric: dict, at: str) -> Iterator[Problem]:
    """What the API server's autoscaling validation refuses in a MetricSpec beyond its schema."""
    if metric.get("type") not in METRIC_SOURCES:
        yield f"{at}.type", f"{shown(metric.get('type'))} must be one of {', '.join(METRIC_SOURCES)}"
        return
    field, target_types = METRIC_SOURCES[metric["type"]]
    others = sorted(set(metric) - {"type", field})
    if field not in metric or others:
        yield at, f"a {metric['type']} metric sets {field} and no other source (it sets {', '.join(others) or 'none'})"
        return
    source = metric[field]
    if metric["type"] in ("Resource", "ContainerResource"):
        if not source.get("name"):
            yield f"{at}.{field}.name", "the resource name is required"
    else:
        name = (source.get("metric") or {}).get("name") or ""
        if not name or name in (".", "..") or "/" in name or "%" in name:
            yield f"{at}.{field}.metric.name", f"{shown(name)} is not a metric name (non-empty, no '/' or '%')"
    target = source.get("target") or {}
    if target.get("type") not in target_types:
        yield f"{at}.{field}.target.type", f"must be {' or '.join(target_types)} for a {metric['type']} metric"
        return
    value_field = TARGET_FIELDS[target["type"]]
    value = target.get(value_field)
    amount = None if value is None else value if value_field == "averageUtilization" else _quantity(value)
    if amount is None or amount <= 0:
        yield f"{at}.{field}.target.{value_field}", f"a {target['type']} target needs a positive {value_field}"


def _scaling_rules_problems(rules: dict, at: str) -> Iterator[Problem]:
    window = rules.get("stabilizationWindowSeconds")
    if window is not None and not 0 <= window <= MAX_STABILIZATION_SECONDS:
        yield f"{at}.stabilizationWindowSeconds", f"must be between 0 and {MAX_STABILIZATION_SECONDS}"
    if rules.get("selectPolicy") not in (None, *SELECT_POLICIES):
        yield f"{at}.selectPolicy", f"{shown(rules['selectPolicy'])} must be one of {', '.join(SELECT_POLICIES)}"
    if "tolerance" in rules:
        # Alpha in Kubernetes 1.33 (HPAConfigurableTolerance): a server without the gate drops it,
        # and Metacontroller would write it back on every sync.
        yield f"{at}.tolerance", "needs the HPAConfigurableTolerance feature gate; leave it out"
    policies = rules.get("policies")
    if policies is not None and not policies:
        yield f"{at}.policies", "must list at least one policy (leave the field out for the default)"
    for index, policy in enumerate(policies or []):
        where = f"{at}.policies[{index}]"
        if policy.get("type") not in SCALING_POLICY_TYPES:
            yield f"{where}.type", f"{shown(policy.get('type'))} must be one of {', '.join(SCALING_POLICY_TYPES)}"
        if not policy.get("value", 0) > 0:
            yield f"{where}.value", "must be greater than 0"
        if not 0 < policy.get("periodSeconds", 0) <= MAX_POLICY_PERIOD_SECONDS:
            yield f"{where}.periodSeconds", f"must be between 1 and {MAX_POLICY_PERIOD_SECONDS}"


def _autoscaler_problems(child: dict) -> Iterator[Problem]:
    spec = child.get("spec") or {}
    for index, metric in enumerate(spec.get("metrics") or []):
        yield from _metric_problems(metric, f"spec.metrics[{index}]")
    for direction in ("scaleUp", "scaleDown"):
        rules = (spec.get("behavior") or {}).get(direction)
        if isinstance(rules, dict):
            yield from _scaling_rules_problems(rules, f"spec.behavior.{direction}")


# Syncs re-render the same children over and over (each child status change is a new request):
# a verdict is kept by the child's digest, which costs a tenth of checking it again.
VERDICTS_KEPT = 4096
_verdicts: OrderedDict[bytes, str | None] = OrderedDict()


def refusal(child: dict) -> str | None:
    """Why the API server would refuse this child, or None (for the checks this module makes)."""
    # Keys in their order, not sorted: the checks meet them in that order, so two children that
    # differ only in key order may get different (equally true) verdicts.
    digest = hashlib.blake2b(json.dumps(child, separators=(",", ":")).encode(), digest_size=16).digest()
    if digest in _verdicts:
        _verdicts.move_to_end(digest)
        return _verdicts[digest]
    verdict = _check_child(child)
    _verdicts[digest] = verdict
    if len(_verdicts) > VERDICTS_KEPT:
        _verdicts.popitem(last=False)
    return verdict


# Checked complete and with every field known: a metric's unknown field would be dropped by the API
# server and re-applied by Metacontroller on every sync.
STRICT_KINDS = {"HorizontalPodAutoscaler": "StrictHorizontalPodAutoscaler"}


def _budget_problems(child: dict) -> Iterator[Problem]:
    spec = child.get("spec") or {}
    if "minAvailable" in spec and "maxUnavailable" in spec:
        yield (
            "spec.minAvailable",
            "may not be set together with maxUnavailable: remove maxUnavailable with the same patch",
        )


def _check_child(child: dict) -> str | None:
    problem = kubernetes_schema.problem(STRICT_KINDS.get(child["kind"], child["kind"]), child)
    if child["kind"] == "LeaderWorkerSet":  # no schema shipped for the custom kind: its pod templates
        for path in POD_TEMPLATE_PATHS["LeaderWorkerSet"]:
            template = field_at(child, *path)  # leaderTemplate is optional
            if template is not None:
                problem = problem or kubernetes_schema.problem("PodTemplateSpec", template, path)
    if problem is None:
        semantic = itertools.chain(
            _metadata_problems(child.get("metadata"), "metadata"),
            _workload_problems(child) if child["kind"] in POD_TEMPLATE_PATHS else (),
            _service_problems(child) if child["kind"] == "Service" else (),
            _autoscaler_problems(child) if child["kind"] == "HorizontalPodAutoscaler" else (),
            _budget_problems(child) if child["kind"] == "PodDisruptionBudget" else (),
        )
        problem = next(semantic, None)
    return None if problem is None else f"{problem[0]}: {problem[1]}"


# The rules the spec's own fields are held to (hooks/api/), on what a patch or an extraPodSpec made.


def _evictable_problems(idep: InferaDeployment, child: dict) -> Iterator[Problem]:
    """As spec.services.<name>.disruptionBudget: the budget lets a pod go, with the pool at its
    fewest pods (every budget is a service's)."""
    spec = child.get("spec") or {}
    service = service_of(child)
    svc = idep.spec.services.get(service or "")
    if svc is None:
        return
    instead = f"spec.services.{service}.disruptionBudget sets how many pods may go at once"
    if "maxUnavailable" in spec and not max_unavailable_valid(spec["maxUnavailable"]):
        yield (
            "spec.maxUnavailable",
            f"{shown(spec['maxUnavailable'])} is not a positive integer or a percentage from 1% to 100%: with 0 "
            f"{UNEVICTABLE}; {instead}",
        )
    minimum = spec.get("minAvailable")
    pods = svc.fewest_replicas * svc.number_of_nodes
    percent = re.fullmatch(r"([0-9]+)%", minimum) if isinstance(minimum, str) else None
    # A percentage rounds up, as the disruption controller counts it; other values are the API server's to refuse.
    kept = math.ceil(int(percent.group(1)) * pods / 100) if percent else minimum if isinstance(minimum, int) else 0
    if pods and kept >= pods:
        yield (
            "spec.minAvailable",
            f"{shown(minimum)}: with the pool at its fewest ({pods} {'pod' if pods == 1 else 'pods'}) {UNEVICTABLE}; "
            f"{instead}",
        )


def _exposure_problems(child: dict) -> Iterator[Problem]:
    """The graph's Services are reachable inside the cluster only: an InferaDeployment must not
    make for its author what only those allowed to create such Services may."""
    spec = child.get("spec") or {}
    if spec.get("externalIPs"):
        yield (
            "spec.externalIPs",
            "may not be set: a Service with external IPs takes the cluster's traffic to those addresses (CVE-2020-8554)",
        )
    if spec.get("type") not in (None, "", "ClusterIP"):
        selector = ",".join(f"{key}={value}" for key, value in (spec.get("selector") or {}).items())
        yield (
            "spec.type",
            f"may only be ClusterIP (not {shown(spec['type'])}): the graph is reachable inside the cluster only, "
            f"since whoever may create an InferaDeployment may not be allowed more; a Service of your own can "
            f"select the pods ({selector})",
        )


def _storage_problems(claim_spec: Any, at: str) -> Iterator[Problem]:
    """As nats.storageSize and modelCache.size: a claim of no bytes never binds."""
    storage = field_at(claim_spec, "resources", "requests", "storage")
    amount = None if storage is None else _quantity(storage)
    if amount is not None and amount <= 0:
        yield f"{at}.resources.requests.storage", f"must be more than 0 (not {shown(storage)})"


def _ready_timeout_problems(child: dict) -> Iterator[Problem]:
    """As a service's env and spec.envs: the engine's load timeout, in every container."""
    for path in POD_TEMPLATE_PATHS.get(child["kind"], ()):
        spec = field_at(child, *path, "spec") or {}
        for kind in ("initContainers", "containers"):
            for index, container in enumerate(spec.get(kind) or []):
                for number, var in enumerate(container.get("env") or []):
                    literal = "valueFrom" not in var  # without a value too: kubelet sets it to ""
                    value = var.get("value") or ""
                    if var["name"] == READY_TIMEOUT_ENV and literal and (problem := ready_timeout_problem(value)):
                        yield f"{'.'.join(path)}.spec.{kind}[{index}].env[{number}].value", problem


def _broken_rule(idep: InferaDeployment, child: dict) -> str | None:
    """The first of the spec's rules that a child breaks, or None."""
    kind, spec = child["kind"], child.get("spec") or {}
    claims = enumerate(spec.get("volumeClaimTemplates") or [] if kind == "StatefulSet" else [])
    problems = itertools.chain(
        _evictable_problems(idep, child) if kind == "PodDisruptionBudget" else (),
        _exposure_problems(child) if kind == "Service" else (),
        _storage_problems(spec, "spec") if kind == "PersistentVolumeClaim" else (),
        *(_storage_problems(claim.get("spec"), f"spec.volumeClaimTemplates[{index}].spec") for index, claim in claims),
        _ready_timeout_problems(child),
    )
    problem = next(problems, None)
    return None if problem is None else f"{problem[0]}: {problem[1]}"


def _free_form_source(idep: InferaDeployment, child: dict) -> str | None:
    """The spec field whose free-form content shaped this child, if any."""
    service = service_of(child)
    svc = idep.spec.services.get(service) if service else None
    if svc is None:
        return None
    if child["kind"] == "HorizontalPodAutoscaler":
        return f"spec.services.{service}.autoscaling" if svc.autoscaling else None
    return f"spec.services.{service}.extraPodSpec" if svc.extra_pod_spec else None


def _patches_to_blame(before: dict, after: dict, source: str | None, verdict: Callable[[dict], str | None]) -> bool:
    """Whether the patches on a child are what the verdict finds wrong: nothing else shaped it,
    or it was fine before them."""
    return after is not before and (source is None or verdict(before) is None)


def check(idep: InferaDeployment, rendered: list[dict], patched: list[dict]) -> None:
    """SpecError naming the spec field behind the first child the API server would refuse, or
    that breaks a rule the spec is held to: the service's extraPodSpec or autoscaling, or the
    patches on that child. `rendered` are the children before spec.patches, `patched` after (a
    patched child is a new object)."""
    patches = idep.spec.patches or []
    for before, after in zip(rendered, patched, strict=True):
        source = _free_form_source(idep, after)
        if after is before and source is None:
            continue
        name = f"{after['kind']} {after['metadata']['name']}"
        reason = refusal(after)
        if reason is not None:
            if _patches_to_blame(before, after, source, refusal):
                raise SpecError(
                    f"{targeting(patches, after)} ({name}): the API server would refuse the patched {after['kind']}: {reason}"
                )
            raise SpecError(f"{source}: the API server would refuse {name} made from it: {reason}")
        broken = _broken_rule(idep, after)
        if broken is not None:
            blamed = _patches_to_blame(before, after, source, lambda child: _broken_rule(idep, child))
            raise SpecError(f"{targeting(patches, after) if blamed else source} ({name}): {broken}")
