"""How long `schedspec counterexample GOAL` takes for each goal, on the spec.

    .venv/bin/python benchmarks/counterexample_search.py [--goals starvation,stall] [--seed 0]

Prints, per goal: scenarios drawn, time to the first hit, total time (search
and shrinking of up to 5 hits, as the CLI does), and the size of the scenario
kept; or "none within the bound" with the time the bounded search took.
"""

from __future__ import annotations

import argparse
import time

from schedspec.cli.counterexample import (
    DEFAULT_LIVENESS_MAX_STEPS,
    DEFAULT_MAX_STEPS,
)
from schedspec.proofs.search.counterexample import search
from schedspec.proofs.search.goals import GOALS, get_goal
from schedspec.reference.loader import load_impl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goals", default=",".join(list(GOALS) + ["property:kv_blocks_conserved"]))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--impl", default="spec")
    ap.add_argument("--tries", type=int, default=20000)
    args = ap.parse_args()
    impl = load_impl(args.impl)
    print(f"{'goal':<34} {'drawn':>6} {'first hit':>10} {'total':>8}  result")
    for name in args.goals.split(","):
        goal = get_goal(name)
        steps = DEFAULT_LIVENESS_MAX_STEPS if goal.liveness else DEFAULT_MAX_STEPS
        t0 = time.perf_counter()
        r = search(goal, 3, impl, max_steps=steps, seed=args.seed, tries=args.tries, budget_s=120)
        total = time.perf_counter() - t0
        if r.found is None:
            print(f"{name:<34} {r.tried:>6} {'-':>10} {total:>7.2f}s  none within the bound "
                  f"({r.tried} scenarios, <= 6 requests, {steps} steps)")
        else:
            print(f"{name:<34} {r.tried:>6} {r.search_seconds:>9.2f}s {total:>7.2f}s  "
                  f"{len(r.found.requests)} request(s), {r.found.max_steps} step(s)")


if __name__ == "__main__":
    main()
