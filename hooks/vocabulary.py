"""The operator's vocabulary: what its children are called, the labels that identify them, and
the kinds it creates with the kustomize component that registers each optional one. Renderers,
status, teardown, reconcile and the request contract all speak it, so none of them reaches into
another's internals for a name."""

from dataclasses import dataclass
from typing import Literal, Protocol


# What names and labels are made of: a graph's name, and a service's span. Protocols, not the
# API's types, so that the API and the request contract can speak this vocabulary too.
class Graph(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def graph_generation(self) -> str: ...


class Service(Protocol):
    @property
    def number_of_nodes(self) -> int: ...


DEPLOYMENT_LABEL = "infera.amd.com/deployment"
SERVICE_LABEL = "infera.amd.com/service"
COMPONENT_LABEL = "infera.amd.com/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "infera-hooks"
# On the worker pods that carry the GAIE frontend sidecar: the InferencePool selects on it.
GAIE_FRONTEND_LABEL = "infera.amd.com/gaie-frontend"
# Under BlueGreen, on every pod of a generation and on the children that belong to it: its
# routers and Endpoint Picker see only workers that carry their own generation.
GENERATION_LABEL = "infera.amd.com/generation"

# Suffixes of the plumbing children (hooks/api/names.py holds every name, its limit, and the
# service names that would collide with one).
NATS_SUFFIX = "nats"
# The routers' discovery identity; the workers' registration identity is part of it (its service
# label), so needs no reserved service name.
DISCOVERY_SUFFIX = "disc"
REGISTRATION_SUFFIX = "register"
EPP_SUFFIX = "epp"
# The InferencePool's, and the HTTPRoute's.
POOL_SUFFIX = "pool"
ROUTE_SUFFIX = "route"
# The PodMonitor's.
METRICS_SUFFIX = "metrics"
# The model cache's claim, and the service label of its claim and download Jobs.
MODELS_SUFFIX = "models"
# The download Jobs', each <idep>-download-<digest of its source>.
DOWNLOAD_SUFFIX = "download"
# Characters of a digest in a name: the download Job's source, a BlueGreen generation's.
DIGEST_LENGTH = 8
# The volume of the model cache's claim, in the download Job and in every worker pod.
MODEL_VOLUME = "model-cache"


def child_name(idep: Graph, suffix: str) -> str:
    return f"{idep.name}-{suffix}"


def selector_labels(idep: Graph, service: str) -> dict[str, str]:
    """The immutable selector of a workload: only identity, so later label edits never touch it."""
    return {DEPLOYMENT_LABEL: idep.name, SERVICE_LABEL: service}


def generation_labels(idep: Graph) -> dict[str, str]:
    """What marks the pods and children of the generation being rendered (none outside BlueGreen)."""
    return {GENERATION_LABEL: idep.graph_generation} if idep.graph_generation else {}


def generation_name(idep: Graph, suffix: str) -> str:
    """A child that belongs to one generation: a service's workload, the Endpoint Picker and its
    Service. Outside BlueGreen, the plain child name."""
    name = child_name(idep, suffix)
    return f"{name}-{idep.graph_generation}" if idep.graph_generation else name


def graph_selector(idep: Graph) -> str:
    """The graph's pods of the generation being rendered, as a label selector: what its routers
    watch for workers."""
    return ",".join(f"{key}={value}" for key, value in {DEPLOYMENT_LABEL: idep.name, **generation_labels(idep)}.items())


def identity_labels(idep: Graph, service: str) -> dict[str, str]:
    return {**selector_labels(idep, service), MANAGED_BY_LABEL: MANAGED_BY}


def object_metadata(idep: Graph, service: str, name: str | None = None) -> dict:
    return {"name": name or child_name(idep, service), "labels": identity_labels(idep, service)}


def generation_metadata(idep: Graph, service: str) -> dict:
    """The metadata of a child that belongs to the generation being rendered."""
    return {"name": generation_name(idep, service), "labels": identity_labels(idep, service) | generation_labels(idep)}


def download_job_name(idep: Graph, digest: str) -> str:
    """The Job that downloads the source with this digest into the model cache."""
    return child_name(idep, f"{DOWNLOAD_SUFFIX}-{digest}")


def pool_name(idep: Graph) -> str:
    """The InferencePool of the generation being rendered."""
    return generation_name(idep, POOL_SUFFIX)


def route_name(idep: Graph) -> str:
    return child_name(idep, ROUTE_SUFFIX)


# The kinds a service's pods run under.
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


def workload_kind(svc: Service) -> str:
    """A service spanning several nodes is a LeaderWorkerSet of groups; any other, a Deployment."""
    return "LeaderWorkerSet" if svc.number_of_nodes > 1 else "Deployment"


# When teardown deletes a child: with the ingress (first, so no new request arrives), with the
# plumbing (last), or by what it serves (a server's workload and Service go with the ingress, a
# worker pool's after it, the broker's with the plumbing).
TeardownStep = Literal["ingress", "plane", "by service"]


@dataclass(frozen=True)
class ChildKind:
    kind: str
    api_version: str
    resource: str  # as a CompositeController's childResources names it
    component: str | None  # the kustomize component that registers it; None: the base bundle
    teardown: TeardownStep


# In the order the bundle's CompositeController and its components register them.
CHILD_KINDS = (
    ChildKind("Deployment", "apps/v1", "deployments", None, "by service"),
    ChildKind("Service", "v1", "services", None, "by service"),
    ChildKind("StatefulSet", "apps/v1", "statefulsets", None, "plane"),
    ChildKind("ServiceAccount", "v1", "serviceaccounts", None, "plane"),
    ChildKind("Role", "rbac.authorization.k8s.io/v1", "roles", None, "plane"),
    ChildKind("RoleBinding", "rbac.authorization.k8s.io/v1", "rolebindings", None, "plane"),
    ChildKind("HorizontalPodAutoscaler", "autoscaling/v2", "horizontalpodautoscalers", None, "ingress"),
    ChildKind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets", None, "ingress"),
    ChildKind("PersistentVolumeClaim", "v1", "persistentvolumeclaims", None, "plane"),
    ChildKind("Job", "batch/v1", "jobs", None, "plane"),
    ChildKind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies", None, "plane"),
    ChildKind("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1", "leaderworkersets", "lws", "by service"),
    ChildKind("InferencePool", "inference.networking.k8s.io/v1", "inferencepools", "gaie", "ingress"),
    ChildKind("HTTPRoute", "gateway.networking.k8s.io/v1", "httproutes", "gaie", "ingress"),
    # Deleted last: the graph stays observable while it drains.
    ChildKind("PodMonitor", "monitoring.coreos.com/v1", "podmonitors", "monitoring", "plane"),
)
BY_KIND = {child.kind: child for child in CHILD_KINDS}
