"""Each renderer called directly: a parsed InferaDeployment in, exact Kubernetes objects out.

The graph tests (tests/graph: test_sync_graph, test_gaie, test_multinode, ...) pin whole graphs
through the hook app; these pin each renderer function on small inline specs, with edge cases a whole graph
does not reach. Every emitted object is validated against its strict schema.
"""

import copy
import math
from typing import Any

import pytest

from hooks import runtime, vocabulary
from hooks.api.fields import SpecError
from hooks.api.graph import ChildPatch
from hooks.contract import Registration
from hooks.limits import RenderedSize
from hooks.render import render_children
from hooks.renderers import autoscaling, discovery, env, gaie, nats, overlay, pods, probes, services, workloads
from hooks.renderers.patches import apply_patches
from hooks.runtime import Process, client_url
from hooks.vocabulary import graph_selector
from tests.support.inline_specs import GAIE, SERVER, WORKER, build, labels, selector, valid
from tests.support.pod_security import RESTRICTED_CONTAINER

ETCD: dict[str, Any] = {"discoveryBackend": "etcd", "etcdEndpoint": "etcd:2379"}
ONE_AT_A_TIME = {"maxSurge": 0, "maxUnavailable": 1}
READY = {"name": "INFERA_ENGINE_READY_TIMEOUT", "value": "7200"}
NATS_ENV = {"name": "NATS_SERVER", "value": "nats://g-nats:4222"}
SELECTOR_ENV = {"name": "INFERA_K8S_LABEL_SELECTOR", "value": "infera.amd.com/deployment=g"}
FIELDS = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}
POD_ENV = [{"name": k, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": v}}} for k, v in FIELDS.items()]
PRESTOP = {"preStop": {"exec": {"command": ["sleep", "15"]}}}
SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}
SHM_VOLUME = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
BOOT_MOUNT = {"name": "boot-config", "mountPath": "/boot", "readOnly": True}
BOOT_VOLUME = {"name": "boot-config", "hostPath": {"path": "/boot", "type": "Directory"}}
PROBES = {"startupProbe", "livenessProbe", "readinessProbe"}
HOME_ENV = {"name": "HOME", "value": "/tmp"}
SCRATCH_MOUNT = {"name": "infera-tmp", "mountPath": "/tmp"}
SCRATCH_VOLUME = {"name": "infera-tmp", "emptyDir": {}}


def test_kubernetes_discovery_grants_exactly_what_the_runtime_uses() -> None:
    """Routers list and watch Pods; workers patch their own Pod (infera/common/
    registration_k8s.py); neither may touch the InferaDeployment unless a router serves the
    scaling API. A verb too few breaks discovery or registration, one too many is a needless
    grant. The routers' selector must match every pod of the graph, servers and workers alike."""
    idep = build({"router": SERVER, "worker": WORKER}, metadata={"namespace": "team-a"})
    objects = discovery.render(idep, scaling_api=False)
    rules = {"disc": ["list", "watch"], "register": ["patch"]}
    for (account, role, binding), suffix in zip((objects[:3], objects[3:]), ("disc", "register"), strict=True):
        metadata = {"name": f"g-{suffix}", "labels": labels("disc")}
        assert account == {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata}
        assert (role["kind"], role["metadata"]) == ("Role", metadata)
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": rules[suffix]}]
        assert (binding["kind"], binding["metadata"], binding["roleRef"]["name"]) == (
            "RoleBinding",
            metadata,
            f"g-{suffix}",
        )
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"g-{suffix}", "namespace": "team-a"}]
    assert discovery.service_account_name(idep) == "g-epp"  # the Endpoint Picker's, with the gateway
    assert discovery.service_account_name(idep, idep.spec.services["router"]) == "g-disc"
    assert discovery.service_account_name(idep, idep.spec.services["worker"]) == "g-register"
    assert graph_selector(idep) == "infera.amd.com/deployment=g"
    key, _, value = graph_selector(idep).partition("=")
    for service, svc in idep.spec.services.items():
        assert pods.pod_metadata(idep, service, svc)["labels"][key] == value
    valid(*objects)


def test_etcd_discovery_renders_no_identity() -> None:
    """With etcd nothing watches the API: no RBAC objects, no account name, and pods name
    `default` explicitly (a dropped field would leave them on the deleted discovery account),
    with no token mounted, unless a template names an account of its own or asks for it."""
    idep = build(**ETCD, gaie=GAIE)
    assert (discovery.render(idep, scaling_api=True), discovery.service_account_name(idep)) == ([], None)
    for service, svc in idep.spec.services.items():
        spec = pods.pod_template(idep, service, svc)["spec"]
        assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("default", False)
    picker = gaie.epp_deployment(idep)["spec"]["template"]["spec"]
    assert (picker["serviceAccountName"], picker["automountServiceAccountToken"]) == ("default", False)
    for extra, expected in (
        ({"serviceAccountName": "mine"}, ("mine", None)),
        ({"automountServiceAccountToken": True}, ("default", True)),
    ):
        own = build(**ETCD, services={"worker": {**WORKER, "extraPodSpec": extra}})
        spec = pods.pod_template(own, "worker", own.spec.services["worker"])["spec"]
        assert (spec["serviceAccountName"], spec.get("automountServiceAccountToken")) == expected
    # Kubernetes discovery: every process calls the API server, even on an account a template
    # names `default`.
    idep = build({"worker": WORKER, "own": {**WORKER, "extraPodSpec": {"serviceAccountName": "default"}}}, gaie=GAIE)
    specs = [pods.pod_template(idep, s, svc)["spec"] for s, svc in idep.spec.services.items()]
    specs.append(gaie.epp_deployment(idep)["spec"]["template"]["spec"])
    assert [spec["serviceAccountName"] for spec in specs] == ["g-register", "default", "g-epp"]
    assert all("automountServiceAccountToken" not in spec for spec in specs)


def test_managed_broker() -> None:
    """The broker's selector is identity only (a StatefulSet selector is immutable), its store is
    kept on request, the default StorageClass is left alone, and processes get the client url."""
    idep = build(nats={"storageSize": "2048Mi", "retainStorage": True})
    statefulset, service = nats.render(idep)
    assert client_url(idep) == "nats://g-nats:4222"
    broker_labels = {**labels("nats"), "infera.amd.com/component": "nats"}
    spec = statefulset["spec"]
    assert (statefulset["metadata"], spec["template"]["metadata"]) == (
        {"name": "g-nats", "labels": broker_labels},
        {"labels": broker_labels},
    )
    assert spec["selector"] == {"matchLabels": selector("nats")}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert spec["volumeClaimTemplates"][0]["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "2Gi"}},  # canonical, as the API server stores it
        "volumeMode": "Filesystem",
    }
    # No token (the broker never calls the API server); requests, no limits; alive while
    # JetStream is on, however busy, with NATS's own chart's timing.
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}}
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz?js-enabled-only=true", "port": "monitor", "scheme": "HTTP"},
        "initialDelaySeconds": 10,
        "periodSeconds": 30,
        "timeoutSeconds": 5,
        "failureThreshold": 3,
        "successThreshold": 1,
    }
    # The governing Service: the StatefulSet's serviceName, headless, selecting the broker pod.
    assert service["metadata"] == {"name": spec["serviceName"], "labels": broker_labels}
    assert (service["spec"]["clusterIP"], service["spec"]["selector"]) == ("None", selector("nats"))
    valid(statefulset, service)


@pytest.mark.parametrize("envs", [None, [{"name": "NATS_SERVER", "value": "nats://broker.infra:4222"}]])
def test_no_managed_broker(envs: list[dict[str, str]] | None) -> None:
    """nats.deploy false: no broker and no client url; an external broker named in spec.envs
    reaches every process unchanged, and the operator adds no NATS_SERVER of its own."""
    idep = build(nats={"deploy": False}, envs=envs)
    assert (nats.render(idep), client_url(idep)) == ([], None)
    for process in Process:
        assert [var for var in env.operator_env(idep, process) if var["name"] == "NATS_SERVER"] == (envs or [])


def test_server_service_targets_the_server_pods_only() -> None:
    """A server's Service targets its port by number (a template may rename the container port)
    and selects by identity: its own pods, never the workers'. Workers get no Service."""
    idep = build({"router": {**SERVER, "port": 9000}, "worker": WORKER})
    router = idep.spec.services["router"]
    service = services.server_service(idep, "router", router)
    assert service == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "g-router", "labels": labels("router")},
        "spec": {
            "type": "ClusterIP",
            "selector": selector("router"),
            "ports": [{"name": "http", "port": 9000, "targetPort": 9000, "protocol": "TCP"}],
        },
    }
    chosen = service["spec"]["selector"].items()
    assert chosen <= pods.pod_metadata(idep, "router", router)["labels"].items()
    assert not chosen <= pods.pod_metadata(idep, "worker", idep.spec.services["worker"])["labels"].items()
    assert [c["metadata"]["name"] for c in render_children(idep) if c["kind"] == "Service"] == ["g-nats", "g-router"]
    valid(service)


@pytest.mark.parametrize(
    ("pool", "strategy"),
    [
        ({**WORKER, "resources": {"gpu": 8}}, {"type": "RollingUpdate", "rollingUpdate": ONE_AT_A_TIME}),
        (WORKER, {"type": "RollingUpdate", "rollingUpdate": ONE_AT_A_TIME}),  # every worker pool, GPU or not
        (SERVER, None),
    ],
)
def test_deployment_rollout(pool: dict[str, Any], strategy: dict[str, Any] | None) -> None:
    """A GPU node is usually full: a surge pod would wait forever for the GPU its predecessor
    holds, so worker pools replace one pod at a time. A router keeps the default rollout."""
    idep = build({"pool": {**pool, "replicas": 3}, "other": WORKER})
    deployment = workloads.workload(idep, "pool", idep.spec.services["pool"])
    assert deployment["metadata"] == {"name": "g-pool", "labels": labels("pool")}
    assert (deployment["spec"]["replicas"], deployment["spec"]["selector"]) == (3, {"matchLabels": selector("pool")})
    assert deployment["spec"].get("strategy", None) == strategy
    # What status and teardown look for: workload() and the vocabulary must agree on the kind.
    assert vocabulary.workload_kind(idep.spec.services["pool"]) == deployment["kind"] == "Deployment"
    valid(deployment)


def test_leader_worker_set_groups_ranks_and_only_the_leader_serves() -> None:
    """numberOfNodes ranks per group, `replicas` groups, replaced whole; only rank 0 serves HTTP:
    it alone has probes, the GAIE frontend sidecar and the pool's label, while every rank gets
    the preStop delay and a grace period its drain fits in."""
    idep = build({"pool": {**WORKER, "numberOfNodes": 3, "replicas": 2, "resources": {"gpu": 8}}}, gaie=GAIE)
    svc = idep.spec.services["pool"]
    lws = workloads.workload(idep, "pool", svc)
    assert lws["kind"] == vocabulary.workload_kind(svc) == "LeaderWorkerSet"
    assert lws["metadata"] == {"name": "g-pool", "labels": labels("pool")}
    valid(lws)
    spec = copy.deepcopy(lws["spec"])
    template = spec.pop("leaderWorkerTemplate")
    assert spec == {
        "replicas": 2,
        "startupPolicy": "LeaderCreated",
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": ONE_AT_A_TIME},
    }
    leader, rank = template.pop("leaderTemplate"), template.pop("workerTemplate")
    assert template == {"size": 3, "restartPolicy": "RecreateGroupOnPodRestart"}
    assert leader == pods.pod_template(idep, "pool", svc, leader=True)
    assert [c["name"] for c in leader["spec"]["containers"]] == ["infera", "infera-frontend"]
    assert [c["name"] for c in rank["spec"]["containers"]] == ["infera"]
    assert leader["metadata"]["labels"] == {**rank["metadata"]["labels"], "infera.amd.com/gaie-frontend": "true"}
    assert (PROBES & set(leader["spec"]["containers"][0]), PROBES & set(rank["spec"]["containers"][0])) == (
        PROBES,
        set(),
    )
    for pod in (leader, rank):
        assert (pod["spec"]["containers"][0]["lifecycle"], pod["spec"]["terminationGracePeriodSeconds"]) == (
            PRESTOP,
            120,
        )


def test_primary_container() -> None:
    """The flat fields become the `infera` container (scripts run kubectl logs -c infera): a
    GPU's request equals its limit (Kubernetes refuses anything else for a device) and every
    quantity is canonical, or the stored object would differ from the rendered one forever."""
    resources = {"gpu": 4, "gpuType": "nvidia.com/gpu", "cpu": "2000m", "memory": "2048Mi", "sharedMemory": "16Gi"}
    idep = build({"w": {**WORKER, "image": "eng:2", "port": 31000, "args": ["--x"], "resources": resources}})
    svc = idep.spec.services["w"]
    assert pods.primary_container(idep, svc, [SHM_MOUNT]) == {
        "name": "infera",
        "image": "eng:2",
        "command": runtime.worker_command(idep, svc),
        "ports": [{"name": "http", "containerPort": 31000, "protocol": "TCP"}],
        "env": env.service_env(idep, svc),
        "args": ["--x"],
        "resources": {
            "requests": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "4"},
            "limits": {"nvidia.com/gpu": "4"},
        },
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [SHM_MOUNT],
    }


@pytest.mark.parametrize(
    ("svc", "mounts", "volumes"),
    [
        (WORKER, [BOOT_MOUNT], [BOOT_VOLUME]),
        ({**WORKER, "resources": {"sharedMemory": "16Gi"}}, [SHM_MOUNT, BOOT_MOUNT], [SHM_VOLUME, BOOT_VOLUME]),
        # A template decides about /boot for itself; /dev/shm still comes from the flat field.
        ({**WORKER, "resources": {"sharedMemory": "16Gi"}, "extraPodSpec": {}}, [SHM_MOUNT], [SHM_VOLUME]),
        ({**WORKER, "extraPodSpec": {"nodeSelector": {"gpu": "mi300"}}}, None, None),
        ({**WORKER, "hostBoot": False}, None, None),
        ({**SERVER, "resources": {"sharedMemory": "16Gi"}}, [SHM_MOUNT, SCRATCH_MOUNT], [SHM_VOLUME, SCRATCH_VOLUME]),
        (SERVER, [SCRATCH_MOUNT], [SCRATCH_VOLUME]),
    ],
    ids=["worker", "worker-shm", "template-shm", "template", "no-host-boot", "server-shm", "server"],
)
def test_shm_and_boot_volumes(svc: dict[str, Any], mounts: list[dict] | None, volumes: list[dict] | None) -> None:
    """/dev/shm only when sharedMemory is set; /boot (the runtime's GPU-direct checks read the
    node's kernel config) only on workers rendered from the flat fields, unless hostBoot is
    false; a server's scratch /tmp (its root is read-only); never an empty list."""
    idep = build({"svc": svc, "other": WORKER})
    deployment = workloads.workload(idep, "svc", idep.spec.services["svc"])
    spec = deployment["spec"]["template"]["spec"]
    assert (spec["containers"][0].get("volumeMounts"), spec.get("volumes")) == (mounts, volumes)
    valid(deployment)


@pytest.mark.parametrize("gaie_on", [False, True])
def test_pod_labels_precedence_and_the_frontend_label(gaie_on: bool) -> None:
    """Parent's infera* labels, then podLabels, then identity: no one spoofs identity or the GAIE
    frontend label (it would put a pod in the InferencePool); only the operator sets that, on
    serving worker pods with GAIE on. No annotations key without annotations."""
    spoof = {"infera.amd.com/gaie-frontend": "true", "infera.amd.com/component": "server"}
    idep = build(
        {"w": {**WORKER, "podLabels": {"inferaZone": "b", **spoof}}, "s": {**SERVER, "podLabels": spoof}},
        metadata={"labels": {"infera.amd.com/tier": "gold", "inferaZone": "a", "team": "x", **spoof}},
        gaie=GAIE if gaie_on else None,
    )
    frontend = {"infera.amd.com/gaie-frontend": "true"} if gaie_on else {}
    inherited = {"infera.amd.com/tier": "gold", "inferaZone": "a"}
    worker = pods.pod_template(idep, "w", idep.spec.services["w"])["metadata"]
    server = pods.pod_template(idep, "s", idep.spec.services["s"])["metadata"]
    expected = {**inherited, "inferaZone": "b", **labels("w"), "infera.amd.com/component": "worker", **frontend}
    assert worker == {"labels": expected}
    assert server == {"labels": {**inherited, **labels("s"), "infera.amd.com/component": "server"}}


@pytest.mark.parametrize(
    ("svc", "grace"),
    [
        ({"args": ["--drain-timeout", "600"]}, 665),  # 15 s preStop + 600 s drain + 50 s teardown
        ({"env": [{"name": "INFERA_DRAIN_TIMEOUT", "value": "200"}]}, 265),
        ({"extraPodSpec": {"terminationGracePeriodSeconds": 900}}, 900),  # the template's own is kept...
        ({"extraPodSpec": {"terminationGracePeriodSeconds": 30}}, 120),  # ...but only ever raised
    ],
)
def test_grace_period_fits_the_drain(svc: dict[str, Any], grace: int) -> None:
    """SIGKILL must never cut a drain short: the grace period covers preStop, the drain
    (--drain-timeout, else INFERA_DRAIN_TIMEOUT) and the teardown."""
    idep = build({"w": {**WORKER, **svc}})
    assert pods.pod_template(idep, "w", idep.spec.services["w"])["spec"]["terminationGracePeriodSeconds"] == grace


def test_template_values_are_kept_and_completed() -> None:
    """extraPodSpec's own probe, preStop and service account win; what it lacks is added."""
    prestop = {"preStop": {"exec": {"command": ["sleep", "40"]}}}
    readiness = probes.probe(probes.http_get("/ready", 30000), period=5, timeout=1, failures=2)
    own = {"name": "infera", "readinessProbe": readiness, "lifecycle": prestop}
    idep = build({"w": {**WORKER, "extraPodSpec": {"serviceAccountName": "mine", "containers": [own]}}})
    spec = pods.pod_template(idep, "w", idep.spec.services["w"])["spec"]
    (main,) = spec["containers"]
    assert (main["readinessProbe"], main["lifecycle"], spec["serviceAccountName"]) == (readiness, prestop, "mine")
    added = probes.worker_probes(30000, main["env"])
    assert (main["startupProbe"], main["livenessProbe"]) == (added["startupProbe"], added["livenessProbe"])


def test_last_wins_keeps_first_position_and_last_value() -> None:
    """Users override what the operator injects without producing duplicate names."""
    a1, b2, a3 = ({"name": name, "value": value} for name, value in (("A", "1"), ("B", "2"), ("A", "3")))
    assert env.last_wins([a1, b2, a3]) == [a3, b2]


@pytest.mark.parametrize(
    ("process", "spec", "expected"),
    [
        (Process.WORKER, {}, [READY, NATS_ENV, *POD_ENV]),
        (Process.SERVER, {}, [HOME_ENV, NATS_ENV, *POD_ENV, SELECTOR_ENV]),
        (Process.FRONTEND, {"nats": {"deploy": False}}, [HOME_ENV, *POD_ENV, SELECTOR_ENV]),
        (Process.EPP, ETCD, [HOME_ENV, NATS_ENV, *POD_ENV]),
        (Process.WORKER, {**ETCD, "nats": {"deploy": False}}, [READY, *POD_ENV]),
    ],
)
def test_operator_env_per_process(process: Process, spec: dict[str, Any], expected: list[dict]) -> None:
    """A worker gets its model-load budget first (so a later value wins); only routers get the
    selector, and only under Kubernetes discovery; NATS_SERVER only with the managed broker; a
    router's HOME is its scratch /tmp (its user has none on the read-only root), first, so a
    user's HOME wins."""
    assert env.operator_env(build(**spec), process) == expected


def test_spec_envs_sit_between_the_budget_and_the_runtimes_variables() -> None:
    """As docs/pods.md orders them: spec.envs may raise the budget (which keeps its first place),
    but the broker url and pod identity the runtime reads are the operator's."""
    envs = [{"name": "HF_HOME", "value": "/m"}, {"name": "POD_IP", "value": "1.2.3.4"}, READY | {"value": "9000"}]
    expected = [READY | {"value": "9000"}, {"name": "HF_HOME", "value": "/m"}, POD_ENV[2], NATS_ENV, *POD_ENV[:2]]
    assert env.operator_env(build(envs=envs), Process.WORKER) == expected


def test_service_env_overrides_everything() -> None:
    """The service's env wins over all, in the overridden variable's place (an empty value is
    stored as absent, a fieldRef with the apiVersion the API server defaults)."""
    host = {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}
    extra = [READY | {"value": "14400"}, {"name": "EMPTY", "value": ""}, host]
    idep = build({"w": {**WORKER, "env": extra}, "s": {**SERVER, "env": [SELECTOR_ENV | {"value": "x=y"}]}})
    assert env.service_env(idep, idep.spec.services["w"]) == [
        READY | {"value": "14400"},
        NATS_ENV,
        *POD_ENV,
        {"name": "EMPTY"},
        {"name": "HOST", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.hostIP"}}},
    ]
    assert env.service_env(idep, idep.spec.services["s"]) == [
        HOME_ENV,
        NATS_ENV,
        *POD_ENV,
        SELECTOR_ENV | {"value": "x=y"},
    ]


@pytest.mark.parametrize("delay", [0, 7])
def test_probe_writes_every_timing(delay: int) -> None:
    """As the API server stores a probe (successThreshold included, a zero delay omitted): the
    stored probe never differs from the rendered one."""
    expected = {"exec": {"command": ["true"]}, "periodSeconds": 3, "timeoutSeconds": 2, "failureThreshold": 4}
    expected |= {"successThreshold": 1} | ({"initialDelaySeconds": delay} if delay else {})
    assert probes.probe({"exec": {"command": ["true"]}}, period=3, timeout=2, failures=4, delay=delay) == expected


def startup_failures(ready_timeout: int) -> int:
    """The wrapper's wait (never below the operator's budget) plus its own start, in periods."""
    load = max(runtime.MODEL_LOAD_SECONDS, ready_timeout) + runtime.STARTUP_SLACK_SECONDS
    return math.ceil(load / runtime.STARTUP_PERIOD_SECONDS)


@pytest.mark.parametrize(
    ("value", "seconds", "literal"),
    [
        (None, 7200, 750),
        ("14400", 14400, 1470),
        ("7201.5", 7202, 751),  # rounded up
        ("600", 600, 750),  # a shorter wait never shortens the probe
        ("soon", 7200, 750),  # unreadable: the wrapper keeps its default
        ("30000000000", 86400, 8670),  # a typo: a day at most, so the threshold fits an int32
    ],
)
def test_startup_probe_outlasts_the_model_load(value: str | None, seconds: int, literal: int) -> None:
    """A model load is never killed: the startup failureThreshold follows a raised
    INFERA_ENGINE_READY_TIMEOUT; liveness and readiness keep their fixed timings."""
    env_vars = [] if value is None else [{"name": "INFERA_ENGINE_READY_TIMEOUT", "value": value}]
    rendered = probes.worker_probes(31000, env_vars)
    assert rendered["startupProbe"]["failureThreshold"] == startup_failures(seconds) == literal
    health = {"httpGet": {"path": "/health", "port": 31000, "scheme": "HTTP"}}
    assert rendered == {
        "startupProbe": probes.probe(health, period=10, timeout=10, failures=literal),
        "livenessProbe": probes.probe(health, period=20, timeout=10, failures=9),
        "readinessProbe": probes.probe(health, period=15, timeout=10, failures=6, delay=15),
    }


def test_epp_readiness_is_grpc_and_no_two_probes_share_a_dict() -> None:
    """The picker answers gRPC health, not HTTP. A dict shared between probes would be patched
    twice by one JSON patch and dumped as a YAML alias."""
    grpc = {"grpc": {"port": 9003, "service": "inference-extension"}}
    assert probes.epp_readiness() == probes.probe(grpc, period=10, timeout=5, failures=3)
    assert probes.epp_readiness()["successThreshold"] == 1
    rendered = [*probes.worker_probes(30000, []).values(), *probes.worker_probes(30000, []).values()]
    rendered += [probes.epp_readiness(), probes.epp_readiness(), probes.prestop(), probes.prestop()]
    nested = [d for probe in rendered for d in (probe, *(v for v in probe.values() if isinstance(v, dict)))]
    assert len({id(d) for d in nested}) == len(nested)


def test_gateway_objects() -> None:
    """The pool selects exactly the pods with the frontend sidecar and targets its port (not the
    engine's); the route defaults to the parent's namespace; all are labelled as the epp part,
    so that an unregistered kind withholds the gateway as one unit."""
    idep = build(gaie=GAIE)
    deployment, service, pool, route = gaie.render(idep)
    epp_metadata = {"name": "g-epp", "labels": labels("epp")}
    assert deployment["metadata"] == service["metadata"] == epp_metadata
    assert service["spec"]["selector"] == selector("epp")
    assert pool == {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "g-pool", "labels": labels("epp")},
        "spec": {
            "selector": {"matchLabels": {"infera.amd.com/deployment": "g", "infera.amd.com/gaie-frontend": "true"}},
            "targetPorts": [{"number": 8100}],
            "endpointPickerRef": {"kind": "Service", "name": "g-epp", "port": {"number": 9002}},
        },
    }
    assert route["metadata"] == {"name": "g-route", "labels": labels("epp")}
    assert route["spec"]["parentRefs"][0]["namespace"] == "ml" and "hostnames" not in route["spec"]
    (epp,) = deployment["spec"]["template"]["spec"]["containers"]
    assert (epp["env"], epp["readinessProbe"]) == (env.operator_env(idep, Process.EPP), probes.epp_readiness())
    # Restarted after a minute without a gRPC health answer; a router's share of the node.
    assert (epp["livenessProbe"], epp["resources"]) == (
        {
            "grpc": {"port": 9003, "service": "inference-extension"},
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        {"requests": {"cpu": "500m", "memory": "1Gi"}},
    )
    worker_labels = pods.pod_metadata(idep, "worker", idep.spec.services["worker"])["labels"]
    assert not pool["spec"]["selector"]["matchLabels"].items() <= worker_labels.items()  # the pod template adds it
    valid(deployment, service, pool, route)


def test_frontend_sidecar() -> None:
    """The gateway's way into a worker pod: a direct-mode router on the frontend port that
    outlives its removal from the pool (preStop), is ready once it serves /v1/models, is
    restarted after a minute without an answer on /health, and asks for a router's share."""
    idep = build(gaie={**GAIE, "eppImage": "epp:3"})
    assert gaie.frontend_sidecar(idep) == {
        "name": "infera-frontend",
        "image": "epp:3",
        "command": runtime.frontend_command(idep),
        "ports": [{"name": "frontend", "containerPort": 8100, "protocol": "TCP"}],
        "env": [HOME_ENV, NATS_ENV, *POD_ENV, SELECTOR_ENV],
        "lifecycle": PRESTOP,
        "readinessProbe": probes.router_readiness("/v1/models", 8100),
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": 8100, "scheme": "HTTP"},
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
            "successThreshold": 1,
        },
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
        # Restricted on its own in a worker's pod, which is not.
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [SCRATCH_MOUNT],
    }
    assert gaie.render(build()) == []


def test_without_gateway_drops_only_gaie_and_its_patches() -> None:
    """The fallback graph keeps every other setting (gaie's fields too, for when it comes back)
    and every patch not aimed at a gateway object, judged by kind and name (a worker pool called
    `pool` is a Deployment named like the InferencePool); no patch left is None, not []."""
    check = [{"op": "test", "path": "/kind", "value": "Deployment"}]
    on_worker, on_epp, on_pool_workers = (
        {"target": {"kind": "Deployment", "name": name}, "patch": check} for name in ("g-worker", "g-epp", "g-pool")
    )
    idep = build(gaie=GAIE, patches=[on_epp, on_worker, on_pool_workers])
    off = gaie.without_gateway(idep, gaie.render(idep))
    assert off.spec.gaie.model_dump() == {**idep.spec.gaie.model_dump(), "enabled": False}
    assert off.spec.patches == [ChildPatch.model_validate(on_worker), ChildPatch.model_validate(on_pool_workers)]
    only_epp = build(gaie=GAIE, patches=[on_epp])
    assert gaie.without_gateway(only_epp, gaie.render(only_epp)).spec.patches is None
    assert idep.spec.gaie.enabled and len(idep.spec.patches or []) == 3  # the input is left as it was


def test_overlay_merges_containers_by_name() -> None:
    """The template's containers in its order; the operator's primary merged into the one of the
    same name (env by name, the template winning), its sidecar kept; a GPU gets one value for
    request and limit, canonical; an unnamed extra container is a SpecError naming it."""
    gpus = {"requests": {"memory": "1Gi", "amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}}
    main = {"name": "infera", "image": "op", "env": [{"name": "A", "value": "op"}, {"name": "B", "value": "op"}]}
    operator = {"containers": [{**main, "resources": gpus}, {"name": "infera-frontend", "image": "fe"}]}
    template = {
        "containers": [
            {"name": "log", "image": "fluent"},
            {"name": "infera", "env": [{"name": "B", "value": 8}], "resources": {"limits": {"amd.com/gpu": 2}}},
        ]
    }
    where = "spec.services.w.extraPodSpec"
    merged = overlay.normalize(overlay.overlay(operator, template, where), where)
    main |= {"env": [{"name": "B", "value": "8"}, {"name": "A", "value": "op"}]}
    main["resources"] = {"requests": {"memory": "1Gi", "amd.com/gpu": "2"}, "limits": {"amd.com/gpu": "2"}}
    assert merged == {
        "containers": [{"name": "log", "image": "fluent"}, main, {"name": "infera-frontend", "image": "fe"}]
    }
    with pytest.raises(SpecError, match=r"^spec\.services\.w\.extraPodSpec\.containers\[1\] needs a name$"):
        overlay.overlay(operator, {"containers": [{"name": "infera"}, {"image": "x"}]}, where)


@pytest.mark.parametrize(
    ("operations", "message"),
    [
        ([{"op": "add", "path": "/spec/x/y", "value": 1}], "operation 0 (add /spec/x/y): path not found"),
        (
            [{"op": "replace", "path": "/metadata/name", "value": "other"}],
            "a patch must not change apiVersion, kind, metadata.name or the identity labels",
        ),
    ],
    ids=["missing-path", "renames"],
)
def test_a_failing_patch_names_its_index(operations: list[dict], message: str) -> None:
    """SpecError names patches[i] (reported in status), and the children handed in are left
    untouched, even the one an earlier patch changed: a patched child is a copy."""
    children, sizes = render_children(build()), RenderedSize()
    for child in children:
        sizes.add(child)
    before = copy.deepcopy(children)
    node_selector = [{"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"gpu": "mi300"}}]
    patches = [
        ChildPatch.model_validate({"target": {"kind": "Deployment", "name": "g-worker"}, "patch": ops})
        for ops in (node_selector, operations)
    ]
    with pytest.raises(SpecError) as raised:
        apply_patches(patches, children, sizes)
    assert str(raised.value) == f"patches[1] (Deployment g-worker): {message}"
    assert children == before


def test_render_children_order_is_stable() -> None:
    """Plumbing first (discovery, broker and its policy, gateway), then services by name, a server's Service
    after its workload: the same answer whatever order the services were written in."""
    idep = build({"zeta": WORKER, "alpha": SERVER, "mid": {**WORKER, "numberOfNodes": 2}}, gaie=GAIE)
    children = render_children(idep)
    assert [f"{c['kind']}/{c['metadata']['name']}" for c in children] == (
        "ServiceAccount/g-disc Role/g-disc RoleBinding/g-disc ServiceAccount/g-epp Role/g-epp RoleBinding/g-epp "
        "ServiceAccount/g-register Role/g-register RoleBinding/g-register StatefulSet/g-nats Service/g-nats "
        "NetworkPolicy/g-nats Deployment/g-epp "
        "Service/g-epp InferencePool/g-pool HTTPRoute/g-route Deployment/g-alpha Service/g-alpha "
        "LeaderWorkerSet/g-mid PodDisruptionBudget/g-mid Deployment/g-zeta PodDisruptionBudget/g-zeta"
    ).split()
    reordered = {"mid": {**WORKER, "numberOfNodes": 2}, "alpha": SERVER, "zeta": WORKER}
    assert render_children(build(reordered, gaie=GAIE)) == children
    valid(*children)


def test_a_refused_gateway_kind_renders_the_graph_as_with_gaie_off() -> None:
    """GAIE is all or nothing: when the controller cannot create an InferencePool, no pod gets a
    sidecar and no router goes direct; the gateway objects follow, unpatched, to be named."""
    patches = [
        {"target": {"kind": "Deployment", "name": name}, "patch": [{"op": "add", "path": path, "value": value}]}
        for name, path, value in (
            ("g-worker", "/spec/template/spec/nodeSelector", {"a": "b"}),
            ("g-epp", "/spec/paused", True),
        )
    ]
    graph = {"router": SERVER, "worker": WORKER}
    idep = build(graph, gaie=GAIE, patches=patches)
    every_kind_but_the_pool = frozenset(
        (c.kind, c.api_version) for c in vocabulary.CHILD_KINDS if c.kind != "InferencePool"
    )
    children = render_children(idep, Registration(every_kind_but_the_pool))
    assert children == render_children(build(graph, patches=patches[:1])) + gaie.render(idep)
    # Allowed, the EPP is patched; refused, it follows as rendered.
    (epp,) = [c for c in render_children(idep) if (c["kind"], c["metadata"]["name"]) == ("Deployment", "g-epp")]
    assert (epp["spec"].get("paused"), children[-4]["spec"].get("paused")) == (True, None)


def test_autoscaling_children_of_each_service() -> None:
    """A worker pool always has a budget; a router only when it always keeps two or more; the
    autoscaler targets the workload kind and its metric quantities are canonical."""
    metric = {"type": "Pods", "pods": {"metric": {"name": "q"}, "target": {"type": "AverageValue", "averageValue": 2}}}
    scaled = {"minReplicas": 2, "maxReplicas": 4, "metrics": [metric]}
    idep = build({"router": SERVER, "big": {**SERVER, "autoscaling": scaled}, "pool": {**WORKER, "numberOfNodes": 2}})
    assert autoscaling.render(idep, "router", idep.spec.services["router"]) == []
    (hpa, budget) = autoscaling.render(idep, "big", idep.spec.services["big"])
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "g-big"}
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "2"
    assert (
        hpa["spec"]["behavior"] == autoscaling.DEFAULT_BEHAVIOR
        and hpa["spec"]["behavior"] is not autoscaling.DEFAULT_BEHAVIOR
    )
    (pool_budget,) = autoscaling.render(idep, "pool", idep.spec.services["pool"])
    assert pool_budget["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector("pool")},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    valid(hpa, budget, pool_budget)


def test_a_metric_value_that_is_not_a_quantity_fails_naming_it() -> None:
    metric = {"type": "Object", "object": {"target": {"type": "Value", "value": "1.5.2"}}}
    idep = build({"worker": {**WORKER, "autoscaling": {"maxReplicas": 2, "metrics": [metric]}}})
    with pytest.raises(
        SpecError, match=r"spec\.services\.worker\.autoscaling\.metrics\[0\]\.object\.target\.value: '1\.5\.2' is not"
    ):
        autoscaling.render(idep, "worker", idep.spec.services["worker"])
