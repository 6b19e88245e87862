"""A custom metrics API for the loopback cluster's HorizontalPodAutoscaler controller: the
aggregated API `custom.metrics.k8s.io/v1beta2`, as prometheus-adapter serves it in a real
cluster, where a metric's total (a queue, say), which a test sets, is spread evenly over the
pods a query selects: more pods, less each.

The API server reaches it as an APIService backed by a Service without a selector whose
Endpoints name this machine's own address (the API server routes to endpoints, not to a
ClusterIP that nothing here would answer; Endpoints may not be loopback).
"""

import json
import re
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.cluster import Cluster
from tests.support.prerequisites import need

GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta2"
NAMESPACE = "custom-metrics"
SERVICE = "custom-metrics-apiserver"
POD_METRIC = re.compile(rf"^/apis/{GROUP}/{VERSION}/namespaces/([^/]+)/pods/([^/]+)/([^/]+)$")


def own_address() -> str:
    """This machine's address on its default route (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("203.0.113.1", 9))  # TEST-NET-3: routed, never answered
        except OSError as error:
            need(False, f"the custom metrics API needs an address besides loopback: {error}")
        return str(probe.getsockname()[0])


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the API server asks every few seconds."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in (f"/apis/{GROUP}/{VERSION}", f"/apis/{GROUP}/{VERSION}/"):
            resources = [
                {"name": f"pods/{metric}", "singularName": "", "namespaced": True, "kind": "MetricValueList", "verbs": ["get"]}
                for metric in sorted(self.server.totals)
            ]  # fmt: skip
            return self._answer(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}", "resources": resources})  # fmt: skip
        matched = POD_METRIC.match(url.path)
        if matched is None or matched.group(3) not in self.server.totals:
            return self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})  # fmt: skip
        namespace, name, metric = (unquote(part) for part in matched.groups())  # `*` comes as %2A
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        pods = self.server.cluster.admin().get(
            f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector}
        )
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        selected = [pod for pod in pods.json()["items"] if name in ("*", pod["metadata"]["name"])]
        each = self.server.totals[metric] / max(len(selected), 1)
        items = [
            {
                "describedObject": {"kind": "Pod", "namespace": namespace, "name": pod["metadata"]["name"], "apiVersion": "/v1"},
                "metric": {"name": metric},
                "timestamp": now,
                "windowSeconds": 60,
                "value": f"{round(each * 1000)}m",
            }
            for pod in selected
        ]  # fmt: skip
        self._answer(
            200, {"kind": "MetricValueList", "apiVersion": f"{GROUP}/{VERSION}", "metadata": {}, "items": items}
        )

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], cluster: Cluster, totals: dict[str, float]) -> None:
        super().__init__(address, _Handler)
        self.cluster = cluster
        self.totals = totals


@contextmanager
def running_metrics_api(cluster: Cluster, workdir: Path, totals: dict[str, float]) -> Iterator[dict[str, float]]:
    """The API serving `totals` (metric name -> its total over the pods; change it in place),
    registered and Available, until the block ends."""
    address = own_address()
    certs = workdir / "metrics-certs"
    certs.mkdir(exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={address}",
         "-addext", f"subjectAltName=IP:{address}", "-keyout", str(certs / "tls.key"), "-out", str(certs / "tls.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = _Server((address, 0), cluster, totals)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    meta = {"name": SERVICE, "namespace": NAMESPACE}
    api_service = f"{VERSION}.{GROUP}"
    try:
        cluster.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": meta, "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "https", "port": port}]}]},
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": api_service},
                "spec": {
                    "group": GROUP, "version": VERSION, "service": {**meta, "port": 443},
                    # The serving certificate is the test's own, made a moment ago.
                    "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100, "versionPriority": 200,
                },
            },
        )  # fmt: skip
        waited = cluster.kubectl(
            "wait", "--for=condition=Available", f"apiservice/{api_service}", "--timeout=60s", timeout=90
        )
        assert waited.returncode == 0, (
            waited.stderr,
            cluster.kubectl("get", "apiservice", api_service, "-o", "yaml").stdout,
        )
        yield totals
    finally:
        cluster.kubectl("delete", "apiservice", api_service, "--ignore-not-found")
        server.shutdown()
        server.server_close()
