"""Counterexample goals: named predicates over one run of a scenario.

A goal looks at the engine's transitions (reference/engine.py `Transition`:
the state before `schedule()`, its output, the state after
`update_from_output()`) and says whether, and where, the run reaches it.
The engine lists no idle step (one in which the scheduler held no request),
so a step's number (`Transition.step`) is not its position in the list: a
finder looks steps up by number (`at_step`, `steps_between`), never by index.  The
same predicate judges the spec, vLLM (`--impl vllm`) and any implementation of
reference/impl.py's protocol, because it reads only what `observe()` reports.

Words, used the same way in every goal:
- a request is *present* in step t when it has arrived and not finished:
  it is in `before.requests` (arrivals and aborts of step t already applied);
- it is *waiting* in step t when it is in `before.waiting`, *running* when it
  is in `before.running`;
- it *receives tokens* in step t when `schedule()` grants it at least one
  token that is not refunded (it appears in `output.num_scheduled_tokens`);
- the *step budget* is min(token_budget, max_num_batched_tokens)
  (spec.properties.get_step_budget);
- a waiting request *would fit* in step t when the spec's admission test
  (run slot, budget, chunked-prefill rule, `allocate_slots` with the full-ISL
  gate and the watermark) passes for it on what the step left: the run slots,
  the token budget and the free blocks after the step's grants and preemptions.

Every goal with a count K needs K *consecutive* steps (or, for `thrash`, K
preemptions).  The liveness goals need no K: they ask for a repeated state
after the last arrival and abort, which proves the run never ends (see
`cycle_in`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from schedspec.spec.config import PRIORITY
from schedspec.spec.kv_cache import allocate_slots
from schedspec.spec.properties import (
    PROPERTIES,
    get_block_demand,
    get_long_prefill_threshold,
    get_step_budget,
)
from schedspec.spec.state import SchedulerState


@dataclass(frozen=True)
class Hit:
    """Where a run reaches a goal: the request(s), the steps (inclusive), in words."""

    goal: str
    requests: tuple[str, ...]
    first_step: int
    last_step: int
    detail: str
    values: dict = field(default_factory=dict)

    @property
    def steps(self) -> str:
        if self.first_step == self.last_step:
            return f"step {self.first_step}"
        return f"steps {self.first_step}-{self.last_step}"


# A finder gets the scenario, the transitions of its run and K.
Finder = Callable[[object, Sequence[object], int], "Hit | None"]


@dataclass(frozen=True)
class Goal:
    name: str
    doc: str
    find: Finder
    # How `schedspec run FILE` shows it (for the file's description).
    shows: str = ""
    uses_k: bool = True
    liveness: bool = False


# --- steps by number --------------------------------------------------------------------


def _position(transitions: Sequence, step: int) -> int:
    """The list position of the first transition of step `step` or later."""
    return bisect.bisect_left(transitions, step, key=lambda t: t.step)


def at_step(transitions: Sequence, step: int):
    """The transition of engine step `step` (a listed step: not an idle one)."""
    i = _position(transitions, step)
    if i == len(transitions) or transitions[i].step != step:
        raise LookupError(f"step {step} is not in the run's transitions (an idle step, or after the run)")
    return transitions[i]


def steps_between(transitions: Sequence, first: int, last: int) -> Sequence:
    """The transitions of steps first..last (inclusive) that the run lists."""
    return transitions[_position(transitions, first):_position(transitions, last + 1)]


# --- what one step left -----------------------------------------------------------------


@dataclass(frozen=True)
class StepRemainder:
    running: int  # len(running) after schedule()
    budget: int  # step budget not granted
    free_blocks: int  # free blocks after schedule()


def remainder(t) -> StepRemainder:
    """Run slots, budget and free blocks the step left, computed from the state
    before it and its output (no partial allocation, so each grant took exactly
    its block demand; a victim freed what it held before the step)."""
    before, out = t.before, t.output
    granted = out.num_scheduled_tokens
    free = before.num_free_blocks
    free += sum(before.num_blocks(p) for p in out.preempted_req_ids)
    free -= sum(get_block_demand(before, rid, n) for rid, n in granted if rid not in out.preempted_req_ids)
    running = len(before.running) - len(set(out.preempted_req_ids) & set(before.running)) + len(out.admitted)
    return StepRemainder(running, get_step_budget(before) - out.total_num_scheduled_tokens, free)


def would_fit(t, rid: str) -> bool:
    """The spec's admission test for waiting request `rid` on what step `t` left."""
    before = t.before
    c = before.config
    rest = remainder(t)
    if rest.running >= c.max_num_active_reqs or rest.budget <= 0:
        return False
    r = before.requests[rid]
    n = r.num_tokens - r.num_computed_tokens
    threshold = get_long_prefill_threshold(before)
    if 0 < threshold < n:
        n = threshold
    if not c.enable_chunked_prefill and n > rest.budget:
        return False
    n = min(n, rest.budget)
    return allocate_slots(c, r, n, before.num_blocks(rid), rest.free_blocks,
                          full_sequence_must_fit=c.scheduler_reserve_full_isl,
                          has_scheduled_reqs=rest.running > 0) is not None


def _streaks(transitions, k: int, holds: Callable[[object, object], bool], keys: Callable[[object], Sequence]):
    """The first (key, first_step, last_step) where `holds(t, key)` is true in
    k consecutive steps; `keys(t)` lists the candidates of step t.  An idle
    step (no request present, so not listed) ends every streak."""
    start: dict = {}
    previous = None
    for t in transitions:
        if previous is not None and t.step != previous + 1:
            start.clear()
        previous = t.step
        current = {key for key in keys(t) if holds(t, key)}
        for key in list(start):
            if key not in current:
                del start[key]
        for key in keys(t):
            if key in current:
                start.setdefault(key, t.step)
                if t.step - start[key] + 1 >= k:
                    return key, start[key], t.step
    return None


# --- the goals ---------------------------------------------------------------------------


def _decodes_take_budget(t) -> bool:
    """The D >= B condition of the step: every request running before it needs
    exactly one token, a run slot is free, and the running requests' grants
    use the whole step budget."""
    b, out = t.before, t.output
    if not b.running or len(b.running) >= b.config.max_num_active_reqs:
        return False
    if any(b.requests[r].num_tokens - b.requests[r].num_computed_tokens != 1 for r in b.running):
        return False
    granted = out.scheduled
    return sum(granted.get(r, 0) for r in b.running) == get_step_budget(b)


def find_starvation(scenario, transitions, k):
    hit = _streaks(transitions, k, lambda t, rid: rid not in t.output.scheduled and _decodes_take_budget(t),
                   lambda t: t.before.waiting)
    if hit is None:
        return None
    rid, a, z = hit
    b = at_step(transitions, a).before
    return Hit("starvation", (rid,), a, z,
               f"{rid} waits with no tokens in {k} consecutive steps while a run slot is free and "
               f"{len(b.running)} running decode(s) ({', '.join(b.running)}), each needing one token, take the "
               f"whole step budget B = {get_step_budget(b)} (D >= B)",
               {"D": len(b.running), "B": get_step_budget(b)})


def find_waits(scenario, transitions, k):
    hit = _streaks(transitions, k, lambda t, rid: rid not in t.output.scheduled, lambda t: t.before.waiting)
    if hit is None:
        return None
    rid, a, z = hit
    return Hit("waits", (rid,), a, z, f"{rid} waits with no tokens in {k} consecutive steps (any cause)")


def find_running_starved(scenario, transitions, k):
    hit = _streaks(transitions, k, lambda t, rid: rid not in t.output.scheduled, lambda t: t.before.running)
    if hit is None:
        return None
    rid, a, z = hit
    return Hit("running-starved", (rid,), a, z,
               f"{rid} is running and receives no tokens in {k} consecutive steps")


def find_thrash(scenario, transitions, k):
    count: dict[str, list[int]] = {}
    for t in transitions:
        for rid in t.output.preempted_req_ids:
            count.setdefault(rid, []).append(t.step)
            if len(count[rid]) >= k:
                steps = count[rid]
                return Hit("thrash", (rid,), steps[0], steps[-1],
                           f"{rid} is preempted {k} times, in steps {', '.join(map(str, steps))}")
    return None


def _blocking_head(t):
    """The first request of the waiting queue that the step did not admit."""
    return next((w for w in t.before.waiting if w not in t.output.scheduled), None)


def find_hol_blocking(scenario, transitions, k):
    def holds(t, rid):
        head = _blocking_head(t)
        return (not t.output.preempted_req_ids and head is not None and head != rid
                and rid not in t.output.scheduled and would_fit(t, rid))

    def keys(t):
        head = _blocking_head(t)
        if head is None:
            return ()
        return t.before.waiting[t.before.waiting.index(head) + 1:]

    hit = _streaks(transitions, k, holds, keys)
    if hit is None:
        return None
    rid, a, z = hit
    heads = sorted({_blocking_head(t) for t in steps_between(transitions, a, z)})
    return Hit("hol-blocking", (rid,) + tuple(heads), a, z,
               f"{rid} would fit the free pool and the budget but waits {k} consecutive steps behind "
               f"{', '.join(heads)} at the head of the waiting queue, which does not fit")


def find_priority_inversion(scenario, transitions, k):
    def keys(t):
        b = t.before
        if b.config.policy != PRIORITY:
            return ()
        return [(w, r) for w in b.waiting for r in b.running
                if b.requests[r].priority > b.requests[w].priority]

    def holds(t, pair):
        w, r = pair
        return w not in t.output.scheduled and r in t.output.scheduled

    hit = _streaks(transitions, k, holds, keys)
    if hit is None:
        return None
    (w, r), a, z = hit
    b = at_step(transitions, a).before
    return Hit("priority-inversion", (w, r), a, z,
               f"{w} (priority {b.requests[w].priority}) waits {k} consecutive steps while {r} "
               f"(priority {b.requests[r].priority}, lower) runs and receives tokens in each of them")


def find_stall(scenario, transitions, k):
    hit = _streaks(transitions, k, lambda t, _: not t.output.num_scheduled_tokens,
                   lambda t: ("*",) if t.before.requests else ())
    if hit is None:
        return None
    _, a, z = hit
    present = tuple(sorted(at_step(transitions, a).before.requests))
    return Hit("stall", present, a, z,
               f"{k} consecutive steps with unfinished requests ({', '.join(present)}) in which no request "
               "receives any token")


# --- liveness: a repeated state proves the run never ends --------------------------------


def state_key(s: SchedulerState):
    """Everything the next steps depend on once no arrival or abort is left.

    num_preemptions is left out: it is a counter no rule reads.  The fake model
    reads only num_output_tokens and the scenario's fixed output_len."""
    reqs = tuple((rid, int(r.status), r.num_computed_tokens, r.num_output_tokens)
                 for rid, r in sorted(s.requests.items()))
    return (reqs, s.running, s.waiting, tuple(sorted(s.req_to_num_blocks.items())), s.num_free_blocks)


def last_event_step(scenario) -> int:
    steps = [r.arrival_step for r in scenario.requests] + [a.step for a in scenario.aborts]
    return max(steps, default=0)


def cycle_in(scenario, transitions):
    """(first, repeat) steps whose before-states are equal, both at or after the
    last arrival and abort, with requests still present; or None.

    The step is a function of the state (the spec is deterministic and the fake
    model reads only the state and the fixed output_len), so from `repeat` on
    the run repeats steps first..repeat-1 forever: the requests present never
    finish.  Between arrivals the state space is finite (counters are bounded by
    max_model_len and max_tokens), so a run that never ends must repeat a state:
    the test is complete, given enough steps."""
    seen: dict = {}
    after = last_event_step(scenario)
    for t in transitions:
        if t.step < after or not t.before.requests:
            continue
        key = state_key(t.before)
        if key in seen:
            return seen[key], t.step
        seen[key] = t.step
    return None


def find_never_finishes(scenario, transitions, k):
    cyc = cycle_in(scenario, transitions)
    if cyc is None:
        return None
    a, z = cyc
    stuck = tuple(sorted(at_step(transitions, a).before.requests))
    return Hit("liveness:finishes", stuck, a, z,
               f"the state before step {z} equals the state before step {a}, after the last arrival: the run "
               f"repeats steps {a}-{z - 1} forever and {', '.join(stuck)} never finish(es), although every "
               "request fits an empty pool (vLLM's start-up check)",
               {"period": z - a})


def find_waits_while_fits(scenario, transitions, k):
    cyc = cycle_in(scenario, transitions)
    if cyc is None:
        return None
    a, z = cyc
    loop = steps_between(transitions, a, z - 1)
    for rid in at_step(transitions, a).before.waiting:
        if all(rid in t.before.waiting and rid not in t.output.scheduled for t in loop):
            fits = [t.step for t in loop if would_fit(t, rid)]
            if fits:
                return Hit("liveness:waits-while-fits", (rid,), a, z,
                           f"{rid} waits forever (the run repeats steps {a}-{z - 1}) although in step "
                           f"{fits[0]} of the cycle the free pool, a run slot and the budget left could hold it",
                           {"period": z - a})
    return None


def _property_goal(name: str) -> Goal:
    prop = PROPERTIES[name]

    def find(scenario, transitions, k):
        for t in transitions:
            v = prop.check(t.before, t.output, t.after)
            if not v.holds:
                values = ", ".join(f"{a}={b}" for a, b in v.values.items())
                return Hit(f"property:{name}", (), t.step, t.step,
                           f"{name} is violated in step {t.step}: {v.detail} ({values})")
        return None

    return Goal(f"property:{name}", f"the registry property {name} is violated in some step: {prop.doc}",
                find, shows="`schedspec check FILE` reports it VIOLATED", uses_k=False)


_WAITS = "the request is in the `waiting` count and absent from the step's grants"
GOALS: dict[str, Goal] = {g.name: g for g in (
    Goal("starvation", "a waiting request receives no tokens in K consecutive steps, in each of which a run "
         "slot is free and D running decodes (each needing one token) take the whole step budget B (D >= B)",
         find_starvation, shows=_WAITS),
    Goal("waits", "a waiting request receives no tokens in K consecutive steps, whatever the cause (run slots, "
         "budget, pool)", find_waits, shows=_WAITS),
    Goal("running-starved", "a running request receives no tokens in K consecutive steps", find_running_starved,
         shows="the request is running and absent from the step's grants"),
    Goal("thrash", "a request is preempted at least K times", find_thrash,
         shows="the request appears after PREEMPTED in K steps"),
    Goal("hol-blocking", "a waiting request that would fit the free pool, a run slot and the budget left waits "
         "K consecutive steps behind a waiting-queue head that does not fit", find_hol_blocking, shows=_WAITS),
    Goal("priority-inversion", "under the priority policy, a waiting request waits K consecutive steps while one "
         "running request of strictly lower priority (larger value) receives tokens in each of them",
         find_priority_inversion, shows="the lower-priority request is in the grants, the waiting one is not"),
    Goal("stall", "K consecutive steps with unfinished requests in which no request receives any token",
         find_stall, shows="the steps show `0 tok` and no grant"),
    Goal("liveness:finishes", "some request never finishes: the state repeats after the last arrival, with "
         "requests present, so the run cycles forever (every valid request fits an empty pool)",
         find_never_finishes, shows="the same steps repeat until max_steps, the requests stay unfinished",
         uses_k=False, liveness=True),
    Goal("liveness:waits-while-fits", "a request waits forever (a repeated state, as liveness:finishes) although "
         "in some step of the cycle the free pool, a run slot and the budget left could hold it",
         find_waits_while_fits, shows=_WAITS, uses_k=False, liveness=True),
)}


class UnknownGoal(KeyError):
    pass


def get_goal(name: str) -> Goal:
    if name in GOALS:
        return GOALS[name]
    if name.startswith("property:"):
        prop = name.split(":", 1)[1]
        if prop not in PROPERTIES:
            raise UnknownGoal(f"unknown property {prop!r}; the registry has {', '.join(PROPERTIES)}")
        return _property_goal(prop)
    raise UnknownGoal(f"unknown goal {name!r}; use one of {', '.join(GOALS)} or property:NAME")


def goal_names() -> list[str]:
    return list(GOALS) + [f"property:{p}" for p in PROPERTIES]
