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
from typing import Any

import z3

from schedspec.reference.scenario import RequestSpec, Scenario

from . import encoding
from .obligation import Result
from .property_formulas import PROPERTY_FORMULAS
from .symbolic import WATERMARKS, SymConfig, SymSlot, SymState

BMC_REQUESTS = 3
BMC_STEPS = 3
# Small numbers make a readable scenario and a fast search.
BMC_BLOCK_SIZES = (1, 2, 4)


def unroll(steps: int, num_requests: int, block_sizes=BMC_BLOCK_SIZES):
    """The symbolic run: (config, request specs, arrival steps, [(before, decision, after)])."""
    c = SymConfig.fresh("w.c", block_sizes)
    specs = [SymSlot.fresh(f"w.r{i}") for i in range(num_requests)]
    arrive = [z3.Int(f"w.r{i}.arrival_step") for i in range(num_requests)]
    st = SymState.empty(c, num_requests)
    trace = []
    for k in range(steps):
        for i in range(num_requests):
            st = encoding.add_request(st, i, specs[i], arrive[i] == k)
        d, after = encoding.schedule_update(st, "correct")
        trace.append((st, d, after))
        st = after
    # ids r0 < r1 < ...; arrival_time = index (formats.md's default); list order = slot order
    cons = [c.constraints(), c.max_model_len <= 24, c.num_gpu_blocks <= 16, c.max_num_batched_tokens <= 16,
            c.token_budget <= 16, c.max_num_seqs <= 4]
    for i, r in enumerate(specs):
        cons += [r.rid_rank == i, r.arrival == i, 1 <= r.num_prompt_tokens, r.num_prompt_tokens < c.max_model_len,
                 r.max_tokens >= 1, r.max_tokens <= 8, r.output_len >= 0, r.output_len <= 8,
                 r.priority >= 0, r.priority <= 3, arrive[i] >= 0]
        if i:
            cons.append(arrive[i] >= arrive[i - 1])
    return c, specs, arrive, trace, cons


def goal_formula(goal: str, before: SymState, d, after: SymState):
    if goal.startswith("property:"):
        applicable, _ = PROPERTY_FORMULAS[goal.split(":", 1)[1]](before, d, after)
        return z3.And(applicable, z3.Or(list(d.scheduled)))
    if goal == "inductive:step":
        return z3.Or(list(d.scheduled))
    if goal in ("inductive:add", "inductive:abort", "initial"):
        return z3.BoolVal(True)  # any run: arrivals happen, and every run starts empty
    raise ValueError(goal)


def find_witness(goal: str, claim=None, steps: int = BMC_STEPS, num_requests: int = BMC_REQUESTS,
                 timeout_s: float = 30.0) -> tuple[Result, Scenario | None]:
    """The smallest k <= steps whose k-th step reaches `goal`, as a scenario."""
    from .obligations import make_solver

    t0 = time.perf_counter()
    c, specs, arrive, trace, cons = unroll(steps, num_requests)
    for k in range(steps):
        before, d, after = trace[k]
        s = make_solver(timeout_s)
        s.add(*cons)
        s.add(goal_formula(goal, before, d, after))
        if goal == "inductive:abort":
            s.add(z3.Or([sl.present for sl in before.slots]))
        # The witness step must be reached: every request arrives by then.
        s.add(*[a <= k for a in arrive])
        r = s.check()
        if r == z3.sat:
            scenario = to_scenario(s.model(), c, specs, arrive, k, goal)
            return Result("proved", time.perf_counter() - t0, f"reachable at step {k}", {"step": k}), scenario
        if r == z3.unknown:
            return Result("unknown", time.perf_counter() - t0, f"z3 unknown at step {k}"), None
    return Result("refuted", time.perf_counter() - t0, f"not reachable within {steps} steps"), None


def to_scenario(m: z3.ModelRef, c: SymConfig, specs, arrive, step: int, goal: str) -> Scenario:
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
    name = "witness-" + goal.replace(":", "-").replace("+", "-")
    what = (f"property {goal.split(':', 1)[1]} is applicable at step {step}" if goal.startswith("property:")
            else f"a reachable run for obligation {goal}, witness step {step}")
    return Scenario(name=name, config=config, requests=tuple(reqs), max_steps=step + 1,
                    description=f"z3 bounded-model-checking witness: {what}. Reproduce: schedspec check <this file>; "
                                f"regenerate: schedspec prove")
