"""Search for a scenario that reaches a goal (proofs/goals.py), and shrink it.

Method: random search + shrinking.  Scenarios are drawn from per-goal
distributions that make the goal likely (small token budgets and many
decodes for starvation, tight pools and long outputs for thrash, the priority
policy for priority inversion, chunked prefill off and small budgets for
stalls, ...), run through the engine (reference/engine.py `run_scenario`) on
any implementation of reference/impl.py's protocol, and judged by the goal's
predicate.  The first hit is shrunk by greedy delta debugging whose predicate
is "the goal is still reached": fewest requests first, then fewest steps,
then smallest numbers (and, unless the config is fixed, the simplest config).
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..reference.engine import run_scenario
from ..reference.scenario import RequestSpec, Scenario
from ..spec.config import ConfigError, config_from_dict
from ..spec.request import make_request
from .goals import Goal, Hit

METHOD = "random search + shrinking"


class _Stop(Exception):
    """Ends a run early once a liveness goal's cycle is closed."""


def evaluate(scenario: Scenario, impl, goal: Goal, k: int, info: dict | None = None) -> Hit | None:
    """Run `scenario` on `impl` and judge it; a rejected scenario reaches nothing.
    `info["undecided"]` tells whether the run used up max_steps with requests
    still present and no repeated state: a long run, not a proven livelock."""
    transitions: list = []
    seen: set = set()
    from .goals import last_event_step, state_key

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
    hit = goal.find(scenario, transitions, k)
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
    """A small config vLLM 0.33.0 accepts, leaning the profile's way."""
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
        from ..reference.generator import generate_scenario

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
        return Scenario(name=f"search-{goal_name}", config=config, requests=reqs,
                        max_steps=max_steps).without_late_arrivals()


# --- the goal-preserving shrinker -------------------------------------------------------


def _valid(s: Scenario) -> bool:
    try:
        c = config_from_dict(s.config)
        last = 0
        for r in s.requests:
            if r.arrival_step < last or (r.output_len is not None and r.output_len < 1):
                return False
            last = r.arrival_step
            make_request(c, r.id, r.prompt_len, r.max_tokens, r.priority, r.arrival_time)
    except (ConfigError, TypeError):
        return False
    ids = {r.id: r for r in s.requests}
    return (len(ids) == len(s.requests) and s.max_steps >= 1 and len(s.requests) >= 1
            and all(a.id in ids and a.step > ids[a.id].arrival_step for a in s.aborts))


def _smaller(v: int, lo: int) -> list[int]:
    """Candidates below v, boldest first."""
    out: list[int] = []
    for c in (lo, (lo + v) // 2, v - 1):
        if lo <= c < v and c not in out:
            out.append(c)
    return out


def _size(s: Scenario) -> tuple:
    """The shrinker's order: requests, then steps, then the sum of the numbers."""
    nums = 0
    L = s.config.get("max_model_len", 8192)
    for r in s.requests:
        max_tokens = r.max_tokens if r.max_tokens is not None else max(L - r.prompt_len, 1)
        nums += r.prompt_len + max_tokens + (r.output_len or 0) + r.priority + r.arrival_step
    nums += sum(v for v in s.config.values() if isinstance(v, int) and not isinstance(v, bool))
    # Arrival times other than the list index count a little, so the default order wins ties.
    nums += sum(min(abs(r.arrival_time - i), 1.0) / 2 for i, r in enumerate(s.requests))
    return (len(s.requests), s.max_steps, len(s.aborts), len(s.config), nums)


@dataclass
class ShrinkStats:
    runs: int = 0
    accepted: int = 0
    seconds: float = 0.0


def shrink_goal(scenario: Scenario, reached: Callable[[Scenario], Hit | None], hit: Hit, *,
                fix_config: bool = False, budget_s: float = 20.0, max_runs: int = 4000
                ) -> tuple[Scenario, Hit, ShrinkStats]:
    """Greedy delta debugging that keeps a candidate only if it is valid, still
    reaches the goal (`reached` returns a Hit) and is smaller in `_size` order."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    stats = ShrinkStats()
    best, best_hit = scenario, hit

    def cut_steps(s: Scenario, h: Hit) -> Scenario:
        # a file with an arrival at or after max_steps does not load (formats.md)
        return dataclasses.replace(s, max_steps=min(s.max_steps, h.last_step + 1)).without_late_arrivals()

    def attempt(s: Scenario) -> bool:
        nonlocal best, best_hit
        if stats.runs >= max_runs or time.monotonic() > deadline or not _valid(s) or _size(s) >= _size(best):
            return False
        stats.runs += 1
        try:
            h = reached(s)
        except Exception:  # noqa: BLE001 - an implementation crash is not the goal we shrink
            return False
        if h is None:
            return False
        best, best_hit = cut_steps(s, h), h
        stats.accepted += 1
        return True

    def without(s: Scenario, drop: set[str]) -> Scenario:
        return dataclasses.replace(s, requests=tuple(r for r in s.requests if r.id not in drop),
                                   aborts=tuple(a for a in s.aborts if a.id not in drop))

    best = cut_steps(best, best_hit)
    changed = True
    while changed and time.monotonic() < deadline and stats.runs < max_runs:
        changed = False
        # 1. fewer requests: halves, then one at a time
        chunk = max(1, len(best.requests) // 2)
        while chunk >= 1 and len(best.requests) > 1:
            ids = [r.id for r in best.requests]
            if not any(attempt(without(best, set(ids[i:i + chunk]))) for i in range(0, len(ids), chunk)
                       if len(ids[i:i + chunk]) < len(ids)):
                chunk //= 2
            else:
                changed = True
        # 2. fewer steps: every request earlier, so the condition comes sooner
        for a in list(best.aborts):
            changed |= attempt(dataclasses.replace(best, aborts=tuple(x for x in best.aborts if x != a)))
        shift = min((r.arrival_step for r in best.requests), default=0)
        if shift:
            changed |= attempt(dataclasses.replace(best, requests=tuple(
                dataclasses.replace(r, arrival_step=r.arrival_step - shift) for r in best.requests)))
        # 3. smaller numbers, request by request
        for i in range(len(best.requests)):
            for field, lo in (("arrival_step", 0), ("prompt_len", 1), ("max_tokens", 1), ("output_len", 1),
                              ("priority", 0)):
                while True:
                    r = best.requests[i]
                    v = getattr(r, field)
                    floor = best.requests[i - 1].arrival_step if field == "arrival_step" and i > 0 else lo
                    cands: list[Any] = []
                    if field in ("max_tokens", "output_len") and v is None:
                        cands = [None] if field == "output_len" else []
                        # A bounded max_tokens is a smaller number than the default (max_model_len - prompt).
                        if field == "max_tokens":
                            cands = [1, r.prompt_len]
                    elif isinstance(v, int):
                        cands = _smaller(v, floor)
                        if field == "output_len":
                            cands = [None] + cands
                    ok = False
                    for c in cands:
                        reqs = list(best.requests)
                        reqs[i] = dataclasses.replace(r, **{field: c})
                        if attempt(dataclasses.replace(best, requests=tuple(reqs))):
                            ok = changed = True
                            break
                    if not ok:
                        break
            r = best.requests[i]
            if r.arrival_time != float(i):
                reqs = list(best.requests)
                reqs[i] = dataclasses.replace(r, arrival_time=float(i))
                changed |= attempt(dataclasses.replace(best, requests=tuple(reqs)))
        # 4. a simpler config
        if not fix_config:
            for key in sorted(best.config):
                if key in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size",
                           "num_gpu_blocks"):
                    continue
                changed |= attempt(dataclasses.replace(
                    best, config={k: v for k, v in best.config.items() if k != key}))
            for key, lo in (("max_model_len", 2), ("num_gpu_blocks", 2), ("max_num_batched_tokens", 1),
                            ("max_num_seqs", 1), ("max_num_scheduled_tokens", 1), ("max_num_active_seqs", 1),
                            ("long_prefill_token_threshold", 1), ("block_size", 1)):
                while isinstance(best.config.get(key), int) and any(
                        attempt(dataclasses.replace(best, config={**best.config, key: v}))
                        for v in _smaller(best.config[key], lo)):
                    changed = True
    # Plain ids r0, r1, ... in list order; kept only if the goal still holds, since the
    # priority queue breaks (priority, arrival_time) ties by id.
    names = {r.id: f"r{i}" for i, r in enumerate(best.requests)}
    if any(k != v for k, v in names.items()):
        renamed = dataclasses.replace(
            best, requests=tuple(dataclasses.replace(r, id=names[r.id]) for r in best.requests),
            aborts=tuple(dataclasses.replace(a, id=names[a.id]) for a in best.aborts))
        stats.runs += 1
        h = reached(renamed)
        if h is not None:
            best, best_hit = renamed, h
    stats.seconds = time.monotonic() - t0
    return best, best_hit, stats


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


def search(goal: Goal, k: int, impl, *, max_requests: int = 6, max_steps: int = 64, seed: int = 0,
           tries: int = 20000, budget_s: float = 60.0, fixed_config: dict[str, Any] | None = None,
           shrink_s: float = 20.0, max_prompt_len: int | None = None, candidates: int = 5,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    rng = random.Random(f"schedspec-counterexample/{goal.name}/{seed}")
    t0 = time.monotonic()
    deadline = t0 + budget_s
    tried = undecided = 0
    info: dict = {}

    def reached(s: Scenario) -> Hit | None:
        return evaluate(s, impl, goal, k)

    best: SearchResult | None = None
    hits = 0
    while tried < tries and time.monotonic() < deadline and hits < candidates:
        s = draw_scenario(rng, goal.name, max_requests, max_steps, fixed_config, max_prompt_len)
        tried += 1
        if progress is not None:
            progress(tried, tries)
        try:
            hit = evaluate(s, impl, goal, k, info)
            undecided += info.get("undecided", False)
        except Exception as e:
            raise RuntimeError(f"{getattr(impl, 'name', impl)} raised on a drawn scenario: "
                               f"{type(e).__name__}: {e}") from e
        if hit is None:
            continue
        # Several hits, each shrunk, the smallest kept: greedy shrinking stops in local minima.
        hits += 1
        found_at = time.monotonic() - t0
        small, shit, stats = shrink_goal(s, reached, hit, fix_config=fixed_config is not None,
                                         budget_s=max(0.5, min(shrink_s, deadline - time.monotonic())))
        if best is None or _size(small) < _size(best.found):
            best = SearchResult(goal.name, k, small, shit, s, tried, undecided, found_at, stats,
                                max_requests, max_steps, seed)
    if best is not None:
        best.tried, best.undecided = tried, undecided
        return best
    return SearchResult(goal.name, k, None, None, None, tried, undecided, time.monotonic() - t0, None,
                        max_requests, max_steps, seed)
