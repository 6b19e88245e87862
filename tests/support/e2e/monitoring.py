"""The rendered PodMonitor scraped for real: a Prometheus in the sandbox scrapes the graph's
router and stand-in engines with the scrape configuration the PodMonitor implies, and the
component's alerts and dashboard run against what it scraped.

`scrape_config` turns a PodMonitor into a Prometheus configuration as the Prometheus Operator
does, with one difference: where the operator asks Kubernetes service discovery for every
container port of every pod in the namespace, this lists the same targets as `static_configs`,
each with the `__meta_kubernetes_*` labels the discovery gives it. Everything after discovery is
Prometheus's own work on the rendered relabelings, copied verbatim: which pair of endpoint and
pod port is kept, and which labels the series carry.
"""

import contextlib
import json
import os
import re
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from tests.support.e2e.sandbox import Cluster, http_ok, wait_until
from tests.support.e2e.scenarios import assert_registered, chat, request, start
from tests.support.loopback import free_port
from tests.support.prometheus import dashboard_queries, metric_names, recorded_names, rule_expressions, write_rules_file
from tests.support.service import stop_process

SCENARIO = "monitoring:scrapes_the_graph"
# The environment variables the test hands the sandbox the programs in.
PROMETHEUS_ENV, PROMTOOL_ENV = "E2E_PROMETHEUS", "E2E_PROMTOOL"
# Every endpoint's interval (the rendered default is 30 s) and the rules' evaluation interval,
# shortened: Prometheus scrapes a new target first at an offset of up to one interval, and a
# rate needs two samples after the requests, so at 30 s the scenario would wait a minute or
# more for what 1 s shows in a few seconds.
SCRAPE_INTERVAL = "1s"
# Grafana's $__rate_interval: 4 scrape intervals at least; 1m covers the whole scenario.
RATE_INTERVAL = "1m"
# The series kube-state-metrics makes of the graphs' status (the cluster tier runs it; this tier
# does not, so what reads them evaluates to nothing here).
KUBE_STATE_METRICS_PREFIX = "infera_inferadeployment_"
# What the dashboard reads that this graph does not serve, and why (a name, or a prefix ending
# in ':'): its queries over these evaluate to nothing here.
NOT_SERVED_HERE = {
    "vllm:": "the other engine's family; the stand-ins here are SGLang's",
    "infera_router_worker_breaker_state": "set on a breaker's first change of state; no worker failed here",
    "infera_pd_dispatch_duration_seconds_bucket": "timed for legs sent over HTTP without streaming; these cross NATS",
}


def not_served_here(name: str) -> bool:
    return any(name == key or (key.endswith(":") and name.startswith(key)) for key in NOT_SERVED_HERE)


# What Prometheus's Kubernetes discovery does to a pod label's name.
UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
# The camelCase keys of a PodMonitor's relabeling and Prometheus's names for them.
RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}
CHATS_PER_BATCH = 2


def sanitize(name: str) -> str:
    return UNSAFE.sub("_", name)


def relabeling(rule: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor relabeling as a relabel_config: the keys renamed, nothing else changed."""
    unknown = set(rule) - set(RELABEL_KEYS)
    assert not unknown, f"a relabeling key this translation does not know: {unknown}"
    return {RELABEL_KEYS[key]: value for key, value in rule.items()}


def discovered(pod: dict[str, Any], namespace: str) -> list[tuple[str, dict[str, str]]]:
    """What Kubernetes discovery (role pod) lists of a running pod: a target per container
    port, its address and labels."""
    labels = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod["name"],
        "__meta_kubernetes_pod_ip": pod["ip"],
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
    }
    for key, value in pod["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
        labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
    targets = []
    for container in pod["containers"]:
        for port in container.get("ports") or []:
            targets.append(
                (
                    f"{pod['ip']}:{port['containerPort']}",
                    labels
                    | {
                        "__meta_kubernetes_pod_container_name": container["name"],
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                    },
                )
            )
    return targets


def job_name(pod_monitor: dict[str, Any], namespace: str, index: int) -> str:
    return f"podMonitor/{namespace}/{pod_monitor['metadata']['name']}/{index}"


def scrape_config(
    pod_monitor: dict[str, Any], namespace: str, pods: list[dict[str, Any]], interval: str | None = None
) -> list[dict[str, Any]]:
    """The scrape_configs the Prometheus Operator generates for `pod_monitor` (one job per
    podMetricsEndpoint, its relabelings after the operator's own), with every container port of
    every pod in `pods` ({name, ip, labels, containers}: the pod's labels are its workload's
    template's) as a static target where Kubernetes discovery would list it. The operator's
    relabelings keep the pods the selector selects and the port the endpoint names; the
    endpoint's then do the rest. `namespace` is the PodMonitor's (the graph's: Metacontroller
    creates the children there); `interval`, if given, stands for every endpoint's."""
    metadata, spec = pod_monitor["metadata"], pod_monitor["spec"]
    assert set(spec["selector"]) == {"matchLabels"}, spec["selector"]
    selector = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_pod_label_{sanitize(key)}",
                f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}",
            ],
            "regex": f"({value});true",
        }
        for key, value in sorted(spec["selector"]["matchLabels"].items())
    ]
    targets = [
        {"targets": [address], "labels": labels} for pod in pods for address, labels in discovered(pod, namespace)
    ]
    jobs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        every = interval or endpoint["interval"]
        jobs.append(
            {
                "job_name": job_name(pod_monitor, namespace, index),
                "honor_labels": False,
                "scrape_interval": every,
                "scrape_timeout": every,
                "metrics_path": endpoint["path"],
                "scheme": "http",
                "static_configs": targets,
                "relabel_configs": [
                    {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
                    *selector,
                    {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
                    {
                        "action": "keep",
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": endpoint["port"],
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    {"target_label": "job", "replacement": f"{namespace}/{metadata['name']}"},
                    {"target_label": "endpoint", "replacement": endpoint["port"]},
                    *(relabeling(rule) for rule in endpoint.get("relabelings") or []),
                ],
            }
        )
    return jobs


def prometheus_config(
    pod_monitor: dict[str, Any], namespace: str, pods: list[dict[str, Any]], rule_files: list[Path], interval: str
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_config(pod_monitor, namespace, pods, interval),
    }


# --- the scenario -------------------------------------------------------------------------------


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        status, body = request(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10)
        assert status == 200 and body["status"] == "success", (path, params, status, body)
        return body["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expression)
        assert data["resultType"] == "vector", (expression, data)
        return data["result"]

    def values(self, expression: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(s["metric"].get(label, "") for label in labels): float(s["value"][1]) for s in self.query(expression)
        }


@contextlib.contextmanager
def running_prometheus(cluster: Cluster, config: dict[str, Any]) -> Any:
    directory = cluster.workdir / "prometheus"
    directory.mkdir()
    config_file = directory / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    checked = subprocess.run(
        [os.environ[PROMTOOL_ENV], "check", "config", str(config_file)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, f"promtool check config:\n{checked.stdout}\n{checked.stderr}"
    port = free_port()
    log = (cluster.workdir / "logs").joinpath("prometheus.log")
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                os.environ[PROMETHEUS_ENV],
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until("Prometheus to be ready", lambda: process.poll() is None and http_ok(f"{url}/-/ready"), 30)
        yield Prometheus(url)
    except BaseException:
        print("--- prometheus\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
        raise
    finally:
        stop_process(process)


# The graph's services and the role docs/monitoring.md says each one's series carry.
ROLES = {"server": "server", "prefill": "prefill", "decode": "decode"}


def expected_targets(cluster: Cluster, pod_monitor: dict[str, Any]) -> dict[str, dict[str, str]]:
    """By scrape URL, the labels of every target the graph should have: each service's pod on its
    `http` port, with its role, and nothing else (not the broker)."""
    index = [endpoint["port"] for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]].index("http")
    targets = {}
    for service, role in ROLES.items():
        pod = cluster.pod_of(service)
        (container,) = pod.pod.spec["containers"]
        (port,) = [p for p in container["ports"] if p["name"] == "http"]
        targets[f"http://{pod.ip}:{port['containerPort']}/metrics"] = {
            "instance": f"{pod.ip}:{port['containerPort']}",
            "job": f"{cluster.namespace}/{pod_monitor['metadata']['name']}",
            "namespace": cluster.namespace,
            "pod": pod.name,
            "container": container["name"],
            "endpoint": "http",
            "infera_graph": cluster.name,
            "infera_service": service,
            "infera_role": role,
            "__tmp_index": str(index),
        }
    return targets


def scrapes_the_graph(cluster: Cluster) -> None:
    """A server, a prefill and a decode pool with spec.monitoring: Prometheus, configured from
    the rendered PodMonitor, scrapes exactly the router and the two engines with the labels the
    PodMonitor sets; the requests sent through the router show in its series and the engines';
    every rule of the component's PrometheusRule evaluates, no alert fires on this healthy
    graph, and every dashboard query runs."""
    start(cluster)
    assert_registered(cluster, "prefill", "decode")
    (pod_monitor,) = [child for child in cluster.children if child["kind"] == "PodMonitor"]
    endpoints = pod_monitor["spec"]["podMetricsEndpoints"]
    assert {e["interval"] for e in endpoints} == {"30s"}, endpoints  # the default, shortened here
    pods = [
        {"name": pod.name, "ip": pod.ip, "labels": pod.labels, "containers": pod.pod.spec["containers"]}
        for pod in cluster.pods.values()
    ]
    rules = write_rules_file(cluster.workdir / "rules.yaml")
    config = prometheus_config(pod_monitor, cluster.namespace, pods, [rules], SCRAPE_INTERVAL)
    expected = expected_targets(cluster, pod_monitor)
    every_pair = {
        (job["job_name"], group["targets"][0]) for job in config["scrape_configs"] for group in job["static_configs"]
    }
    with running_prometheus(cluster, config) as prometheus:
        # Exactly the router and the two engines are scraped, each by its own endpoint's job, and up.
        def active() -> dict[str, dict[str, str]] | None:
            targets = prometheus.get("/api/v1/targets", state="active")["activeTargets"]
            if len(targets) < len(expected) or any(t["health"] == "unknown" for t in targets):
                return None
            return {t["scrapeUrl"]: t for t in targets}

        targets = wait_until("every target scraped once", active, 30)
        assert set(targets) == set(expected), sorted(targets)
        for url, target in targets.items():
            labels = dict(expected[url])
            index = labels.pop("__tmp_index")
            assert target["labels"] == labels, (url, target["labels"])
            assert target["scrapePool"] == job_name(pod_monitor, cluster.namespace, int(index)), target
            assert target["health"] == "up", target
        dropped = prometheus.get("/api/v1/targets", state="dropped")["droppedTargets"]
        kept = {
            (job_name(pod_monitor, cluster.namespace, int(t["__tmp_index"])), t["instance"]) for t in expected.values()
        }
        assert {
            (t["discoveredLabels"]["job"], t["discoveredLabels"]["__address__"]) for t in dropped
        } == every_pair - kept
        print(f"scraping {len(targets)} targets, {len(dropped)} pairs of endpoint and pod port dropped by relabeling")

        # The series carry the graph's labels exactly as the PodMonitor meant.
        graph = f'infera_graph="{cluster.name}"'
        identities = {(t["infera_service"], t["infera_role"], t["pod"], t["instance"]) for t in expected.values()}
        assert (
            prometheus.values(
                f"count by (infera_service, infera_role, pod, instance) (up{{{graph}}} == 1)",
                "infera_service",
                "infera_role",
                "pod",
                "instance",
            ).keys()
            == identities
        )

        sent = 0
        for _ in range(2):  # two batches, so the counters rise between scrapes and rates are > 0
            for _ in range(CHATS_PER_BATCH):
                chat(cluster, "hello world", max_tokens=4)
            sent += CHATS_PER_BATCH
            want = {("server", "disagg", "ok"): float(sent)}
            wait_until(
                f"the router's {sent} requests scraped",
                lambda want=want: (
                    prometheus.values(
                        f"sum by (infera_service, router, outcome) (infera_request_duration_seconds_count{{{graph}}})",
                        "infera_service",
                        "router",
                        "outcome",
                    )
                    == want
                ),
                15,
            )
            engines = {("prefill", "prefill"): float(sent), ("decode", "decode"): float(sent)}
            wait_until(
                f"both engines' {sent} requests scraped",
                lambda engines=engines: (
                    prometheus.values(
                        f"sum by (infera_service, infera_role) (sglang:num_requests_total{{{graph}}})",
                        "infera_service",
                        "infera_role",
                    )
                    == engines
                ),
                15,
            )
        running = prometheus.values(
            f"sglang:num_running_reqs{{{graph}}}", "infera_service", "infera_role", "namespace", "job"
        )
        job = f"{cluster.namespace}/{pod_monitor['metadata']['name']}"
        assert running == {
            ("prefill", "prefill", cluster.namespace, job): 0.0,
            ("decode", "decode", cluster.namespace, job): 0.0,
        }, running
        assert (
            prometheus.values(f"sum(rate(infera_request_duration_seconds_count{{{graph}}}[{RATE_INTERVAL}]))")[()] > 0
        )

        present = {s["metric"]["__name__"] for s in prometheus.query(f"group by (__name__) ({{{graph}}})")}

        # The rules, evaluated by this Prometheus: every recording rule reads only scraped series
        # and records the graph; every rule evaluates; no alert fires on a healthy graph (the
        # ones over kube-state-metrics' series cannot here: this tier runs no kube-state-metrics).
        for name in sorted(recorded_names()):
            recorded = wait_until(
                f"{name} recorded", lambda name=name: prometheus.values(name, "namespace", "infera_graph"), 15
            )
            # No request took 30 s or more: the slow share is 0.
            assert recorded == {(cluster.namespace, cluster.name): 0.0}, (name, recorded)

        def evaluated() -> list[dict[str, Any]] | None:
            rules_now = [r for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
            return rules_now if all(r["health"] != "unknown" for r in rules_now) else None

        for rule in wait_until("every rule evaluated", evaluated, 15):
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
        assert prometheus.get("/api/v1/alerts")["alerts"] == []
        for _, expression in rule_expressions():
            prometheus.query(expression)  # evaluates without error (Prometheus.get asserts it)

        # The dashboard's queries, as Grafana sends them for this graph.
        answered: dict[str, int] = {}
        unanswered: dict[str, list[str]] = {}
        for where, expression in dashboard_queries():
            query = (
                expression.replace("$__rate_interval", RATE_INTERVAL)
                .replace("$namespace", cluster.namespace)
                .replace("$graph", cluster.name)
            )
            names = metric_names(expression)
            result = prometheus.query(query)
            if any(n.startswith(KUBE_STATE_METRICS_PREFIX) for n in names):
                assert result == [], (where, result)  # kube-state-metrics' series: none here
            elif names <= present:
                assert result, f"{where}: {query} returned nothing (scraped: {sorted(present)})"
                answered[where] = len(result)
            else:
                missing = names - present
                assert all(map(not_served_here, missing)), (where, missing, sorted(present))
                assert result == [], (where, result)
                unanswered[where] = sorted(missing)
        print("dashboard queries answered (series):", json.dumps(answered, indent=1))
        print("dashboard queries over what this graph does not serve:", json.dumps(unanswered, indent=1))
        read = {n for where, expression in dashboard_queries() if where in answered for n in metric_names(expression)}
        # Throughput, latency, queue depth and KV usage are answered for this graph.
        assert {
            "infera_request_duration_seconds_count",
            "infera_request_duration_seconds_bucket",
            "sglang:num_queue_reqs",
            "sglang:token_usage",
        } <= read, read
