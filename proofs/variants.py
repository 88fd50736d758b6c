"""Rule variants of the encoding: "correct" (the spec's rules) and known-bad ones.

Each bad variant changes one rule, as a deliberately broken scheduler would; the
proofs must refute every obligation on at least one of them.  The first group
mirrors the spec mutants of tests/test_state_machine.py (one per property), the
second the rule errors issue 6 names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    # schedule(): budgets and caps
    token_budget_extra: int = 0  # budget off by one: the step starts with token_budget + 1
    admission_budget_extra: int = 0  # admission chunk capped at request_token_budget + extra
    admission_cap: int | None = None  # an extra cap on every admission chunk
    running_cap: int | None = None  # an extra cap on every running grant
    running_need_extra: int = 0  # the running need over-estimated by this much
    model_len_margin: int = 1  # cap 3: max_model_len - num_computed_tokens - margin
    skip_zero_grant: bool = True  # S:907: a 0-token running grant is skipped
    threshold_min_eligible: int = 2  # the long-prefill cap applies with >= this many eligible
    # preemption
    fail_when_exact_fit: bool = False  # running allocation "fails" although it fits exactly
    fcfs_victim_head: bool = False  # FCFS victim = head of running instead of tail
    preempt_frees_blocks: bool = True
    preempt_resets_progress: bool = True
    preempt_counts: bool = True
    preempted_to_front: bool = True  # FCFS prepend / PRIORITY heap push
    # admission
    admit_after_preemption: bool = False  # S:1066 gate removed
    run_slot_check_strict: bool = True  # len(running) >= max_num_active_reqs stops admission
    admitted_to_running: bool = True  # an admitted request joins running
    waiting_first: bool = False  # the waiting loop runs before the running loop
    # _update_after_schedule
    advance_shortfall_over_2: bool = False  # advance by n - (n > 2)
    # add_request / abort / the initial state
    add_at_front: bool = False  # FCFS: a new request joins the front of waiting
    abort_leaks_blocks: bool = False  # an aborted request's blocks never return
    initial_free_includes_null: bool = False  # the null block counted as free


VARIANTS: dict[str, Rules] = {
    "correct": Rules(),
    # one per property, as tests/test_state_machine.py MUTANTS
    "admission_over_budget": Rules(admission_budget_extra=1),
    "zero_grant": Rules(model_len_margin=2, skip_zero_grant=False),
    "running_capped_at_1": Rules(running_cap=1),
    "admit_after_preemption": Rules(admit_after_preemption=True),
    "admission_capped_at_2": Rules(admission_cap=2),
    "run_slot_check_off_by_one": Rules(run_slot_check_strict=False),
    "preemption_leaks_blocks": Rules(preempt_frees_blocks=False),
    "running_need_plus_2": Rules(running_need_extra=2),
    "admitted_to_waiting": Rules(admitted_to_running=False),
    "advance_short": Rules(advance_shortfall_over_2=True),
    "preempted_to_back": Rules(preempted_to_front=False),
    "preemption_not_counted": Rules(preempt_counts=False),
    # issue 6's list
    "waiting_before_running": Rules(waiting_first=True),
    "budget_off_by_one": Rules(token_budget_extra=1),
    "preemption_without_allocation_failure": Rules(fail_when_exact_fit=True),
    "victim_head_of_running": Rules(fcfs_victim_head=True),
    "computed_tokens_not_reset": Rules(preempt_resets_progress=False),
    "threshold_with_one_eligible": Rules(threshold_min_eligible=1),
    # the other transitions
    "add_at_front": Rules(add_at_front=True),
    "abort_leaks_blocks": Rules(abort_leaks_blocks=True),
    "initial_free_includes_null": Rules(initial_free_includes_null=True),
}

BAD_VARIANTS = tuple(v for v in VARIANTS if v != "correct")
