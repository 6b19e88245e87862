"""The managed NATS JetStream broker: a one-pod StatefulSet and its headless Service."""

from typing import Any

from hooks.api.graph import InferaDeployment
from hooks.renderers import security
from hooks.runtime import NATS_CLIENT_PORT, NATS_TOKEN_ENV
from hooks.vocabulary import COMPONENT_LABEL, NATS_SUFFIX, child_name, object_metadata, selector_labels

MONITOR_PORT = 8222
# The NATS Prometheus exporter's (spec.monitoring.natsExporter).
EXPORTER_CONTAINER = "nats-exporter"
EXPORTER_PORT = 7777
EXPORTER_PORT_NAME = "metrics"
STORE_DIR = "/data/jetstream"
DATA_VOLUME = "data"


# The broker's token in every container that needs it: the broker's `--auth`, and the clients'
# NATS URLs, through kubelet's `$(VAR)` expansion.


def token_env(idep: InferaDeployment) -> list[dict[str, Any]]:
    """The variable the broker's token is read into, from its Secret (before any that uses it)."""
    ref = idep.spec.nats.token_secret_ref
    if not idep.spec.nats.deploy or ref is None:
        return []
    return [{"name": NATS_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def broker_metadata(idep: InferaDeployment) -> dict[str, Any]:
    """The metadata of the broker's children: labelled as the upstream operator labels its
    broker (never in the selector: that is immutable)."""
    metadata = object_metadata(idep, NATS_SUFFIX)
    metadata["labels"][COMPONENT_LABEL] = "nats"
    return metadata


def nats_exporter(idep: InferaDeployment) -> list[dict[str, Any]]:
    """The exporter container of the broker's pod, when asked for: it reads nats-server's
    monitoring port over loopback."""
    monitoring = idep.spec.monitoring
    if monitoring is None or not monitoring.nats_exporter.enabled:
        return []
    return [
        {
            "name": EXPORTER_CONTAINER,
            "image": monitoring.nats_exporter.effective_image,
            # Server, connection and JetStream statistics (every stream and consumer: a graph's
            # broker holds a few), as the exporter's flags spell them (main.go at v0.20.1, the
            # pinned release; the Go module proxy serves no copy for a test to run).
            "args": [
                "-varz",
                "-connz",
                "-jsz=all",
                f"-port={EXPORTER_PORT}",
                f"http://localhost:{MONITOR_PORT}",
            ],
            "ports": [{"name": EXPORTER_PORT_NAME, "containerPort": EXPORTER_PORT, "protocol": "TCP"}],
            # Its listener only: the broker's pod is ready when every container is, and whether
            # the exporter reaches nats-server must not decide whether clients reach the broker.
            "readinessProbe": {
                "tcpSocket": {"port": EXPORTER_PORT_NAME},
                "periodSeconds": 10,
                "timeoutSeconds": 1,
                "failureThreshold": 3,
                "successThreshold": 1,
            },
            "livenessProbe": {
                "tcpSocket": {"port": EXPORTER_PORT_NAME},
                "periodSeconds": 30,
                "timeoutSeconds": 5,
                "failureThreshold": 3,
                "successThreshold": 1,
            },
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            "securityContext": security.restricted_container(),
        }
    ]


def render(idep: InferaDeployment) -> list[dict]:
    if not idep.spec.nats.deploy:
        return []
    nats = idep.spec.nats
    name = child_name(idep, NATS_SUFFIX)
    metadata = broker_metadata(idep)
    claim_spec: dict = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": nats.storage_size}},
        "volumeMode": "Filesystem",
    }
    if nats.storage_class_name:
        claim_spec["storageClassName"] = nats.storage_class_name
    command = [
        "nats-server",
        "--jetstream",
        "--store_dir",
        STORE_DIR,
        "--port",
        str(NATS_CLIENT_PORT),
        "--http_port",
        str(MONITOR_PORT),
    ]
    # The monitoring port answers without it: the probes need none.
    token = token_env(idep)
    if token:
        command += ["--auth", f"$({NATS_TOKEN_ENV})"]
    container: dict = {
        "name": "nats",
        "image": nats.effective_image,
        "command": command,
        "ports": [
            {"name": "client", "containerPort": NATS_CLIENT_PORT, "protocol": "TCP"},
            {"name": "monitor", "containerPort": MONITOR_PORT, "protocol": "TCP"},
        ],
        # Ready once JetStream has loaded its store (/healthz checks every stream). Alive while
        # JetStream is on, however busy or long its recovery (js-enabled-only checks no stream),
        # with the timing of NATS's own Helm chart: a busy broker is not restarted for being busy.
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "monitor", "scheme": "HTTP"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz?js-enabled-only=true", "port": "monitor", "scheme": "HTTP"},
            "initialDelaySeconds": 10,
            "periodSeconds": 30,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        # KV events and, with the NATS request transport, every request: a small broker.
        # Requests, no limits: a burst may use what the node has spare.
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
        # nats-server writes its store only: a read-only root needs no scratch.
        "securityContext": security.restricted_container(),
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": "/data"}],
    }
    if token:
        container["env"] = token
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "serviceName": name,
            # The JetStream store holds only transient KV events: it goes with the graph
            # unless the user asks to keep it.
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain" if nats.retain_storage else "Delete",
                "whenScaled": "Retain",
            },
            "selector": {"matchLabels": selector_labels(idep, NATS_SUFFIX)},
            "template": {
                "metadata": {"labels": dict(metadata["labels"])},
                # The broker never calls the API server.
                "spec": {
                    "containers": [container, *nats_exporter(idep)],
                    "automountServiceAccountToken": False,
                    "securityContext": security.pod_context(claims=True),
                },
            },
            # Written as the API server stores it: Metacontroller replaces this list wholesale,
            # so a template without the server's defaults would be re-applied on every sync.
            # Once the StatefulSet exists its stored templates are kept (hooks/immutable.py).
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": DATA_VOLUME},
                    "spec": claim_spec,
                    "status": {"phase": "Pending"},
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(metadata["labels"])},
        "spec": {
            # Headless: the StatefulSet's governing Service; clients resolve straight to the pod.
            "clusterIP": "None",
            "selector": selector_labels(idep, NATS_SUFFIX),
            "ports": [
                {"name": "client", "port": NATS_CLIENT_PORT, "targetPort": "client", "protocol": "TCP"},
                {"name": "monitor", "port": MONITOR_PORT, "targetPort": "monitor", "protocol": "TCP"},
            ],
        },
    }
    return [statefulset, service]
