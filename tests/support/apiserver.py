"""What a real API server does to an object it stores, for the kinds the hook emits.

The simulator stores children through `store()`, so a desired value the server would rewrite
(a defaulted field inside a list Metacontroller replaces wholesale, a deprecated alias, a
non-canonical quantity, an empty env value) shows up as an update on every sync, exactly as
it would on a cluster.
"""

import copy
from functools import cache
from typing import Any

import yaml

from hooks.quantity import canonical_quantity
from tests.support.apply import as_stored, go_equal
from tests.support.prerequisites import SCHEMAS

PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3}


def _quantities(mapping: dict[str, Any] | None) -> None:
    for key, value in (mapping or {}).items():
        mapping[key] = canonical_quantity(str(value))


def _probe(probe: dict[str, Any] | None) -> None:
    if not probe:
        return
    for key, value in PROBE_DEFAULTS.items():
        probe.setdefault(key, value)
    if "httpGet" in probe:
        probe["httpGet"].setdefault("scheme", "HTTP")


def _container(container: dict[str, Any]) -> None:
    image = container.get("image", "")
    container.setdefault(
        "imagePullPolicy",
        "Always" if image.endswith(":latest") or ":" not in image.rsplit("/", 1)[-1] else "IfNotPresent",
    )
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    _quantities(resources.get("requests"))
    _quantities(resources.get("limits"))
    for port in container.get("ports", []):
        port.setdefault("protocol", "TCP")
    for var in container.get("env", []):
        if var.get("value") == "":
            del var["value"]
        field_ref = (var.get("valueFrom") or {}).get("fieldRef")
        if field_ref:
            field_ref.setdefault("apiVersion", "v1")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        _probe(container.get(probe))


def _pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("terminationGracePeriodSeconds", 30)
    # The deprecated alias: read back from serviceAccount when serviceAccountName is gone.
    if spec.get("serviceAccountName"):
        spec["serviceAccount"] = spec["serviceAccountName"]
    elif spec.get("serviceAccount"):
        spec["serviceAccountName"] = spec["serviceAccount"]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        _container(container)
    for volume in spec.get("volumes", []):
        empty_dir = volume.get("emptyDir")
        if empty_dir and "sizeLimit" in empty_dir:
            empty_dir["sizeLimit"] = canonical_quantity(str(empty_dir["sizeLimit"]))


@cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of the upstream CRDs (LWS, InferencePool, HTTPRoute)."""
    schemas = {}
    for path in sorted(SCHEMAS.glob("*.yaml")) if SCHEMAS.is_dir() else []:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                for version in doc["spec"]["versions"]:
                    key = (f"{doc['spec']['group']}/{version['name']}", doc["spec"]["names"]["kind"])
                    schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def load_simulated_schemas() -> None:
    """Read the upstream CRDs now, not inside the first test that simulates them."""
    _crd_schemas()


def _apply_crd_defaults(schema: dict[str, Any], value: Any) -> None:
    """Structural defaulting, as the API server does for custom resources."""
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _apply_crd_defaults(sub, value[name])
        if isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                _apply_crd_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _apply_crd_defaults(schema["items"], item)


# Fields the API server (or, for LeaderWorkerSet, its webhook before KEP-552) refuses to change.
IMMUTABLE = {
    "Deployment": [("spec", "selector")],
    "StatefulSet": [("spec", "selector"), ("spec", "serviceName"), ("spec", "volumeClaimTemplates")],
    "RoleBinding": [("roleRef",)],
    "LeaderWorkerSet": [("spec", "leaderWorkerTemplate", "size")],
    "Job": [("spec", "template"), ("spec", "selector")],
    "PersistentVolumeClaim": [("spec", "storageClassName"), ("spec", "accessModes")],
}


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Fail as the API server would if an update changes an immutable field (the apply would
    then fail on every sync)."""
    for path in IMMUTABLE.get(old["kind"], []):
        before, after = _at(old, path), _at(store(new), path)
        assert before == after, (
            f"{old['kind']} {old['metadata']['name']}: {'.'.join(path)} is immutable ({before!r} -> {after!r})"
        )


HPA_RULE_DEFAULTS: dict[str, dict[str, Any]] = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    },
    "scaleDown": {"selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]},
}


def store(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server would return it after a create or update (its numbers as
    Go writes them: a whole float reads back an integer)."""
    obj = as_stored(obj)
    kind, spec = obj["kind"], obj.get("spec")
    crd_schema = _crd_schemas().get((obj["apiVersion"], kind))
    if crd_schema is not None:
        _apply_crd_defaults({**crd_schema, "properties": {"spec": crd_schema["properties"]["spec"]}}, obj)
    if kind == "LeaderWorkerSet":  # the LeaderWorkerSet webhook's defaults
        spec.setdefault("networkConfig", {"subdomainPolicy": "Shared"})
    elif kind == "Deployment":
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        spec.setdefault(
            "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
        )
        _pod_spec(spec["template"]["spec"])
    elif kind == "StatefulSet":
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        spec.setdefault("persistentVolumeClaimRetentionPolicy", {"whenDeleted": "Retain", "whenScaled": "Retain"})
        _pod_spec(spec["template"]["spec"])
        for claim in spec.get("volumeClaimTemplates", []):
            claim.setdefault("apiVersion", "v1")
            claim.setdefault("kind", "PersistentVolumeClaim")
            claim["spec"].setdefault("volumeMode", "Filesystem")
            _quantities(claim["spec"].get("resources", {}).get("requests"))
            claim.setdefault("status", {"phase": "Pending"})
    elif kind == "PersistentVolumeClaim":
        spec.setdefault("volumeMode", "Filesystem")
        spec.setdefault("storageClassName", "standard")  # the DefaultStorageClass admission plugin
        _quantities(spec["resources"]["requests"])
        obj.setdefault("status", {"phase": "Bound"})
    elif kind == "Job":
        # The Job controller's own selector and labels, and the batch defaults.
        uid_label = {"batch.kubernetes.io/controller-uid": "job-uid"}
        spec.setdefault("selector", {"matchLabels": dict(uid_label)})
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(
            {**uid_label, "batch.kubernetes.io/job-name": obj["metadata"]["name"]}
        )
        for key, value in (
            ("completions", 1),
            ("parallelism", 1),
            ("completionMode", "NonIndexed"),
            ("suspend", False),
        ):
            spec.setdefault(key, value)
        _pod_spec(spec["template"]["spec"])
    elif kind == "HorizontalPodAutoscaler":
        spec.setdefault("minReplicas", 1)
        # A behavior given in part is completed, rule by rule (autoscaling/v2 defaults.go).
        for direction, defaults in HPA_RULE_DEFAULTS.items() if "behavior" in spec else ():
            rules = spec["behavior"].setdefault(direction, {})
            for key, value in defaults.items():
                rules.setdefault(key, copy.deepcopy(value))
    elif kind == "Service":
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("clusterIP", "10.96.0.17")
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        for port in spec.get("ports", []):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port["port"])
    return obj


def generation_after_update(old: dict[str, Any], new: dict[str, Any]) -> int:
    """metadata.generation once `new` replaced `old`: a spec change bumps it, and a Deployment's
    annotations too (they are copied to its ReplicaSets: the registry's PrepareForUpdate)."""
    changed = not go_equal(old.get("spec"), new.get("spec"))
    if old["kind"] == "Deployment":
        changed = changed or not go_equal(old["metadata"].get("annotations"), new["metadata"].get("annotations"))
    return int(old["metadata"]["generation"]) + changed
