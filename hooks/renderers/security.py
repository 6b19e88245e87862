"""Pod security per component, as the Pod Security Standards name the levels.

The routers (server, GAIE frontend sidecar, Endpoint Picker), the NATS broker and the model
download run `restricted`: a user id of their own, no privilege escalation, no capabilities,
RuntimeDefault seccomp and a read-only root filesystem, with an emptyDir at /tmp (and HOME) for
what they write. A worker's engine runs as its image's user (root: the rocm/infera images
declare no USER, and engines write JIT kernels and caches all over their image), with privilege
escalation off, every capability dropped but those its transports need, and RuntimeDefault
seccomp. extraPodSpec and spec.patches are laid over all of it.
"""

from typing import Any

# A user the images need not know (distroless images' "nonroot"), above the range a node's own
# accounts use: volumes that must be writable are made so for its group (fsGroup); emptyDirs
# are writable by anyone.
RESTRICTED_UID = 65532
SCRATCH_VOLUME = "tmp"
SCRATCH_PATH = "/tmp"
# A user unknown to the image gets HOME=/, on the read-only root: caches (the tokenizer's, under
# ~/.cache/huggingface) go to the scratch volume instead.
HOME_ENV = {"name": "HOME", "value": SCRATCH_PATH}
# What RDMA transports (mori, Mooncake) and the kvd arena need, as the upstream examples grant
# it: pinning memory, raising the memlock limit, and reading a peer process's memory.
RDMA_CAPABILITIES = ("IPC_LOCK", "SYS_PTRACE", "SYS_RESOURCE")

RUNTIME_DEFAULT_SECCOMP = {"type": "RuntimeDefault"}


def non_root_user() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RESTRICTED_UID, "runAsGroup": RESTRICTED_UID}


def restricted_pod() -> dict[str, Any]:
    return non_root_user() | {"fsGroup": RESTRICTED_UID, "seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}


def restricted_container() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def worker_pod() -> dict[str, Any]:
    return {"seccompProfile": dict(RUNTIME_DEFAULT_SECCOMP)}


def worker_container(rdma: bool) -> dict[str, Any]:
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if rdma:
        capabilities["add"] = list(RDMA_CAPABILITIES)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def scratch_volume() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}


def privileged_wins(spec: dict[str, Any]) -> None:
    """A template that makes a container privileged gets no allowPrivilegeEscalation: false
    from the operator (the API server refuses the pair)."""
    for container in spec["containers"]:
        context = container.get("securityContext") or {}
        if context.get("privileged") and context.get("allowPrivilegeEscalation") is False:
            del context["allowPrivilegeEscalation"]
