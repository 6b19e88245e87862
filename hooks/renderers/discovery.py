"""The discovery identity of kubernetes discovery: ServiceAccount, Role and RoleBinding."""

from hooks.api import GROUP, PLURAL, InferaDeployment
from hooks.vocabulary import DEPLOYMENT_LABEL, DISCOVERY_SUFFIX, child_name, object_metadata


def label_selector(idep: InferaDeployment) -> str:
    """The pods the server watches for workers: every pod of this InferaDeployment."""
    return f"{DEPLOYMENT_LABEL}={idep.name}"


def service_account_name(idep: InferaDeployment) -> str | None:
    if idep.spec.discovery_backend != "kubernetes":
        return None
    return child_name(idep, DISCOVERY_SUFFIX)


def render(idep: InferaDeployment) -> list[dict]:
    name = service_account_name(idep)
    if name is None:
        return []
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_metadata(idep, DISCOVERY_SUFFIX)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_metadata(idep, DISCOVERY_SUFFIX),
        # Least privilege: workers register by patching their own Pod, the server lists and
        # watches them, and both may read and patch only this one InferaDeployment.
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
            {
                "apiGroups": [GROUP],
                "resources": [PLURAL],
                "resourceNames": [idep.name],
                "verbs": ["get", "patch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": object_metadata(idep, DISCOVERY_SUFFIX),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": idep.metadata.namespace}],
    }
    return [account, role, binding]
