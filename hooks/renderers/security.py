"""Pod security per component, as the Pod Security Standards name the levels.

The routers (server, GAIE frontend sidecar, Endpoint Picker), the NATS broker and the model
download run `restricted`: a user id of their own, no privilege escalation, no capabilities,
RuntimeDefault seccomp and a read-only root filesystem (the routers and the download write to an
emptyDir at /tmp, the routers' HOME; the broker only to its claim). A worker's engine runs as its image's user (root: the rocm/infera images
declare no USER, and engines write JIT kernels and caches all over their image), with privilege
escalation off, every capability dropped but those its transports need, and RuntimeDefault
seccomp. extraPodSpec and spec.patches are laid over all of it.
"""

from typing import Any

# A user the images need not know (distroless images' "nonroot"), above the range a node's own
# accounts use: volumes that must be writable are made so for its group (fsGroup); emptyDirs
# are writable by anyone.
RESTRICTED_UID = 65532
# Named for the operator: a template's own `tmp` volume is never mounted in its place.
SCRATCH_VOLUME = "infera-tmp"
SCRATCH_PATH = "/tmp"
# A user unknown to the image gets HOME=/, on the read-only root: caches (the tokenizer's, under
# ~/.cache/huggingface) go to the scratch volume instead.
HOME_ENV = {"name": "HOME", "value": SCRATCH_PATH}
# What RDMA transports (mori, Mooncake) and the kvd arena need, as the upstream examples grant
# it: pinning memory, raising the memlock limit, and reading a peer process's memory.
RDMA_CAPABILITIES = ("IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE")
# The API server refuses allowPrivilegeEscalation: false beside either.
ESCALATING_CAPABILITY = "CAP_SYS_ADMIN"

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


# Users are set on the operator's containers, not the pod: a template's own containers (an init
# container that copies files) keep their image's user, and a template's pod-level context
# (which replaces the operator's whole) does not undo them.
def restricted_container() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RESTRICTED_UID,
        "runAsGroup": RESTRICTED_UID,
    }


def pod_context(claims: bool = False) -> dict[str, Any]:
    """Every container RuntimeDefault seccomp; `claims`: the restricted user's persistent
    volumes made writable for its group."""
    context: dict[str, Any] = {"seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}
    if claims:
        context["fsGroup"] = RESTRICTED_UID
    return context


def worker_container(rdma: bool) -> dict[str, Any]:
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if rdma:
        capabilities["add"] = list(RDMA_CAPABILITIES)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}


def settle_template(spec: dict[str, Any], primary: dict[str, Any], rdma: bool) -> None:
    """After a template is laid over the pod: `rdma`'s capabilities stay beside the template's
    own (the merge replaces lists), and a container the template makes privileged, or gives
    CAP_SYS_ADMIN, loses the operator's allowPrivilegeEscalation: false (the API server refuses
    the pair)."""
    if rdma:
        capabilities = primary.setdefault("securityContext", {}).setdefault("capabilities", {})
        added = capabilities.get("add") or []
        capabilities["add"] = [*RDMA_CAPABILITIES, *(c for c in added if c not in RDMA_CAPABILITIES)]
    for container in spec["containers"]:
        context = container.get("securityContext") or {}
        escalates = context.get("privileged") or ESCALATING_CAPABILITY in (context.get("capabilities") or {}).get(
            "add", []
        )
        if escalates and context.get("allowPrivilegeEscalation") is False:
            del context["allowPrivilegeEscalation"]
