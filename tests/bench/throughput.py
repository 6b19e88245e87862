"""Benchmark `infera-hooks serve` against a do-nothing floor, side by side (not a test).

    .venv/bin/python tests/bench/throughput.py [--requests 1500] [--concurrency 4] [--rounds 5] [--against REV]

Both servers run under gunicorn with the same settings (2 gevent workers). The floor is a Flask
app that only parses the same request and returns a response of the same size, so the ratio
is what the hook's own work costs. Four loads of a converged PD-graph sync:

- steady: the same request again and again, as Metacontroller resends an unchanged world on
  every resync and child event, with the ETag of the hook's answer in If-None-Match, as
  Metacontroller's etag support sends it (the hook answers 304; the floor parses and answers);
- resent: the same, without If-None-Match, as when Metacontroller's etag cache has let the
  entry go (the children and the status come from the worker's render memo);
- distinct: every request distinct, the parent's and every child's resourceVersion moved (no
  answer is a repeat; the children and the status come from the worker's render memo);
- churn: every request distinct with a workload's status moved too, so the status is rolled
  up again (the children still come from the memo).

With `--against REV`, the hook as committed at REV (a git revision of this repository, unpacked
into .cache/bench/) runs beside them under the same settings, so a change's cost shows in one
run. Rounds alternate between the servers and the loads; each figure is the median round's, and
each round's ratio is printed too (their spread is the machine's noise). It prints throughput
and p50/p99 latency of each, the latency of a 200-service graph, and each worker's resident
memory once 4,000 distinct graphs have filled its memo, with the ratios and the targets.
"""

import argparse
import http.client
import json
import os
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
from tests.support.loopback import free_port  # noqa: E402
from tests.support.requests import parent, request_body  # noqa: E402

BIN = Path(sys.executable).parent
WORKERS = 2
# Distinct PD graphs enough to fill every worker's render memo (memo.MEMO_BYTES holds about
# 1,300 of them), though each worker sees only its share.
FILL_GRAPHS = 4000


MODES = ("steady", "resent", "distinct", "churn")
# The least throughput against the floor each load must reach (issue 31).
TARGETS = {"steady": 0.95, "distinct": 0.85}


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


def converged_world(spec_services: dict[str, Any] | None = None, name: str | None = None) -> tuple[dict, list]:
    """A graph whose children all exist and are ready, as in a steady cluster: the parent (its
    status rolled up) and the observed children."""
    obj = parent(REPO / "examples" / "pd-disaggregated.yaml")
    if spec_services is not None:
        obj["spec"]["services"] = spec_services
    if name is not None:
        obj["metadata"]["name"] = name
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
    return obj, observed


def converged_request(
    spec_services: dict[str, Any] | None = None, resource_version: int = 1, churn: bool = False
) -> bytes:
    """A sync request of a converged graph at `resource_version` (the parent's and every
    child's). With `churn`, a workload's status moved too (a condition's lastUpdateTime), so
    the status must be rolled up again."""
    obj, observed = converged_world(spec_services)
    return variant(obj, observed, resource_version, churn)


def variant(obj: dict, observed: list, resource_version: int, churn: bool = False) -> bytes:
    body = request_body(obj, observed)
    text = json.dumps(body).replace('"resourceVersion": "1"', f'"resourceVersion": "{resource_version}"')
    body = json.loads(text)
    body["parent"]["metadata"]["resourceVersion"] = str(resource_version)
    if churn:
        deployments = body["children"]["Deployment.apps/v1"]
        workload = deployments[sorted(deployments)[0]]
        stamp = f"2026-11-30T{resource_version // 3600 % 24:02d}:{resource_version // 60 % 60:02d}:{resource_version % 60:02d}Z"
        workload["status"]["conditions"] = [
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable", "lastUpdateTime": stamp}
        ]
    return json.dumps(body).encode()


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


def call(port: int, body: bytes, etag: str | None = None) -> tuple[int, str | None]:
    """POST /sync, with If-None-Match if `etag`: the status and the answer's ETag."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", **({"If-None-Match": etag} if etag else {})}
    connection.request("POST", "/sync", body, headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status, response.getheader("ETag")


def post(port: int, body: bytes, etag: str | None = None) -> float:
    started = time.perf_counter()
    status, _ = call(port, body, etag)
    assert status == 200 or (etag and status == 304), status
    return time.perf_counter() - started


def load(
    port: int, bodies: list[bytes], requests: int, concurrency: int, etag: str | None = None
) -> tuple[float, list[float]]:
    """Requests per second and every request's latency, `concurrency` clients at a time, each
    client cycling through its share of `bodies` (with If-None-Match: `etag`, if given)."""
    latencies: list[float] = []
    lock = threading.Lock()
    per_client = requests // concurrency

    def client(offset: int) -> None:
        mine = [post(port, bodies[(offset * per_client + i) % len(bodies)], etag) for i in range(per_client)]
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(offset,)) for offset in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / (time.perf_counter() - started), latencies


def unpacked(revision: str) -> Path:
    """The repository as committed at `revision`, unpacked once into the build cache."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = REPO / ".cache" / "bench" / commit
    if not (tree / "hooks").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit], cwd=REPO, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


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
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median of each is reported")
    parser.add_argument("--against", metavar="REV", help="also run the hook as committed at this git revision")
    args = parser.parse_args()

    obj, observed = converged_world()
    body = variant(obj, observed, 1)
    answer_bytes = len(reconcile.sync_answer(parse_request(json.loads(body))).json())
    rounds = args.rounds
    versions = iter(range(2, 10**9))
    # A fresh slice of bodies per round and load, so no answer is ever a repeat.
    loads = {
        "distinct": [[variant(obj, observed, next(versions)) for _ in range(args.requests)] for _ in range(rounds)],
        "churn": [
            [variant(obj, observed, next(versions), churn=True) for _ in range(args.requests)] for _ in range(rounds)
        ],
    }
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
    fleet = [variant(*converged_world(name=f"fill-{index}"), 1) for index in range(FILL_GRAPHS)]

    hooks_port, floor_port, earlier_port = free_port(), free_port(), free_port()
    hooks = start(
        [str(BIN / "infera-hooks"), "serve", "--bind", f"127.0.0.1:{hooks_port}", "--workers", str(WORKERS)], hooks_port
    )
    # The earlier hook's package comes first on its path (ahead of this checkout's editable install).
    earlier = (
        start(
            [str(BIN / "infera-hooks"), "serve", "--bind", f"127.0.0.1:{earlier_port}", "--workers", str(WORKERS)],
            earlier_port,
            {"PYTHONPATH": str(unpacked(args.against))},
        )
        if args.against
        else None
    )
    ports = [hooks_port, floor_port, *([earlier_port] if earlier else [])]
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
    results: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
    try:
        for port in ports:  # warm up imports
            load(port, [body], 40, 2)
        # What Metacontroller keeps for the parent and sends back in If-None-Match: each hook's own.
        etags = {port: call(port, body)[1] for port in ports if port != floor_port}
        for port, etag in etags.items():
            assert etag and call(port, body, etag)[0] == 304
        for round_index in range(rounds):
            for mode in MODES:
                bodies = [body] if mode in ("steady", "resent") else loads[mode][round_index]
                for port in ports:
                    etag = etags.get(port) if mode == "steady" else None
                    results.setdefault((mode, port), []).append(
                        load(port, bodies, args.requests, args.concurrency, etag)
                    )
        big_latencies = [post(hooks_port, each) for each in big]  # distinct: no cached answer
        load(hooks_port, fleet, len(fleet), args.concurrency)
        rss = worker_rss_mb(hooks.pid)
        floor_rss = worker_rss_mb(floor.pid)
    finally:
        for server in (hooks, floor, *([earlier] if earlier else [])):
            server.terminate()
            server.wait()

    def median_round(mode: str, port: int) -> tuple[float, list[float]]:
        return sorted(results[(mode, port)], key=lambda result: result[0])[rounds // 2]

    ms = 1000
    rows = []
    for mode in MODES:
        (hooks_rps, hooks_lat), (floor_rps, floor_lat) = median_round(mode, hooks_port), median_round(mode, floor_port)
        rows += [
            (
                f"{mode}: sync throughput (req/s)",
                f"{hooks_rps:.0f}",
                f"{floor_rps:.0f}",
                f"{hooks_rps / floor_rps:.2f}x",
                f">= {TARGETS[mode]:.2f}x" if mode in TARGETS else "",
                hooks_rps / floor_rps >= TARGETS[mode] if mode in TARGETS else None,
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
            f"RSS per worker after {FILL_GRAPHS:,} graphs (MB)",
            " / ".join(f"{size:.0f}" for size in rss),
            " / ".join(f"{size:.0f}" for size in floor_rss),
            f"{max(rss) / max(floor_rss):.2f}x",
            "< 100 MB",
            max(rss) < 100,
        ),
    ]
    print(
        f"PD graph sync: request {len(body)} bytes, answer {answer_bytes} bytes; {args.requests} requests x "
        f"{rounds} rounds per load (the median shown), {args.concurrency} clients, {WORKERS} gunicorn workers each, "
        f"{os.cpu_count()} CPUs"
    )
    header = ("metric", "infera-hooks", "floor", "ratio", "target", "")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        verdict = {True: "ok", False: "MISSED", None: ""}.get(row[5], row[5])
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row[:5], widths, strict=True)) + f"  {verdict}")
    if earlier:
        print(f"The hook at {args.against}, in the same rounds:")
        for mode in MODES:
            (earlier_rps, _), (floor_rps, _) = median_round(mode, earlier_port), median_round(mode, floor_port)
            hooks_rps = median_round(mode, hooks_port)[0]
            print(
                f"  {mode}: {earlier_rps:.0f} req/s, {earlier_rps / floor_rps:.2f}x the floor "
                f"(the hook now: {hooks_rps / floor_rps:.2f}x; now against then: {hooks_rps / earlier_rps:.2f}x)"
            )
    # Each round ran the servers back to back: its ratio shows how far the machine's noise
    # moves one run's figure.
    for mode in MODES:
        pairs = zip(results[(mode, hooks_port)], results[(mode, floor_port)], strict=True)
        print(
            f"{mode}: each round's throughput ratio, in the order run: "
            + " ".join(f"{h[0] / f[0]:.3f}" for h, f in pairs)
        )
        if earlier:
            pairs = zip(results[(mode, earlier_port)], results[(mode, floor_port)], strict=True)
            print(f"{mode}: the same at {args.against}: " + " ".join(f"{h[0] / f[0]:.3f}" for h, f in pairs))


if __name__ == "__main__":
    main()
