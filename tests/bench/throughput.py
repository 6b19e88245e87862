"""Benchmark `infera-hooks serve` against a do-nothing floor, side by side (not a test).

    .venv/bin/python tests/bench/throughput.py [--requests 1500] [--concurrency 4]

Both servers run under gunicorn with the same settings (2 gevent workers). The floor is a Flask
app that only parses the same request and returns a response of the same size, so the ratio
is what the hook's own work costs. Two loads of a converged PD-graph sync:

- steady: the same request again and again, as Metacontroller resends an unchanged world on
  every resync and child event (the hook answers repeats from its answer cache);
- changing: every request distinct (a new resourceVersion each time), so every call is
  validated, rendered and serialised.

It prints throughput and p50/p99 latency of each, the latency of a 200-service graph, and each
worker's resident memory, with the ratios and the targets.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hooks import reconcile  # noqa: E402
from hooks.contract import LAST_APPLIED_ANNOTATION, parse_request  # noqa: E402
from tests.support.requests import parent, request_body  # noqa: E402

BIN = Path(sys.executable).parent
WORKERS = 2


def floor_app() -> Flask:
    """Parse the request as the hook does, answer a fixed body of the hook's answer size."""
    app = Flask(__name__)
    answer = b'{"pad":"' + b"x" * max(0, int(os.environ.get("BENCH_RESPONSE_BYTES", "0")) - 10) + b'"}'

    @app.post("/sync")
    def sync() -> Response:
        json.loads(request.get_data())
        return Response(answer, mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b"{}", mimetype="application/json")

    return app


def converged_request(spec_services: dict[str, Any] | None = None, resource_version: int = 1) -> bytes:
    """A sync request of a graph whose children all exist, as in a steady cluster."""
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    if spec_services is not None:
        obj["spec"]["services"] = spec_services
    children = reconcile.sync(parse_request(request_body(obj)))["children"]
    observed = []
    for child in children:
        stored = json.loads(json.dumps(child))
        stored["metadata"].update(
            namespace="ml", uid="u", resourceVersion="1", annotations={LAST_APPLIED_ANNOTATION: json.dumps(child)}
        )
        stored["status"] = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "observedGeneration": 1}
        observed.append(stored)
    obj["status"] = reconcile.sync(parse_request(request_body(obj, observed)))["status"]
    obj["metadata"]["resourceVersion"] = str(resource_version)
    return json.dumps(request_body(obj, observed)).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=REPO
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{command} did not start")


def post(port: int, body: bytes) -> float:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("POST", "/sync", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
    connection.close()
    return time.perf_counter() - started


def load(port: int, bodies: list[bytes], requests: int, concurrency: int) -> tuple[float, list[float]]:
    """Requests per second and every request's latency, `concurrency` clients at a time, each
    client cycling through its share of `bodies`."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = requests // concurrency

    def client(offset: int) -> None:
        mine = [post(port, bodies[(offset * per_client + i) % len(bodies)]) for i in range(per_client)]
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(offset,)) for offset in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / (time.perf_counter() - started), latencies


def worker_rss_mb(master: int) -> list[float]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    sizes = []
    for pid in children:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return sizes


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the best of each is kept")
    args = parser.parse_args()

    body = converged_request()
    answer_bytes = len(
        json.dumps(reconcile.sync(parse_request(json.loads(body))), sort_keys=True, separators=(",", ":"))
    )
    rounds = args.rounds
    distinct = [converged_request(resource_version=version) for version in range(2, 2 + args.requests * (rounds + 1))]
    workers = [f"w{i}" for i in range(200)]
    big_services = {
        "server": {"componentType": "server", "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]},
        **{
            w: {"componentType": "worker", "resources": {"gpu": 1}, "args": ["--model-path", "Qwen/Qwen3-0.6B"]}
            for w in workers
        },
    }
    big = [converged_request(big_services, resource_version=version) for version in range(20)]
    # Timing a refusal would measure nothing: the graph must render.
    assert reconcile.sync(parse_request(json.loads(big[0])))["status"]["state"] != "failed"

    hooks_port, floor_port = free_port(), free_port()
    hooks = start(
        [str(BIN / "infera-hooks"), "serve", "--bind", f"127.0.0.1:{hooks_port}", "--workers", str(WORKERS)], hooks_port
    )
    floor = start(
        [
            str(BIN / "gunicorn"),
            "--bind",
            f"127.0.0.1:{floor_port}",
            "--workers",
            str(WORKERS),
            "--worker-class",
            "gevent",
            "--keep-alive",
            "5",
            "--timeout",
            "30",
            "--graceful-timeout",
            "20",
            "tests.bench.throughput:floor_app()",
        ],
        floor_port,
        {"BENCH_RESPONSE_BYTES": str(answer_bytes)},
    )
    best: dict[tuple[str, int], tuple[float, list[float]]] = {}
    try:
        for port in (hooks_port, floor_port):  # warm up imports
            load(port, distinct[-40:], 40, 2)
        for round_index in range(rounds):
            # A fresh slice of distinct bodies per round, so no answer is ever a repeat.
            fresh = distinct[round_index * args.requests : (round_index + 1) * args.requests]
            for mode, bodies in (("steady", [body]), ("changing", fresh)):
                for port in (hooks_port, floor_port):
                    result = load(port, bodies, args.requests, args.concurrency)
                    if (mode, port) not in best or result[0] > best[(mode, port)][0]:
                        best[(mode, port)] = result
        big_latencies = [post(hooks_port, each) for each in big]  # distinct: no cached answer
        rss = worker_rss_mb(hooks.pid)
        floor_rss = worker_rss_mb(floor.pid)
    finally:
        hooks.terminate()
        floor.terminate()
        hooks.wait()
        floor.wait()

    ms = 1000
    rows = []
    for mode in ("steady", "changing"):
        (hooks_rps, hooks_lat), (floor_rps, floor_lat) = best[(mode, hooks_port)], best[(mode, floor_port)]
        rows += [
            (
                f"{mode}: sync throughput (req/s)",
                f"{hooks_rps:.0f}",
                f"{floor_rps:.0f}",
                f"{hooks_rps / floor_rps:.2f}x",
                ">= 0.90x",
                hooks_rps / floor_rps >= 0.9,
            ),
            (
                f"{mode}: p50 latency (ms)",
                f"{percentile(hooks_lat, 0.5) * ms:.2f}",
                f"{percentile(floor_lat, 0.5) * ms:.2f}",
                f"{percentile(hooks_lat, 0.5) / percentile(floor_lat, 0.5):.2f}x",
                "",
                None,
            ),
            (
                f"{mode}: p99 latency (ms)",
                f"{percentile(hooks_lat, 0.99) * ms:.2f}",
                f"{percentile(floor_lat, 0.99) * ms:.2f}",
                f"{percentile(hooks_lat, 0.99) / percentile(floor_lat, 0.99):.2f}x",
                "",
                None,
            ),
        ]
    rows += [
        (
            "200-service sync p50 (ms)",
            f"{statistics.median(big_latencies) * ms:.1f}",
            "",
            "",
            "< 250 ms",
            statistics.median(big_latencies) * ms < 250,
        ),
        (
            "RSS per worker (MB)",
            " / ".join(f"{size:.0f}" for size in rss),
            " / ".join(f"{size:.0f}" for size in floor_rss),
            f"{max(rss) / max(floor_rss):.2f}x",
            "< 100 MB",
            max(rss) < 100,
        ),
    ]
    print(
        f"PD graph sync: request {len(body)} bytes, answer {answer_bytes} bytes; {args.requests} requests x "
        f"{rounds} rounds per load, {args.concurrency} clients, {WORKERS} gunicorn workers each, {os.cpu_count()} CPUs"
    )
    header = ("metric", "infera-hooks", "floor", "ratio", "target", "")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        verdict = {True: "ok", False: "MISSED", None: ""}.get(row[5], row[5])
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + f"  {verdict}")


if __name__ == "__main__":
    main()
