"""Witnesses: the premises of an obligation are satisfiable in a REACHABLE state.

Bounded model checking: the encoding is unrolled `steps` engine steps from the
empty state, with symbolic arrivals (each slot is a request of the scenario with
a symbolic arrival step, prompt, max_tokens, output_len and priority) and a
symbolic config.  z3 finds a run whose last step makes the goal true (a
property applicable, a transition doing something); the run becomes a
formats.md scenario that `schedspec run` / `check` replays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from schedspec.reference.scenario import Abort, RequestSpec, Scenario

from . import encoding
from .obligation import Result
from .property_formulas import PROPERTY_FORMULAS, state_invariant
from .release import Release
from .symbolic import WATERMARKS, SymConfig, SymSlot, SymState

BMC_REQUESTS = 3
BMC_STEPS = 3
# Small numbers make a readable scenario and a fast search.
BMC_BLOCK_SIZES = (1, 2, 4)

# What each non-property witness step shows (goal_formula), for the file's description.
WHAT = {
    "inductive:step": "the step grants tokens",
    "running-kept": "a request running before and after the step, behind another running request, gets tokens",
    "initial": "from the empty state the run reaches a state with a running and a waiting request that "
               "satisfies the state invariant",
    "inductive:add": "a request arrives while another one, holding blocks, is present",
    "inductive:abort": "an abort removes a request holding blocks while another request stays present",
}


def unroll(steps: int, num_requests: int, release: Release, block_sizes=BMC_BLOCK_SIZES, aborts: bool = False):
    """The symbolic run: (config, request specs, arrival steps, [(before, decision, after)], constraints).

    Each step's events run as the engine runs them (formats.md): aborts, then
    arrivals, then schedule + update.  `trace[k]` also records the state before
    step k's events (`pre_events`), after its aborts (`pre_arrivals`), and the
    abort steps (`abort_at`, -1 = never), so witness goals can speak of the
    events themselves.  Aborts are unrolled only when asked (`aborts`): they
    make every formula larger."""
    c = SymConfig.fresh("w.c", block_sizes, release=release)
    specs = [SymSlot.fresh(f"w.r{i}") for i in range(num_requests)]
    arrive = [z3.Int(f"w.r{i}.arrival_step") for i in range(num_requests)]
    abort_at = [z3.Int(f"w.r{i}.abort_step") for i in range(num_requests)]
    st = SymState.empty(c, num_requests)
    trace = []
    for k in range(steps):
        pre_events = st
        if aborts:
            for i in range(num_requests):
                st = encoding.abort(st, i, abort_at[i] == k)
        pre_arrivals = st
        for i in range(num_requests):
            st = encoding.add_request(st, i, specs[i], arrive[i] == k)
        d, after = encoding.schedule_update(st, "correct")
        trace.append(Step(st, d, after, pre_events, pre_arrivals))
        st = after
    # ids r0 < r1 < ...; arrival_time = index (formats.md's default); list order = slot order
    cons = [c.constraints(), c.max_model_len <= 24, c.num_gpu_blocks <= 16, c.max_num_batched_tokens <= 16,
            c.token_budget <= 16, c.max_num_seqs <= 4]
    for i, r in enumerate(specs):
        cons += [r.rid_rank == i, r.arrival == i, 1 <= r.num_prompt_tokens, r.num_prompt_tokens < c.max_model_len,
                 r.max_tokens >= 1, r.max_tokens <= 8, r.output_len >= 0, r.output_len <= 8,
                 r.priority >= 0, r.priority <= 3, arrive[i] >= 0]
        # An abort comes after the arrival (formats.md: aborts run before arrivals).
        cons.append(z3.Or(abort_at[i] == -1, abort_at[i] > arrive[i]) if aborts else abort_at[i] == -1)
        if i:
            cons.append(arrive[i] >= arrive[i - 1])
    return c, specs, (arrive, abort_at), trace, cons


@dataclass(frozen=True)
class Step:
    """One unrolled engine step: the state `schedule()` sees, its decision, the
    state after update_from_output, and the states before the step's events."""

    before: SymState
    decision: object
    after: SymState
    pre_events: SymState
    pre_arrivals: SymState

    def __iter__(self):  # (before, decision, after), as the goals read it
        return iter((self.before, self.decision, self.after))


def _some_present(st: SymState):
    return z3.Or([sl.present for sl in st.slots])


def goal_formula(goal: str, step: Step, k: int, arrive, abort_at):
    """What the witness step must show.  Each says something about its obligation:

    - property:NAME: the property applies, in a step that grants tokens;
    - inductive:step: the step grants tokens;
    - initial: the run from the empty state reaches a state with a request in
      each queue, which satisfies the invariant (so more than the empty state
      satisfies it);
    - running-kept (loop:running_never_starved): a request running before and
      after the step, behind another running request, gets tokens;
    - inductive:add: add_request changes a non-empty state: a request arrives
      while another one, holding blocks, is present;
    - inductive:abort: an abort removes a request that holds blocks, from a state
      in which another request stays present."""
    before, d, after = step
    if goal.startswith("property:"):
        applicable, _ = PROPERTY_FORMULAS[goal.split(":", 1)[1]](before, d, after)
        return z3.And(applicable, z3.Or(list(d.scheduled)))
    if goal == "inductive:step":
        return z3.Or(list(d.scheduled))
    if goal == "running-kept":
        # a request running before and after the step, with another running request ahead of it
        n = len(before.slots)
        return z3.Or([z3.And(before.slots[i].in_running, after.slots[i].in_running, d.scheduled[i],
                             before.slots[j].in_running, before.slots[j].pos < before.slots[i].pos)
                      for i in range(n) for j in range(n) if i != j])
    if goal == "initial":
        return z3.And(state_invariant(after), z3.Or([sl.in_running for sl in after.slots]),
                      z3.Or([sl.in_waiting for sl in after.slots]))
    if goal == "inductive:add":
        pre = step.pre_arrivals
        held = z3.Or([z3.And(sl.present, sl.num_blocks > 0) for sl in pre.slots])
        return z3.And(held, z3.Or([a == k for a in arrive]))
    if goal == "inductive:abort":
        pre, post = step.pre_events, step.pre_arrivals
        gone = [z3.And(abort_at[i] == k, pre.slots[i].present, pre.slots[i].num_blocks > 0)
                for i in range(len(pre.slots))]
        return z3.And(z3.Or(gone), _some_present(post))
    raise ValueError(goal)


def find_witness(goal: str, release: Release, claim=None, steps: int = BMC_STEPS, num_requests: int = BMC_REQUESTS,
                 timeout_s: float = 30.0) -> tuple[Result, Scenario | None]:
    """The smallest k <= steps whose k-th step of `release`'s rules reaches `goal`, as a scenario."""
    from .solving import check

    t0 = time.perf_counter()
    c, specs, (arrive, abort_at), trace, cons = unroll(steps, num_requests, release, aborts=goal == "inductive:abort")
    for k in range(steps):
        # The witness step must be reached: every event happens by then.
        reached = [goal_formula(goal, trace[k], k, arrive, abort_at), *[a <= k for a in arrive],
                   *[a <= k for a in abort_at]]
        r, model, _ = check(cons + reached, timeout_s)
        if r == "sat":
            scenario = to_scenario(model, c, specs, arrive, k, goal, abort_at)
            return Result("proved", time.perf_counter() - t0, f"reachable at step {k}", {"step": k}), scenario
        if r == "unknown":
            return Result("unknown", time.perf_counter() - t0, f"z3 unknown at step {k}"), None
    return Result("refuted", time.perf_counter() - t0, f"not reachable within {steps} steps"), None


def to_scenario(m: z3.ModelRef, c: SymConfig, specs, arrive, step: int, goal: str, abort_at=()) -> Scenario:
    def v(t):
        x = m.eval(t, model_completion=True)
        return z3.is_true(x) if z3.is_bool(x) else x.as_long()

    config: dict[str, Any] = {
        "max_num_batched_tokens": v(c.max_num_batched_tokens), "max_num_scheduled_tokens": v(c.token_budget),
        "max_num_seqs": v(c.max_num_seqs), "max_num_active_seqs": v(c.max_num_active_reqs),
        "enable_chunked_prefill": v(c.enable_chunked_prefill),
        "long_prefill_token_threshold": v(c.long_prefill_token_threshold),
        "policy": "priority" if v(c.is_priority) else "fcfs", "watermark": list(WATERMARKS)[v(c.watermark_index)],
        "scheduler_reserve_full_isl": v(c.scheduler_reserve_full_isl), "max_model_len": v(c.max_model_len),
        "block_size": v(c.block_size), "num_gpu_blocks": v(c.num_gpu_blocks), "enable_prefix_caching": False,
    }
    reqs = []
    for i, r in enumerate(specs):
        reqs.append(RequestSpec(id=f"r{i}", prompt_len=v(r.num_prompt_tokens), arrival_step=v(arrive[i]),
                                max_tokens=v(r.max_tokens), output_len=v(r.output_len) or None,
                                priority=v(r.priority), arrival_time=float(i)))
    aborts = tuple(Abort(f"r{i}", v(a)) for i, a in enumerate(abort_at) if v(a) >= 0)
    name = "witness-" + goal.replace(":", "-").replace("+", "-")
    what = (f"property {goal.split(':', 1)[1]} is applicable at step {step}" if goal.startswith("property:")
            else f"a reachable run for obligation {goal}, witness step {step}: {WHAT[goal]}")
    return Scenario(name=name, config=c.release.scenario_config(config), requests=tuple(reqs), aborts=aborts,
                    max_steps=step + 1,
                    description=f"z3 bounded-model-checking witness: {what}. Reproduce: schedspec check <this file>; "
                                f"regenerate: schedspec prove")
