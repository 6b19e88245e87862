"""The identities of kubernetes discovery, one per kind of process, each with the least the
Infera runtime needs: a ServiceAccount, a Role and a RoleBinding for the servers and the
Endpoint Picker (routers: they discover workers), and for the workers (which register)."""

from hooks.api.graph import GROUP, PLURAL, InferaDeployment
from hooks.api.services import ServiceSpec
from hooks.vocabulary import (
    DISCOVERY_SUFFIX,
    EPP_SUFFIX,
    REGISTRATION_SUFFIX,
    child_name,
    object_metadata,
)

RBAC_API = "rbac.authorization.k8s.io"


def service_account_name(idep: InferaDeployment, svc: ServiceSpec | None = None) -> str | None:
    """The account a service's pods run as (`svc` None: the Endpoint Picker's); None without
    kubernetes discovery, where no process calls the API server for it."""
    if idep.spec.discovery_backend != "kubernetes":
        return None
    if svc is None:
        return child_name(idep, EPP_SUFFIX)
    return child_name(idep, REGISTRATION_SUFFIX if svc.is_worker else DISCOVERY_SUFFIX)


def unmount_unused_token(idep: InferaDeployment, spec: dict) -> None:
    """Without kubernetes discovery none of our processes calls the API server: a pod spec
    left on the namespace's default account gets no token, unless it says otherwise (a token
    nothing uses is a credential for whoever breaks into the pod)."""
    if idep.spec.discovery_backend != "kubernetes" and spec.get("serviceAccountName", "default") == "default":
        spec.setdefault("automountServiceAccountToken", False)


def _identity(idep: InferaDeployment, suffix: str, rules: list[dict]) -> list[dict]:
    name = child_name(idep, suffix)
    # Every identity object carries the discovery identity's service label: one part of the
    # plumbing, torn down with the plane.
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_metadata(idep, DISCOVERY_SUFFIX, name)},
        {
            "apiVersion": f"{RBAC_API}/v1",
            "kind": "Role",
            "metadata": object_metadata(idep, DISCOVERY_SUFFIX, name),
            "rules": rules,
        },
        {
            "apiVersion": f"{RBAC_API}/v1",
            "kind": "RoleBinding",
            "metadata": object_metadata(idep, DISCOVERY_SUFFIX, name),
            "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": idep.metadata.namespace}],
        },
    ]


def _discovers() -> dict:
    """What routers do: list and watch the graph's pods (infera/common/discovery_k8s.py)."""
    return {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}


def render(idep: InferaDeployment, scaling_api: bool) -> list[dict]:
    """The servers', the Endpoint Picker's (with the gateway) and the workers' identities;
    `scaling_api`: a server serves the scaling API."""
    if idep.spec.discovery_backend != "kubernetes":
        return []
    server_rules = [_discovers()]
    if scaling_api:
        # The scaling API reads its own Pod to find its InferaDeployment, then reads and
        # patches that one object (infera/server/scaling.py); the bundle's ValidatingAdmission-
        # Policy lets it change nothing but replica counts.
        server_rules = [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [idep.name], "verbs": ["get", "patch"]},
        ]
    # A worker only patches its own Pod's registration annotation (infera/common/
    # registration_k8s.py); with the gateway, its pod's frontend sidecar is a router too.
    worker_verbs = ["list", "patch", "watch"] if idep.spec.gaie.enabled else ["patch"]
    worker_rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": worker_verbs}]
    picker = _identity(idep, EPP_SUFFIX, [_discovers()]) if idep.spec.gaie.enabled else []
    return _identity(idep, DISCOVERY_SUFFIX, server_rules) + picker + _identity(idep, REGISTRATION_SUFFIX, worker_rules)
