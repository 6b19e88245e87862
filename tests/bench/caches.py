"""What each cache inside the sync's steps is worth, side by side in one run (not a test):

    .venv/bin/python tests/bench/caches.py [--syncs 40] [--rounds 15]

The render memo keeps each parent's render and roll-up; below it a few caches keep work that
every distinct sync repeats (parsing the observed children's last-applied records, above all).
This runs distinct syncs of one converged PD graph in one process, a warm memo each, with every
cache in place and then with each taken out in turn (its function replaced by the uncached one),
and prints each variant's median time per sync against the first. Rounds of the variants
alternate, so the machine's noise moves them alike; compare ratios, not microseconds.
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hooks import contract, immutable, observed, reconcile  # noqa: E402
from hooks.contract import decode, parse_request  # noqa: E402
from hooks.memo import RenderMemo  # noqa: E402
from tests.support.requests import converged_bodies  # noqa: E402


def _changes_workload_uncached(recorded: str, body: bytes) -> bool:
    applied = contract.parse_recorded(recorded)
    return applied is not None and observed._as_compared(applied) != observed._as_compared(json.loads(body))


# Each cache: the module attribute the sync calls it by, and what it is without the cache.
CACHES: dict[str, tuple[Any, str, Callable[..., Any]]] = {
    "which workloads an answer changes (observed._changes_workload)": (
        observed,
        "_changes_workload",
        _changes_workload_uncached,
    ),
    "what a record holds at immutable fields (immutable.recorded_fields)": (
        immutable,
        "recorded_fields",
        immutable.recorded_fields.__wrapped__,
    ),
}


def per_sync(bodies: list[bytes], memo: RenderMemo) -> float:
    started = time.perf_counter()
    for body in bodies:
        reconcile.sync_answer(parse_request(decode(body)), memo=memo)
    return (time.perf_counter() - started) / len(bodies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--syncs", type=int, default=40, help="distinct syncs per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    bodies = converged_bodies(args.syncs)
    variants = ["every cache", *CACHES]
    memos = {variant: RenderMemo() for variant in variants}
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(args.rounds + 1):  # the first round warms the memos
        for variant in variants:
            taken_out = CACHES.get(variant)
            original = getattr(taken_out[0], taken_out[1]) if taken_out else None
            if taken_out:
                setattr(taken_out[0], taken_out[1], taken_out[2])
            try:
                elapsed = per_sync(bodies, memos[variant])
            finally:
                if taken_out:
                    setattr(taken_out[0], taken_out[1], original)
            if round_index:
                times[variant].append(elapsed)
    base = statistics.median(times["every cache"])
    print(f"{args.syncs} distinct converged PD syncs a round, {args.rounds} rounds, a warm memo per variant")
    for variant in variants:
        median = statistics.median(times[variant])
        print(f"{variant:72s} {median * 1e6:7.0f} us/sync  {base / median:5.2f}x the throughput")


if __name__ == "__main__":
    main()
