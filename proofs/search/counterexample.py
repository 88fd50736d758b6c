"""Search for a scenario that reaches a goal (proofs/search/goals.py), and shrink it.

Method: random search + shrinking.  Scenarios are drawn from per-goal
distributions that make the goal likely (small token budgets and many
decodes for starvation, tight pools and long outputs for thrash, the priority
policy for priority inversion, chunked prefill off and small budgets for
stalls, ...), run through the engine (reference/engine.py `run_scenario`) on
any implementation of reference/impl.py's protocol, and judged by the goal's
predicate.  Each of the first hits is shrunk by the project's one shrinker
(reference/shrink.py `shrink_while`) with the predicate "the goal is still
reached": fewest requests first, then fewest steps, then smallest numbers
(and, unless the config is fixed, the simplest config); the smallest is kept.

An exception while the implementation runs a drawn scenario is the
implementation's (`ImplementationFailed`); one while a goal judges the run is
a bug of the goal's finder (`GoalFailed`), not of the implementation.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedspec.reference.engine import run_scenario
from schedspec.reference.scenario import RequestSpec, Scenario
from schedspec.reference.shrink import ShrinkStats, scenario_size, shrink_while
from schedspec.spec.config import ConfigError, config_from_dict
from .goals import Goal, Hit, last_event_step, state_key

METHOD = "random search + shrinking"


class _Stop(Exception):
    """Ends a run early once a liveness goal's cycle is closed."""


class ImplementationFailed(RuntimeError):
    """The implementation raised while running a scenario."""


class GoalFailed(RuntimeError):
    """A goal's finder raised while judging a run: a bug of the search, not of
    the implementation."""


def evaluate(scenario: Scenario, impl, goal: Goal, k: int, info: dict | None = None) -> Hit | None:
    """Run `scenario` on `impl` and judge it; a rejected scenario reaches nothing.
    `info["undecided"]` tells whether the run used up max_steps with requests
    still present and no repeated state: a long run, not a proven livelock.
    Raises ImplementationFailed when `impl` raises, GoalFailed when the goal does."""
    transitions: list = []
    seen: set = set()
    after = last_event_step(scenario)

    def on_step(t) -> None:
        transitions.append(t)
        # A liveness run can stop once its state repeats: the rest is that cycle again.
        if goal.liveness and t.step >= after and t.before.requests:
            key = state_key(t.before)
            if key in seen:
                raise _Stop
            seen.add(key)

    try:
        trace = run_scenario(scenario, impl, on_step=on_step)
        if "error" in trace:
            return None
        stopped = False
    except _Stop:
        stopped = True
    except Exception as e:
        raise ImplementationFailed(f"{getattr(impl, 'name', impl)} raised on scenario {scenario.name!r}: "
                                   f"{type(e).__name__}: {e}") from e
    try:
        hit = goal.find(scenario, transitions, k)
    except Exception as e:
        raise GoalFailed(f"internal error: goal {goal.name} raised while judging a run of {scenario.name!r} "
                         f"(a bug of the search, not of {getattr(impl, 'name', impl)}): "
                         f"{type(e).__name__}: {e}") from e
    if info is not None:
        info["undecided"] = (hit is None and not stopped and bool(transitions)
                             and bool(trace["summary"]["unfinished"]))
    return hit


# --- drawing scenarios that make a goal likely -------------------------------------------

# Per goal: probabilities and ranges the draw leans on.
_BASE = {"priority": 0.25, "chunked_off": 0.2, "small_budget": 0.5, "tight_pool": 0.5, "no_full_isl": 0.3,
         "watermark": 0.15, "threshold": 0.15, "decodes": 0.4, "long_outputs": 0.5,
         "seqs": (1, 2, 2, 3, 4, 6), "arrivals": (0, 0, 1, 3, 6)}
PROFILES: dict[str, dict[str, Any]] = {
    "starvation": {"small_budget": 0.9, "decodes": 0.7, "long_outputs": 0.8, "seqs": (2, 3, 4, 8),
                   "tight_pool": 0.1},
    "running-starved": {"small_budget": 0.8, "priority": 0.5, "tight_pool": 0.7, "threshold": 0.3,
                        "seqs": (2, 3, 4)},
    "thrash": {"tight_pool": 0.95, "no_full_isl": 0.7, "long_outputs": 0.9, "priority": 0.5,
               "seqs": (2, 3, 4, 6)},
    "hol-blocking": {"tight_pool": 0.7, "watermark": 0.3, "chunked_off": 0.4, "small_budget": 0.6,
                     "seqs": (2, 3, 4, 6)},
    "priority-inversion": {"priority": 1.0, "small_budget": 0.8, "decodes": 0.6, "long_outputs": 0.8,
                           "seqs": (2, 3, 4)},
    "stall": {"chunked_off": 0.6, "small_budget": 0.8, "tight_pool": 0.6, "watermark": 0.3, "no_full_isl": 0.5},
    "liveness": {"chunked_off": 0.5, "small_budget": 0.7, "tight_pool": 0.7, "no_full_isl": 0.5, "priority": 0.5,
                 "watermark": 0.3, "threshold": 0.3},
}


def profile_for(goal_name: str) -> dict[str, Any]:
    key = "liveness" if goal_name.startswith("liveness:") else goal_name
    return {**_BASE, **PROFILES.get(key, {})}


def draw_config(rng: random.Random, p: dict[str, Any]) -> dict[str, Any]:
    """A small config vLLM accepts, leaning the profile's way."""
    L = rng.choice([4, 6, 8, 12, 16, 24, 32])
    bs = rng.choice([b for b in (1, 2, 4, 8) if b <= L])
    per_seq = math.ceil(L / bs)
    if rng.random() < p["tight_pool"]:
        nb = per_seq + 1 + rng.choice([0, 0, 1, 2, max(1, per_seq // 2)])
    else:
        nb = per_seq + 1 + rng.choice([per_seq, 4 * per_seq, 50])
    seqs = rng.choice(p["seqs"])
    chunked = rng.random() >= p["chunked_off"]
    if chunked:
        B = rng.randint(seqs, max(seqs, rng.choice([4, 8, L, 2 * L])))
    else:
        B = max(L, seqs) + rng.choice([0, 0, 4])
    c: dict[str, Any] = {"max_num_batched_tokens": B, "max_num_seqs": seqs, "max_model_len": L,
                         "block_size": bs, "num_gpu_blocks": nb}
    if not chunked:
        c["enable_chunked_prefill"] = False
    if rng.random() < p["small_budget"]:
        c["max_num_scheduled_tokens"] = rng.randint(1, min(B, rng.choice([1, 2, 3, 4, L])))
    if rng.random() < p["priority"]:
        c["policy"] = "priority"
    if rng.random() < p["no_full_isl"]:
        c["scheduler_reserve_full_isl"] = False
    if rng.random() < p["watermark"]:
        c["watermark"] = rng.choice([0.1, 0.2, 0.3])
    if rng.random() < p["threshold"]:
        c["long_prefill_token_threshold"] = rng.randint(1, min(L, 4))
    return c


def draw_requests(rng: random.Random, p: dict[str, Any], L: int, max_requests: int,
                  priority: bool, max_prompt_len: int | None = None) -> tuple[RequestSpec, ...]:
    n = rng.randint(2 if max_requests >= 2 else 1, max_requests)
    horizon = rng.choice(p["arrivals"])
    arrivals = sorted(rng.randint(0, horizon) for _ in range(n))
    reqs = []
    for i in range(n):
        top = min(L - 1, max_prompt_len or L)
        if rng.random() < p["decodes"]:
            prompt = rng.randint(1, min(2, top))
        else:
            prompt = rng.randint(1, top)
        if rng.random() < p["long_outputs"]:
            max_tokens = None  # up to max_model_len
        else:
            max_tokens = rng.randint(1, max(1, L - prompt))
        output_len = rng.randint(1, L) if rng.random() < 0.2 else None
        prio = rng.randint(0, 3) if priority else 0
        reqs.append(RequestSpec(id=f"r{i}", prompt_len=prompt, arrival_step=arrivals[i], max_tokens=max_tokens,
                                output_len=output_len, priority=prio, arrival_time=float(i)))
    return tuple(reqs)


def draw_scenario(rng: random.Random, goal_name: str, max_requests: int, max_steps: int,
                  fixed_config: dict[str, Any] | None = None, max_prompt_len: int | None = None) -> Scenario:
    p = profile_for(goal_name)
    if fixed_config is None and max_prompt_len is None and goal_name.startswith("property:") \
            and rng.random() < 0.5:
        # Properties: also the differential campaign's broad draws (aborts, ties, big pools).
        from schedspec.reference.generator import generate_scenario

        s = generate_scenario(rng, 0)
        if len(s.requests) <= max_requests:
            return dataclasses.replace(s, name=f"search-{goal_name}", max_steps=max_steps).without_late_arrivals()
    while True:
        config = dict(fixed_config) if fixed_config is not None else draw_config(rng, p)
        try:
            c = config_from_dict(config)
        except ConfigError:
            if fixed_config is not None:
                raise
            continue
        if c.max_model_len < 2:
            raise ConfigError("config.max_model_len", "must be at least 2 for a request to fit")
        L = min(c.max_model_len, 64)
        reqs = draw_requests(rng, p, L, max_requests, c.policy == "priority", max_prompt_len)
        return Scenario(name=f"search-{goal_name}", config=c, requests=reqs,
                        max_steps=max_steps).without_late_arrivals()


# --- the search --------------------------------------------------------------------------


@dataclass
class SearchResult:
    goal: str
    k: int
    found: Scenario | None
    hit: Hit | None
    original: Scenario | None
    tried: int
    undecided: int  # runs that used up max_steps with requests unfinished and no repeated state
    search_seconds: float
    shrink: ShrinkStats | None
    max_requests: int
    max_steps: int
    seed: int
    method: str = METHOD


# --- judging candidates on worker processes (reference/workers.py) ----------------------------------------

#: Candidates drawn and judged per round when workers judge them: enough to keep
#: every worker busy, few enough that a hit early in a round wastes little.
PER_WORKER_ROUND = 16


@dataclass
class Judge:
    """A worker's goal and implementation."""

    goal: Goal
    k: int
    impl: Any


def setup_judge(goal_name: str, k: int, impl_name: str) -> Judge:
    from schedspec.reference.loader import load_impl

    from .goals import get_goal

    return Judge(get_goal(goal_name), k, load_impl(impl_name))


def judge(j: Judge, scenario: Scenario, heartbeat) -> tuple[str, Any, bool]:
    """("hit", Hit | None, undecided), or the failure as ("implementation" |
    "goal", message, False), raised again in the searching process."""
    info: dict = {}
    try:
        return "hit", evaluate(scenario, j.impl, j.goal, j.k, info), bool(info.get("undecided", False))
    except ImplementationFailed as e:
        return "implementation", str(e), False
    except GoalFailed as e:
        return "goal", str(e), False


def judged_in_order(goal: Goal, k: int, impl, scenarios: list[Scenario], pool=None):
    """(hit, undecided) of each scenario, in order: here, or on `pool`'s worker
    processes (reference/workers.py `open_pool` of `setup_judge` and `judge`).  The
    first failure, in scenario order, is raised as evaluate raises it."""
    if pool is None:
        out = []
        for s in scenarios:
            info: dict = {}
            out.append((evaluate(s, impl, goal, k, info), bool(info.get("undecided", False))))
        return out
    from schedspec.reference.workers import SetupError, WorkerFailure

    try:
        got = dict(pool.run(list(enumerate(scenarios))))
    except SetupError as e:
        raise ImplementationFailed(str(e)) from None
    out = []
    for i, s in enumerate(scenarios):
        r = got[i]
        if isinstance(r, WorkerFailure):
            raise ImplementationFailed(f"{getattr(impl, 'name', impl)} {r.kind} its worker on scenario "
                                       f"{s.name!r}: {r.detail}")
        kind, value, undecided = r
        if kind == "implementation":
            raise ImplementationFailed(value)
        if kind == "goal":
            raise GoalFailed(value)
        out.append((value, undecided))
    return out


def search(goal: Goal, k: int, impl, *, max_requests: int = 6, max_steps: int = 64, seed: int = 0,
           tries: int = 20000, budget_s: float = 60.0, fixed_config: dict[str, Any] | None = None,
           shrink_s: float = 20.0, max_prompt_len: int | None = None, candidates: int = 5,
           progress: Callable[[int, int], None] | None = None, workers: int = 1,
           impl_name: str | None = None) -> SearchResult:
    """Draw, judge and shrink until `candidates` hits, `tries` draws or
    `budget_s` seconds.  With `workers` > 1 (and `impl_name`, for the workers
    to load), candidates are judged in rounds on worker processes and taken
    in the order drawn: the same hits as one worker, the budget aside, which
    is checked between rounds.  Shrinking stays in this process, on `impl`."""
    rng = random.Random(f"schedspec-counterexample/{goal.name}/{seed}")
    t0 = time.monotonic()
    deadline = t0 + budget_s
    tried = undecided = 0

    def reached(s: Scenario) -> Hit | None:
        try:
            return evaluate(s, impl, goal, k)
        except ImplementationFailed:
            return None  # a crash is not the goal being shrunk

    best: SearchResult | None = None
    hits = 0
    judged: list[tuple[Scenario, Hit | None, bool]] = []
    pool = None
    if workers > 1 and impl_name is not None:
        from schedspec.reference.workers import Job, open_pool

        pool = open_pool(Job("schedspec.proofs.search.counterexample:setup_judge", (goal.name, k, impl_name),
                             "schedspec.proofs.search.counterexample:judge"), workers=workers)
    per_round = 1 if pool is None else workers * PER_WORKER_ROUND
    try:
        while tried < tries and time.monotonic() < deadline and hits < candidates:
            if not judged:
                batch = [draw_scenario(rng, goal.name, max_requests, max_steps, fixed_config, max_prompt_len)
                         for _ in range(min(per_round, tries - tried))]
                verdicts = judged_in_order(goal, k, impl, batch, pool)
                judged = [(s, h, u) for s, (h, u) in zip(batch, verdicts)]
            s, hit, was_undecided = judged.pop(0)
            tried += 1
            if progress is not None:
                progress(tried, tries)
            undecided += was_undecided
            if hit is None:
                continue
            # Several hits, each shrunk, the smallest kept: greedy shrinking stops in local minima.
            hits += 1
            found_at = time.monotonic() - t0
            small, shit, stats = shrink_while(s, reached, hit, last_step=lambda h: h.last_step,
                                              fix_config=fixed_config is not None,
                                              budget_s=max(0.5, min(shrink_s, deadline - time.monotonic())))
            if best is None or scenario_size(small) < scenario_size(best.found):
                best = SearchResult(goal.name, k, small, shit, s, tried, undecided, found_at, stats,
                                    max_requests, max_steps, seed)
    finally:
        if pool is not None:
            pool.close()
    if best is not None:
        best.tried, best.undecided = tried, undecided
        return best
    return SearchResult(goal.name, k, None, None, None, tried, undecided, time.monotonic() - t0, None,
                        max_requests, max_steps, seed)
