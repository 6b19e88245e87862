"""What each remembered record read is worth, side by side in one run (not a test):

    .venv/bin/python tests/bench/caches.py [--syncs 40] [--rounds 15]

The render memo keeps each parent's render and roll-up, and what the observed children's
last-applied records say (which services the answer changes, what the immutable fields were
applied as): work every distinct sync would otherwise repeat, parsing the records above all.
This runs distinct syncs of one converged PD graph in one process, a warm memo each, with every
step kept and then with each of those reads computed afresh on every sync, and prints each
variant's median time per sync against the first. Rounds of the variants alternate, so the
machine's noise moves them alike; compare ratios, not microseconds.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hooks import answer, reconcile  # noqa: E402
from hooks.contract import decode, parse_request  # noqa: E402
from hooks.memo import ParentEntry, RenderMemo  # noqa: E402
from tests.support.requests import converged_bodies  # noqa: E402

# Each remembered read, by what it tells.
READS: dict[str, Callable[..., Any]] = {
    "which services an answer changes (answer.services_changing)": answer.services_changing,
    "what the records hold at immutable fields (answer.recorded_fields)": answer.recorded_fields,
}


class Forgetting(RenderMemo):
    """A memo that computes `forgotten` afresh on every call and keeps the rest."""

    def __init__(self, forgotten: Callable[..., Any] | None) -> None:
        super().__init__()
        self.forgotten = forgotten

    def remembered(self, entry: ParentEntry, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if function is self.forgotten:
            return function(*args, **kwargs)
        return super().remembered(entry, function, *args, **kwargs)


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
    variants = ["every step kept", *READS]
    memos = {variant: Forgetting(READS.get(variant)) for variant in variants}
    times: dict[str, list[float]] = {variant: [] for variant in variants}
    for round_index in range(args.rounds + 1):  # the first round warms the memos
        for variant in variants:
            elapsed = per_sync(bodies, memos[variant])
            if round_index:
                times[variant].append(elapsed)
    base = statistics.median(times["every step kept"])
    print(f"{args.syncs} distinct converged PD syncs a round, {args.rounds} rounds, a warm memo per variant")
    for variant in variants:
        median = statistics.median(times[variant])
        print(f"{variant:72s} {median * 1e6:7.0f} us/sync  {base / median:5.2f}x the throughput")


if __name__ == "__main__":
    main()
