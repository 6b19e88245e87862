"""What a graph shares beside its services: the NATS broker, the Inference Gateway front door and
the model cache."""

import hashlib
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hooks.api.env import KeySelector
from hooks.api.fields import ApiModel, ImageReference, Quantity
from hooks.api.rules import (
    GAIE_REQUIRED_RULE,
    MODEL_SOURCE,
    MOUNT_PATH_RULE,
    NATS_STORAGE_RULE,
    NATS_TOKEN_DEPLOY_RULE,
    NATS_TOKEN_OPTIONAL_RULE,
    SYSTEM_PATHS,
    cel,
    with_validations,
)
from hooks.kubernetes_names import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    HOSTNAME,
    LABEL_VALUE_PATTERN,
    qualified_key_problem,
)
from hooks.quantity import quantity_value
from hooks.vocabulary import DIGEST_LENGTH

# Pinned so that a NATS release never changes a running broker behind the user's back.
DEFAULT_NATS_IMAGE = "nats:2.10.24-alpine"

DEFAULT_FRONTEND_PORT = 8000
# Every picker holds a full view of the graph's KV events: more than a handful only multiplies that.
MAX_EPP_REPLICAS = 16


class NatsSpec(ApiModel):
    """The operator-managed NATS JetStream broker that carries KV-cache events."""

    model_config = with_validations(
        cel("!has(self.tokenSecretRef) || !has(self.deploy) || self.deploy", NATS_TOKEN_DEPLOY_RULE)
    )

    deploy: bool = True
    """Create a single-node JetStream NATS (StatefulSet + headless Service) for this graph."""
    image: ImageReference | None = None
    """NATS server image. Defaults to a NATS 2.x tag pinned by this operator release."""
    storage_size: Annotated[
        Quantity,
        Field(
            json_schema_extra={
                # Bounds the CEL cost estimate of the rule's regular expression.
                "maxLength": 64,
                "x-kubernetes-validations": [
                    # The digits before any suffix hold one that is not 0, and no sign says less.
                    cel("type(self) == int ? self > 0 : self.matches('^[+]?[0-9.]*[1-9]')", NATS_STORAGE_RULE)
                ],
            }
        ),
    ] = "4Gi"
    """Size of the JetStream PersistentVolumeClaim."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """StorageClass of the JetStream PVC; the cluster default when unset."""
    retain_storage: bool = False
    """Keep the JetStream PVC when the InferaDeployment is deleted (by default it is deleted too)."""
    token_secret_ref: Annotated[
        KeySelector | None,
        Field(
            json_schema_extra={
                "x-kubernetes-validations": [cel("!has(self.optional) || !self.optional", NATS_TOKEN_OPTIONAL_RULE)]
            }
        ),
    ] = None
    """A token the broker requires of every client, from a Secret of the InferaDeployment's
    namespace; every process of the graph gets it in its NATS URL, so it may hold only letters,
    digits and -._~ (and the runtime logs that URL)."""

    @field_validator("token_secret_ref")
    @classmethod
    def _required_token(cls, ref: KeySelector | None) -> KeySelector | None:
        if ref is not None and ref.optional:
            raise ValueError(NATS_TOKEN_OPTIONAL_RULE)
        return ref

    @model_validator(mode="after")
    def _token_of_the_managed_broker(self) -> "NatsSpec":
        if self.token_secret_ref is not None and not self.deploy:
            raise ValueError(NATS_TOKEN_DEPLOY_RULE)
        return self

    @field_validator("storage_size")
    @classmethod
    def _positive(cls, size: str) -> str:
        if quantity_value(size) <= 0:
            raise ValueError(NATS_STORAGE_RULE)
        return size

    @property
    def effective_image(self) -> str:
        return self.image or DEFAULT_NATS_IMAGE


class GaieSpec(ApiModel):
    """Gateway API Inference Extension front door: EPP, InferencePool, HTTPRoute and a frontend
    sidecar in every worker pod."""

    model_config = with_validations(
        cel(
            "!has(self.enabled) || !self.enabled || (has(self.tokenizerPath) && has(self.gatewayName))",
            GAIE_REQUIRED_RULE,
        )
    )

    enabled: bool = False
    """Create the Endpoint Picker, InferencePool and HTTPRoute and inject the frontend sidecar."""
    epp_image: ImageReference | None = None
    """Image of the Endpoint Picker and the frontend sidecar; defaults to spec.image."""
    tokenizer_path: Annotated[str, Field(min_length=1)] | None = None
    """Tokenizer (HF model id or local path) the EPP uses for token-aware scoring. Required when enabled."""
    gateway_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """The existing Gateway the HTTPRoute attaches to. Required when enabled."""
    gateway_namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL.pattern)] | None = None
    """Namespace of the Gateway; defaults to the InferaDeployment's namespace."""
    hostnames: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=253, pattern=HOSTNAME)]], Field(max_length=16)]
        | None
    ) = None
    """Restrict the HTTPRoute to these hostnames."""
    frontend_port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_FRONTEND_PORT
    """Port of the frontend sidecar in every worker pod, and the InferencePool's target port."""
    epp_replicas: Annotated[int, Field(ge=1, le=MAX_EPP_REPLICAS)] = 1
    """Endpoint Pickers. Each replays the graph's KV events in full and picks on its own, so they
    run active-active; with two or more they are spread across nodes and get a disruption budget,
    so the gateway keeps a picker through a node's loss or drain."""
    model_name: str | None = None
    """Informational: the served model id (the Endpoint Picker takes no model name; workers register
    theirs, e.g. with --served-model-name). Accepted for compatibility with the upstream operator."""


class DownloaderSpec(ApiModel):
    """What downloads the model into the cache."""

    image: ImageReference | None = None
    """Image of the download Job; defaults to spec.image (the runtime ships huggingface_hub)."""
    command: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    """Command that writes the model to $INFERA_MODEL_DIR (it gets INFERA_MODEL_REPO, INFERA_MODEL_REVISION
    and HF_TOKEN); default: huggingface_hub's snapshot_download."""


class ModelCacheSpec(ApiModel):
    """Weights downloaded once into a PersistentVolumeClaim that every worker mounts read-only;
    worker pods are created only once the download is complete."""

    source: Annotated[str, Field(max_length=256, pattern=f"^{MODEL_SOURCE.pattern}$")]
    """hf://<owner>/<repo>[@<revision>]."""
    size: Quantity
    """Storage requested for the claim; a larger value expands it."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """StorageClass of the claim; the cluster default when unset."""
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] | None = None
    """Default ReadWriteMany when the worker pods together may be more than one, else ReadWriteOnce."""
    mount_path: Annotated[str, Field(min_length=2, max_length=256, pattern=r"^/[A-Za-z0-9._/-]*[A-Za-z0-9._-]$")] = (
        "/models"
    )
    """Where every worker sees the cache, read-only: the model is at <mountPath>/<repo>."""
    token_secret_ref: KeySelector | None = None
    """The Hugging Face token for a gated repository, given to the download as HF_TOKEN."""
    downloader: DownloaderSpec | None = None
    """A downloader of your own (image, command)."""
    retain_storage: bool = False
    """Keep the claim, and the weights, when the InferaDeployment is deleted."""

    @field_validator("size")
    @classmethod
    def _positive(cls, size: str) -> str:
        if quantity_value(size) <= 0:
            raise ValueError("modelCache.size must be more than 0")
        return size

    @field_validator("mount_path")
    @classmethod
    def _free_path(cls, path: str) -> str:
        segments = path.split("/")[1:]
        # In or above a system path: one of the two is a prefix of the other, segment by segment.
        clashes = (
            f"{path}/".startswith(f"{system}/") or f"{system}/".startswith(f"{path}/") for system in SYSTEM_PATHS
        )
        if any(s in (".", "..", "") for s in segments) or any(clashes):
            raise ValueError(MOUNT_PATH_RULE)
        return path

    @property
    def repo(self) -> str:
        match = MODEL_SOURCE.fullmatch(self.source)
        assert match is not None
        return f"{match.group(1)}/{match.group(2)}"

    @property
    def revision(self) -> str | None:
        match = MODEL_SOURCE.fullmatch(self.source)
        assert match is not None
        return match.group(3)

    @property
    def model_name(self) -> str:
        """The directory the model is in, under mountPath: the repository's name."""
        return self.repo.rsplit("/", 1)[1]

    @property
    def digest(self) -> str:
        """Names the download and the directory it writes: a new source or revision, a new one."""
        return hashlib.sha256(f"{self.repo}@{self.revision or ''}".encode()).hexdigest()[:DIGEST_LENGTH]


# A generation's pools load their model from scratch: as long as a worker may take to load one.
DEFAULT_PROGRESS_DEADLINE_SECONDS = 7200


class RolloutSpec(ApiModel):
    """How a change to what the graph's processes run reaches its pods."""

    strategy: Literal["RollingUpdate", "BlueGreen"] = "RollingUpdate"
    """RollingUpdate: each pool replaces its pods one at a time, old and new side by side behind
    the same routers (safe when old and new workers can serve together: a mixed pool whose change
    keeps the model and tokenizer). BlueGreen: the change starts a new generation of every pool,
    router and Endpoint Picker beside the serving one, with routers that see only their own
    generation's workers; the front door moves once every new pool is ready, then the old
    generation is removed. It needs room for both generations at once."""
    progress_deadline_seconds: Annotated[int, Field(ge=1, le=86400)] = DEFAULT_PROGRESS_DEADLINE_SECONDS
    """Under BlueGreen: seconds the new generation may take to become ready before status says
    the rollout stalled (the serving generation keeps serving either way)."""


# Pinned, as the broker's image is: an exporter release never changes behind the user's back.
DEFAULT_NATS_EXPORTER_IMAGE = "natsio/prometheus-nats-exporter:0.20.1"
# A Prometheus duration, as the Prometheus Operator's CRDs accept it.
PROMETHEUS_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


class NatsExporterSpec(ApiModel):
    """The NATS Prometheus exporter beside the managed broker, which serves its statistics as JSON
    only: it turns them into Prometheus series on a port of its own."""

    enabled: bool = False
    """Run the exporter as a sidecar of the broker and scrape it."""
    image: ImageReference | None = None
    """Exporter image. Defaults to a tag pinned by this operator release."""

    @property
    def effective_image(self) -> str:
        return self.image or DEFAULT_NATS_EXPORTER_IMAGE


class MonitoringSpec(ApiModel):
    """Scraping by the Prometheus Operator: a PodMonitor for the graph's routers, engines and
    frontend sidecars (and the broker's exporter, when enabled)."""

    interval: Annotated[str, Field(min_length=1, max_length=32, pattern=PROMETHEUS_DURATION)] = "30s"
    """How often each endpoint is scraped."""
    labels: dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]] | None = None
    """Labels of the PodMonitor, for the podMonitorSelector of the Prometheus that should pick it
    up (kube-prometheus-stack selects `release: <its release>`)."""
    nats_exporter: NatsExporterSpec = Field(default_factory=NatsExporterSpec)
    """The broker's metrics, through the NATS Prometheus exporter."""

    @field_validator("labels")
    @classmethod
    def _qualified_keys(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key in labels or {}:
            if problem := qualified_key_problem(key):
                raise ValueError(problem)
        return labels
