"""A fleet of InferaDeployments on the real control plane (not a test):

    .venv/bin/python -m tests.bench.cluster_fleet [--graphs 100 1000] [--settings defaults recommended]
        [--flush 60]

For each fleet size and each Metacontroller setting (its defaults, and what
docs/operations.md recommends for that size), a fresh loopback cluster (kube-apiserver,
controller-manager, scheduler, kwok nodes, the LeaderWorkerSet controller), the bundle installed
with `kubectl apply -k`, `infera-hooks serve` and Metacontroller v4.17.2, built from its source
and installed from its own manifests as the cluster tier does (tests/support/metacontroller.py).
The fleet's graphs take the PD, mixed, multi-node, GAIE and autoscaled examples' shapes in turn.

Phases: create every graph at once (until each has a status at its generation); all Ready; steady
state for two of Metacontroller's resync periods (`--flush`, its --cache-flush-interval); a
Metacontroller restart; one pod in ten turning unready and ready again; a spec change to one
graph in ten; deleting every graph. Each phase's figures: wall time, Metacontroller's API writes
by verb and resource (the API server's audit log), the CPU seconds of every process, the hook's
calls and latency (its own log), the API server's request latency (its metrics).
"""

import argparse
import json
import os
import signal
import sys
import time

from tests.bench.cluster_fleet import fleet, phases, upstream
from tests.bench.cluster_fleet.meter import Figures, latency_ms
from tests.support.prerequisites import REPO

WORKDIR = REPO / ".cache" / "cluster-fleet"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def phase_rows(graphs: int, figures: list[Figures]) -> list[list[str]]:
    header = [
        "phase", "wall s", "MC writes", "per graph", "MC errors", "MC CPU s", "MC peak MB", "hook calls", "hook CPU s", "hook peak MB",
        "hook p50/p99 ms", "API p50/p99 ms", "busiest (cores)", "all cores",
    ]  # fmt: skip
    rows = [header]
    for figure in figures:
        writes = sum(figure.metacontroller_writes.values())
        p50, p99 = latency_ms(figure.hook_ms)
        busiest = max(figure.cpu, key=figure.cpu.__getitem__)
        rows.append(
            [
                figure.phase,
                f"{figure.seconds:.0f}",
                str(writes),
                f"{writes / graphs:.1f}",
                str(figure.metacontroller_errors),
                f"{figure.cpu['metacontroller']:.1f}",
                f"{figure.metacontroller_peak_mb:.0f}",
                str(sum(figure.hook_calls.values())),
                f"{figure.cpu['hooks']:.1f}",
                f"{figure.hook_peak_mb:.0f}",
                f"{p50:.1f}/{p99:.1f}",
                f"{figure.api_p50_ms:.1f}/{figure.api_p99_ms:.1f}",
                f"{busiest} ({figure.cpu[busiest] / figure.seconds:.2f})",
                f"{sum(figure.cpu.values()) / figure.seconds:.2f}",
            ]
        )
    return rows


def writes_lines(figures: list[Figures]) -> str:
    """Metacontroller's writes by verb and resource, and how many writes everyone else made."""
    lines = []
    for figure in figures:
        verbs = ", ".join(f"{key} {count}" for key, count in sorted(figure.metacontroller_writes.items()))
        lines.append(f"{figure.phase}: {verbs or 'none'} (others: {figure.other_writes})")
    return "\n".join(lines)


def comparison_rows(graphs: int, steady: Figures) -> list[list[str]]:
    ours = sum(steady.metacontroller_writes.values()) / steady.seconds
    asked, let_through = upstream.writes_per_second(graphs)
    return [
        ["steady state, whole fleet", "writes/s asked", "writes/s sent", "writes per hour"],
        ["this operator (measured)", f"{ours:.2f}", f"{ours:.2f}", f"{ours * 3600:.0f}"],
        [
            f"upstream Go operator (from its source, every graph every {upstream.SECONDS_BETWEEN_RECONCILES} s)",
            f"{asked:.1f}",
            f"{let_through:.1f}",
            f"{let_through * 3600:.0f}",
        ],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.cluster_fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--graphs", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--settings", nargs="+", choices=["defaults", "recommended"], default=["defaults", "recommended"]
    )
    parser.add_argument("--flush", type=int, default=60, help="Metacontroller's --cache-flush-interval, seconds")
    arguments = parser.parse_args()
    # Stopped from elsewhere, it still tears its cluster and processes down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    top = WORKDIR / time.strftime("%Y%m%d-%H%M%S")
    print(f"{os.cpu_count()} CPUs; logs and figures under {top}", flush=True)
    for graphs in arguments.graphs:
        seen = []
        for name in arguments.settings:
            settings = fleet.DEFAULTS if name == "defaults" else fleet.recommended(graphs)
            if settings in seen:
                continue  # the recommendation for this size is the defaults
            seen.append(settings)
            label = " ".join(f"--{flag}={value}" for flag, value in settings.items())
            print(f"\n{graphs} graphs, Metacontroller {label} ({name})", flush=True)
            workdir = top / f"{graphs}-{name}"
            workdir.mkdir(parents=True)
            figures = phases.run(workdir, graphs, settings, arguments.flush)
            (workdir / "figures.json").write_text(json.dumps([vars(figure) for figure in figures], indent=1))
            print(table(phase_rows(graphs, figures)))
            print(writes_lines(figures))
            steady = next(figure for figure in figures if figure.phase == "steady")
            print(table(comparison_rows(graphs, steady)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
