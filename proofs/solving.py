"""How every z3 call of `schedspec prove` is run: randomized restarts within a
time budget, and `unknown` only when the whole budget is spent.

Why restarts.  The encodings are if-then-else over bounded integers, and the time
z3 needs on one query is heavy-tailed in its random seed: measured on the 4 + 4
bounded `scheduled_requests_run` claim (block size 3, priority, 4 running and 2
waiting present, one conjunct), seeds 0, 4, 6 and 7 prove it in 0.03-0.05 s and
seeds 1, 2, 3 and 5 are still searching at 10 s; at 200 s with seed 0 alone it
had come back unknown.  A longer timeout on the same seed only waits longer in
the tail; a fresh seed with a short limit leaves it (Gomes, Selman, Crato and
Kautz, "Heavy-tailed phenomena in satisfiability and constraint satisfaction
problems", 2000).  So a call is a schedule of tries: try k runs with random seed
k and the limit `timeout_s * RETRY_FACTORS[k]`, short first and doubling every
second try, the last one long for the genuinely hard queries.  The first try is z3's default
seed, so an easy query is answered as before.

A verdict is z3's: sat and unsat are sound whatever the seed; only the time to
reach them changes.  `unknown` after the last try stays a failure (prove's
contract).
"""

from __future__ import annotations

import io
import time
from typing import Any, Callable

import z3
from z3 import z3printer

from .obligation import Result

# Try k: random seed k, limit timeout_s * RETRY_FACTORS[k].  Each short limit twice:
# an unlucky seed is common (half the seeds in the measurement above) and cheap to
# leave, and ten seeds make a query whose seeds fail half the time unknown once in
# a thousand calls (six seeds, the first schedule: once in 64; a 4 + 4 run on
# 0.25.0's rules came back unknown with them).
# At the default 20 s: 1.25, 1.25, 2.5, 2.5, 5, 5, 10, 10, 20 and 80 s, about 137 s
# at most per call.
RETRY_FACTORS = (1 / 16, 1 / 16, 1 / 8, 1 / 8, 1 / 4, 1 / 4, 1 / 2, 1 / 2, 1, 4)
# Tries after the first, so far in this process (prove reports them per obligation).
RETRIES = {"calls": 0}


def make_solver(timeout_s: float, seed: int = 0):
    # elim-term-ite first: the encoding is mostly if-then-else over integers, which
    # the default QF_LIA strategy handles far worse (unknown after minutes at 3+3).
    s = z3.Then("simplify", "propagate-values", "solve-eqs", "elim-term-ite", "simplify", "smt").solver()
    return _limited(s, timeout_s, seed)


def _limited(s, timeout_s: float, seed: int):
    s.set("timeout", max(1, int(timeout_s * 1000)))
    if seed:  # seed 0 left unset: z3's own default path (setting it changes the path)
        s.set("random_seed", seed)
    return s


def unknown_detail(timeout_s: float) -> str:
    """What an unknown spent, for an obligation's detail line."""
    return f"{len(RETRY_FACTORS)} tries, {timeout_s * sum(RETRY_FACTORS):g} s in all"


def check(constraints: list, timeout_s: float, expect_sat: bool = False,
          also_default: bool = False) -> tuple[str, z3.ModelRef | None, float]:
    """'unsat' / 'sat' / 'unknown' for the conjunction of `constraints`, the model
    when sat, and the seconds spent, over the tries of RETRY_FACTORS.

    expect_sat (a bad variant, a witness): within each try z3's default strategy,
    which finds models faster, gets the first half of the limit and the
    elim-term-ite pipeline the second.  also_default (the loop claims): each try
    runs the pipeline, then the default strategy, each with the whole limit."""
    t0 = time.perf_counter()
    r, model = z3.unknown, None
    for k, factor in enumerate(RETRY_FACTORS):
        if k:
            RETRIES["calls"] += 1
        limit = timeout_s * factor
        if expect_sat:
            solvers = [_limited(z3.Solver(), limit / 2, k), make_solver(limit / 2, k)]
        elif also_default:
            solvers = [make_solver(limit, k), _limited(z3.Solver(), limit, k)]
        else:
            solvers = [make_solver(limit, k)]
        for s in solvers:
            s.add(*constraints)
            r = s.check()
            if r != z3.unknown:
                model = s.model() if r == z3.sat else None
                return str(r), model, time.perf_counter() - t0
    return "unknown", None, time.perf_counter() - t0


def recheck(build: Callable[[], Any], timeout_ms: int) -> tuple[str, Any]:
    """sat / unsat / unknown, over the same tries (seed k, limit timeout_ms *
    factor), of the solvers (or optimizers) `build()` makes, each holding its
    constraints, and the one that answered (for its model).

    A fresh one per try: a z3 solver checked again after a check it gave up on
    has answered sat on a valid claim's negation (the starvation agreement claim,
    1 ms first try then 20 s: a bogus counterexample in 1 run of 30), which would
    refute a true claim, or a bad variant without cause."""
    solver = None
    for k, factor in enumerate(RETRY_FACTORS):
        if k:
            RETRIES["calls"] += 1
        solver = build()
        solver.set("timeout", max(1, int(timeout_ms * factor)))
        solver.set("random_seed", k)
        r = solver.check()
        if r != z3.unknown:
            return str(r), solver
    return "unknown", solver


def first_try(constraints: list, timeout_s: float) -> str:
    """'unsat' / 'sat' / 'unknown' from the first try of a call alone: the
    elim-term-ite pipeline, then z3's default strategy, each with the first try's
    limit (timeout_s * RETRY_FACTORS[0])."""
    limit = timeout_s * RETRY_FACTORS[0]
    for s in (make_solver(limit), _limited(z3.Solver(), limit, 0)):
        s.add(*constraints)
        r = s.check()
        if r != z3.unknown:
            return str(r)
    return "unknown"


def conjuncts(goal) -> list:
    """A conjunction as its conjuncts, flattened: each is checked alone (the same
    claim, and z3 decides the parts faster than the whole)."""
    if z3.is_and(goal):
        return [p for ch in goal.children() for p in conjuncts(ch)]
    return [goal]


def expr_excerpt(e, limit: int = 300) -> str:
    """The start of `e` as z3 prints it, at most `limit` characters.  z3's own str()
    formats up to 10 000 nodes before anything is cut (0.3 s on a loop claim's
    conjunct); a formatter that stops after a few hundred prints the same start."""
    fmt = z3printer.Formatter()
    fmt.max_visited = 2 * limit
    out = io.StringIO()
    z3printer.PP()(out, fmt(e))
    return out.getvalue()[:limit]


def prove_parts(parts, timeout_s: float, check_call=None) -> tuple[str, str]:
    """Each (label, premises, goal) of `parts`, conjunct by conjunct: ("proved", "")
    when every premises ∧ ¬conjunct is unsat, else the status ("refuted": z3 found a
    counterexample; "unknown") and where, at the first conjunct that is not.
    `check_call(constraints, timeout_s)` gives the status (default: `check`)."""
    run = check_call or (lambda cons, t: check(cons, t)[0])
    for label, premises, goal in parts:
        split = conjuncts(goal)
        # The whole goal first, in one short try: most parts z3 proves whole faster
        # than conjunct by conjunct (the loop claims: 1.9 s against 4.8 s for
        # token_budget_respected's 945 conjuncts over its block sizes).  Its unsat
        # proves every conjunct; sat or unknown falls back to the conjuncts, which
        # then give the verdict and where it fails.
        # An injected check_call decides this try too: nothing bypasses it.
        if len(split) > 1 and (run if check_call else first_try)(premises + [z3.Not(goal)], timeout_s) == "unsat":
            continue
        for part in split:
            r = run(premises + [z3.Not(part)], timeout_s)
            if r == "sat":
                return "refuted", f"{label}: {expr_excerpt(part)}"[:300]
            if r == "unknown":
                return "unknown", f"z3 unknown ({unknown_detail(timeout_s)}) in {label}"
    return "proved", ""


def first_unsatisfiable(checks, timeout_s: float) -> tuple[str, str] | None:
    """The first (name, status) of `checks`, (name, constraints) pairs, whose
    constraints z3 does not find satisfiable (a vacuity check), or None."""
    for name, cons in checks:
        r = check(cons, timeout_s, expect_sat=True)[0]
        if r != "sat":
            return name, r
    return None


def vacuity_result(checks, timeout_s: float, t0: float) -> Result:
    """proved when every (name, constraints) of `checks` is satisfiable; else which is
    not (unsat: the claim would be vacuous).  `t0`: when the check began (perf_counter)."""
    bad = first_unsatisfiable(checks, timeout_s)
    if bad is not None:
        name, r = bad
        return Result("refuted" if r == "unsat" else "unknown", time.perf_counter() - t0,
                      f"premises of {name!r} are {r}: the claim would be vacuous")
    return Result("proved", time.perf_counter() - t0, f"{len(checks)} premise sets satisfiable")
