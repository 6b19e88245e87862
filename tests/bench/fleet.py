"""A fleet of InferaDeployments driven through `infera-hooks serve` as Metacontroller drives it
(not a test):

    .venv/bin/python tests/bench/fleet.py [--graphs 1000] [--concurrency 5 50]

A third each of the PD graph, the multi-node graph and the GAIE graph from examples/, each
handled by the test suite's Metacontroller simulator (which applies answers as Metacontroller
v4.17 does and counts the API writes it makes), `concurrency` parents at a time like its
worker pool. Phases:

- first sync: one sync per parent, nothing exists yet (the creates);
- convergence: the workloads report ready, and each parent is synced until a sync writes nothing;
- resync storm: every parent synced once more with nothing changed, as after a Metacontroller
  restart;
- status churn: a worker pool of every parent loses a ready pod, then gets it back, a sync each.

For each phase it prints the hook's CPU seconds (the serve process tree, 2 workers), the
latency of the hook calls (p50/p99, as the client saw them) and the API writes made. A fresh
server and fleet per concurrency.
"""

import argparse
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench.throughput import BIN, free_port, percentile, start  # noqa: E402
from tests.support.requests import load_yaml, parent  # noqa: E402
from tests.support.service import HookClient  # noqa: E402
from tests.support.simulator import Metacontroller  # noqa: E402

SHAPES = ("pd-disaggregated.yaml", "multinode-tp.yaml", "gaie-pd.yaml")
WORKERS = 2


class TimedClient(HookClient):
    """The hook client without the suite's schema checks (the client would be the bottleneck),
    recording each call's latency."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.latencies: list[float] = []
        self.lock = threading.Lock()

    def hook(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        reply = self.post(path, body)
        elapsed = time.perf_counter() - started
        assert reply.status == 200, reply.body[:200]
        with self.lock:
            self.latencies.append(elapsed)
        return reply.json


def cpu_seconds(master: int) -> float:
    pids = [str(master), *Path(f"/proc/{master}/task/{master}/children").read_text().split()]
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def fleet(client: TimedClient, graphs: int) -> list[Metacontroller]:
    shapes = [load_yaml(REPO / "examples" / name)[0] for name in SHAPES]
    controllers = []
    for index in range(graphs):
        idep = parent(shapes[index % len(shapes)], namespace=f"team-{index % 50}")
        idep["metadata"]["name"] = f"g{index}"
        idep["metadata"]["uid"] = f"uid-{index}"
        controllers.append(Metacontroller(client, idep))
    return controllers


def converge(mc: Metacontroller) -> None:
    mc.mark_ready()
    mc.converge(max_rounds=8)


def lose_a_pod(mc: Metacontroller) -> None:
    pool = next(key for key in sorted(mc.children) if key[0] in ("Deployment", "LeaderWorkerSet"))
    mc.mark_ready(lambda kind, name: 0 if (kind, name) == pool else None)
    mc.sync()
    mc.mark_ready()
    mc.sync()


PHASES: list[tuple[str, Callable[[Metacontroller], Any]]] = [
    ("first sync", Metacontroller.sync),
    ("convergence", converge),
    ("resync storm", Metacontroller.sync),
    ("status churn", lose_a_pod),
]


def run(graphs: int, concurrency: int) -> list[tuple[str, int, float, float, float, Counter]]:
    port = free_port()
    server = start([str(BIN / "infera-hooks"), "serve", "--bind", f"127.0.0.1:{port}", "--workers", str(WORKERS)], port)
    rows = []
    try:
        client = TimedClient(f"http://127.0.0.1:{port}")
        controllers = fleet(client, graphs)
        for name, step in PHASES:
            client.latencies = []
            writes_before = [len(mc.writes) for mc in controllers]
            cpu_before = cpu_seconds(server.pid)
            with ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(step, controllers))
            writes = Counter(
                write[0] for mc, before in zip(controllers, writes_before, strict=True) for write in mc.writes[before:]
            )
            latencies = client.latencies
            rows.append(
                (
                    name,
                    len(latencies),
                    cpu_seconds(server.pid) - cpu_before,
                    statistics.median(latencies) * 1000,
                    percentile(latencies, 0.99) * 1000,
                    writes,
                )
            )
    finally:
        server.terminate()
        server.wait()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[5, 50])
    args = parser.parse_args()
    print(
        f"{args.graphs} InferaDeployments ({', '.join(SHAPES)}), {WORKERS} gunicorn workers, {os.cpu_count()} CPUs; "
        "latency as the client saw it"
    )
    header = ("concurrency", "phase", "hook calls", "hook CPU s", "p50 ms", "p99 ms", "API writes", "by verb")
    table = [header]
    for concurrency in args.concurrency:
        for name, calls, cpu, p50, p99, writes in run(args.graphs, concurrency):
            verbs = " ".join(f"{verb} {count}" for verb, count in sorted(writes.items()))
            table.append(
                (
                    str(concurrency),
                    name,
                    str(calls),
                    f"{cpu:.1f}",
                    f"{p50:.1f}",
                    f"{p99:.1f}",
                    str(sum(writes.values())),
                    verbs,
                )
            )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
