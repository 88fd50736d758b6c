"""Rule variants of the loop-invariant encodings: the spec's rules ("correct")
and known-bad changes, one rule each.

Every loop claim (loop_claims.py) must be refuted by the variants it names, and
tests/test_proofs_loop_invariants.py checks that each variant makes the encodings
disagree with the spec's rule functions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoopRules:
    """The spec's rules ("correct") and known-bad changes, one rule each."""

    token_budget_extra: int = 0  # the step starts with token_budget + 1
    grant_ignores_input_budget: bool = False  # running grant not capped by the input budget
    running_cap: int | None = None  # an extra cap on every running grant (a request left short)
    running_need_extra: int = 0  # the running need over-estimated
    skip_zero_grant: bool = True  # S:907-925: n == 0 is skipped, never granted
    model_len_margin: int = 1  # cap 3: max_model_len - num_computed_tokens - margin (S:868)
    fcfs_victim_head: bool = False  # FCFS victim = head of running instead of its tail (S:986)
    n_once_per_request: bool = True  # False: n recomputed after each preemption (a refund raises it)
    fail_when_exact_fit: bool = False  # allocation "fails" although it fits exactly
    cursor_fix: bool = True  # S:964: a victim behind the cursor moves the cursor back
    refund: bool = True  # S:967-973: a granted victim gives its grant back
    preempt_frees_blocks: bool = True
    fcfs_break: bool = True  # S:998-1008: FCFS stops after a self-preemption
    admit_after_preemption: bool = False  # S:1066 gate removed
    run_slot_check_strict: bool = True  # S:1093-1096: len(running) >= max stops admission
    admission_budget_extra: int = 0  # admission chunk capped at budget + extra
    chunked_off_fit_strict: bool = False  # chunked off: stop when the need is >= the budget (not >)
    watermark_on_first_admission: bool = False  # the watermark also when nothing runs (K:539-546)
    gate_without_watermark: bool = False  # the full-ISL gate leaves the watermark out (K:552-569)
    # prefix caching: hit blocks nobody holds leave the free queue, so the pool check and
    # the full-ISL gate count them (K:552-569, 603-609; T:243-271)
    evictable_hits_checked: bool = True
    finish_frees_blocks: bool = True
    # async scheduling (spec/scheduler.py, spec/request.py), each the spec's rule when True/default
    placeholders_in_need: bool = True  # S:855: need = num_tokens + num_output_placeholders - computed
    last_token_guard: bool = True  # S:816-830: last_token_in_flight -> 0 tokens, skipped
    last_token_guard_stops: bool = False  # the guard ends the running loop instead of skipping (a `break`)
    stale_head: str = "skip"  # S:1123: a waiting head with stale output in flight is skipped; "stop" / "admit"
    placeholder_added: str = "not_prefill"  # async_scheduler.py:24-56: one placeholder unless mid-prefill;
    #                                          "never" / "always"
    inflight_added: bool = True  # S:1899-1931: update_after_schedule adds the grant to num_in_flight_tokens
    stale_decremented: bool = True  # S:2362-2384: a stale delivery lowers num_stale_output_tokens
    # structured output
    grammar_skip: bool = True  # S:1118-1121: a head whose grammar compiles (or failed) is skipped
    # LoRA
    lora_cap_extra: int = 0  # S:1128-1140: skipped when the batch has max_loras (+ extra) adapters
    # speculative decoding
    drafts_in_need: int = 1  # S:855: num_tokens_with_spec counts each draft once (2: twice)
    victim_drafts_dropped: bool = True  # S:967-973: a preempted request's drafts leave the step's output
    padded_budget_checked: bool = True  # S:1376-1378: a padded new decode that does not fit stops admission
    placeholders_per_draft: bool = True  # async_scheduler.py:40-45: a placeholder per draft sent too
    drafter_rows_charged: bool = True  # S:971, 1019: a grant's drafter rows leave the input budget (and return)
    prefill_scheduled_noted: bool = True  # S:1016: a grant to a prefill chunk sets prefill_scheduled
    padding_checks_prefill: bool = True  # S:1358-1380: no padding once a prefill chunk is scheduled
    padding_after_hit: bool = True  # S:1367: a hit (computed tokens) pads without a running grant
    # pause (S:735, 739-741, 1100-1107)
    paused_all_budget_zero: bool = True  # PAUSED_ALL: the step starts with token budget 0
    paused_new_admits_none: bool = True  # PAUSED_NEW: no admission (of a request holding no KV blocks)
    # prefill throttling
    held_chunk_skipped: bool = True  # S:838: a step that holds prefill skips a running prefill chunk
    held_admission_stops: bool = True  # S:1340: ... and stops admission at a request with prefill left
    # prefix caching: which blocks are cached
    grant_caches_computed: bool = True  # K:642-646: a grant caches up to its computed tokens (False: all it knows)
    delivery_caches_computed: bool = True  # S:2450-2471: a delivery caches up to computed tokens out of flight
    #                                        (False: all it knows, the tokens just sampled too)


LOOP_VARIANTS: dict[str, LoopRules] = {
    "correct": LoopRules(),
    "budget_off_by_one": LoopRules(token_budget_extra=1),
    "grant_ignores_input_budget": LoopRules(grant_ignores_input_budget=True),
    "running_capped_at_1": LoopRules(running_cap=1),
    "running_need_plus_2": LoopRules(running_need_extra=2),
    # as encoding.py's: with cap 3 one token tighter a 0-token grant exists, and is not skipped
    "zero_grant": LoopRules(model_len_margin=2, skip_zero_grant=False),
    "victim_head_of_running": LoopRules(fcfs_victim_head=True),
    "n_recomputed_after_preemption": LoopRules(n_once_per_request=False),
    "preemption_without_allocation_failure": LoopRules(fail_when_exact_fit=True),
    "no_cursor_fix": LoopRules(cursor_fix=False),
    "no_refund": LoopRules(refund=False),
    "preemption_leaks_blocks": LoopRules(preempt_frees_blocks=False),
    "no_fcfs_break": LoopRules(fcfs_break=False),
    "admit_after_preemption": LoopRules(admit_after_preemption=True),
    "run_slot_check_off_by_one": LoopRules(run_slot_check_strict=False),
    "admission_over_budget": LoopRules(admission_budget_extra=1),
    "chunked_off_fit_strict": LoopRules(chunked_off_fit_strict=True),
    "watermark_on_first_admission": LoopRules(watermark_on_first_admission=True),
    "gate_without_watermark": LoopRules(gate_without_watermark=True),
    # prefix caching: refuted by kv_blocks_conserved (the pool goes negative), caught by
    # the prefix-caching agreement
    "evictable_hits_unchecked": LoopRules(evictable_hits_checked=False),
    "finish_leaks_blocks": LoopRules(finish_frees_blocks=False),
    # async scheduling
    "placeholders_not_in_need": LoopRules(placeholders_in_need=False),
    "no_last_token_guard": LoopRules(last_token_guard=False),
    "last_token_guard_stops_loop": LoopRules(last_token_guard_stops=True),
    "stale_head_stops_admission": LoopRules(stale_head="stop"),
    "stale_head_admitted": LoopRules(stale_head="admit"),
    "no_placeholder_added": LoopRules(placeholder_added="never"),
    "placeholder_on_prefill_chunk": LoopRules(placeholder_added="always"),
    "inflight_not_added": LoopRules(inflight_added=False),
    "stale_not_decremented": LoopRules(stale_decremented=False),
    # structured output
    "grammar_head_admitted": LoopRules(grammar_skip=False),
    # LoRA
    "lora_cap_off_by_one": LoopRules(lora_cap_extra=1),
    # speculative decoding
    "drafts_counted_twice": LoopRules(drafts_in_need=2),
    "victim_keeps_drafts": LoopRules(victim_drafts_dropped=False),
    "padded_decode_budget_unchecked": LoopRules(padded_budget_checked=False),
    "drafter_rows_not_charged": LoopRules(drafter_rows_charged=False),
    # caught by the update agreement only: the claims that use placeholders_after
    # are stated with speculative decoding off (SPEC_DECODE)
    "placeholders_ignore_drafts": LoopRules(placeholders_per_draft=False),
    # the padding's batch conditions: caught by the iteration agreements
    "prefill_scheduled_not_noted": LoopRules(prefill_scheduled_noted=False),
    "padding_beside_prefill": LoopRules(padding_checks_prefill=False),
    "padding_needs_running_grant": LoopRules(padding_after_hit=False),
    # prefill throttling: caught by the iteration agreements only (a held step
    # schedules less; no safety claim depends on it, and running_never_starved and
    # running_before_waiting name it as an exception)
    "held_prefill_chunk_granted": LoopRules(held_chunk_skipped=False),
    "held_step_admits_prefill": LoopRules(held_admission_stops=False),
    # pause: `paused_new_admits` is caught by the paused agreement; `paused_all_schedules`
    # (the step starts with its budget while PAUSED_ALL) breaks the running loop's entry,
    # refuted by running_never_starved
    "paused_all_schedules": LoopRules(paused_all_budget_zero=False),
    "paused_new_admits": LoopRules(paused_new_admits_none=False),
    # prefix caching: refuted by prefix_hit_within_shared_prefix, caught by the agreements
    "grant_caches_known_tokens": LoopRules(grant_caches_computed=False),
    "delivery_caches_sampled_tokens": LoopRules(delivery_caches_computed=False),
}
