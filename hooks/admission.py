"""What the API server would refuse, caught before Metacontroller applies it.

Children rendered from typed fields are valid by construction (the test suite validates every
one against Kubernetes' schemas). Three inputs are free-form: a service's `extraPodSpec`, its
autoscaling metrics and behavior, and `spec.patches`. The children they shape are checked here,
against Kubernetes 1.33's schemas (hooks/kubernetes_schema.py, enums included) and the API
server's own rules for what a schema cannot say (names, ports, selectors, sizes, what a value
such as dnsPolicy None requires elsewhere; a pod's in hooks/pod_rules.py), so that a bad spec
fails in status naming its field instead of every apply failing where only events show it. They
are held to the rules the spec's own fields are held to as well (_broken_rule): a patch must not
get around them.

Custom kinds (LeaderWorkerSet, InferencePool, HTTPRoute) get their pod templates checked; the
rest of a patch on them is left to the API server.
"""

import itertools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from hooks import kubernetes_schema
from hooks.api.fields import SpecError, max_unavailable_valid
from hooks.api.graph import InferaDeployment
from hooks.api.rules import READY_TIMEOUT_ENV, UNEVICTABLE, ready_timeout_problem
from hooks.contract import field_at, list_merge_key, merge_key_text
from hooks.kubernetes_names import label_value_valid, shown
from hooks.kubernetes_schema import Problem
from hooks.observed import POD_TEMPLATE_PATHS, service_of
from hooks.pod_rules import metadata_problems, pod_problems, port_name_problem, quantity_or_none, selects
from hooks.renderers.patches import targeting

# A workload's strategy field, and its type that takes no rollingUpdate.
WITHOUT_ROLLING_UPDATE = {"Deployment": ("strategy", "Recreate"), "StatefulSet": ("updateStrategy", "OnDelete")}


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
        elif not selects(selector, labels):
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
            yield from pod_problems(template, ".".join(path), claims)


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
        elif isinstance(target, str) and (problem := port_name_problem(target)):
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
    amount = None if value is None else value if value_field == "averageUtilization" else quantity_or_none(value)
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


def refusal(child: dict) -> str | None:
    """Why the API server would refuse this child, or None (for the checks this module makes)."""
    problem = kubernetes_schema.problem(STRICT_KINDS.get(child["kind"], child["kind"]), child)
    if child["kind"] == "LeaderWorkerSet":  # no schema shipped for the custom kind: its pod templates
        leader_path, worker_path = POD_TEMPLATE_PATHS["LeaderWorkerSet"]
        if field_at(child, *worker_path) is None:  # the CRD requires it; leaderTemplate is optional
            problem = problem or (
                ".".join(worker_path),
                "is required: the LeaderWorkerSet CRD refuses a group without it",
            )
        for path in (leader_path, worker_path):
            template = field_at(child, *path)
            if template is not None:
                problem = problem or kubernetes_schema.problem("PodTemplateSpec", template, path)
    if problem is None:
        semantic = itertools.chain(
            metadata_problems(child.get("metadata"), "metadata"),
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
    amount = None if storage is None else quantity_or_none(storage)
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


def _merge_key_problems(value: Any, path: str) -> Iterator[Problem]:
    """Two items of a list that Metacontroller merges by a key, with one value of it: its merge
    keeps only the last of them, stored twice in their place, and the other is lost on the
    first sync after the create (a port on TCP and UDP, say)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _merge_key_problems(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        merge_key = list_merge_key(value)
        seen: dict[str, int] = {}
        for index, item in enumerate(value):
            text = merge_key_text(item[merge_key]) if merge_key else None
            if text is not None and text in seen:
                yield (
                    f"{path}[{index}].{merge_key}",
                    f"{shown(item[merge_key])} is also {path}[{seen[text]}]'s: Metacontroller merges this list "
                    f"by {merge_key} and would keep only the last of the two, so give each item its own {merge_key}",
                )
            elif text is not None:
                seen[text] = index
            yield from _merge_key_problems(item, f"{path}[{index}]")


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
        _merge_key_problems(spec, "spec"),
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
