"""Per-step properties for ANY number of requests, by loop invariants (z3).

`schedule()` is two loops over arbitrarily long lists: the running loop
(S:809-1052, spec/scheduler.py `schedule_running` with `allocate_or_preempt`)
and the waiting loop (S:1066-1687, `schedule_waiting` / `admit`), then
`_update_after_schedule` and `update_from_output`, whose removal of finished
requests is a third loop (S:2607-2618, `remove_finished`).  The bounded
encoding (encoding.py) unrolls them over a fixed number of slots; here each
loop is one *iteration* from an arbitrary *iteration state*, as Dafny, Verus or
Why3 would state it:

- entry:        the state before the loop satisfies the invariant;
- preservation: invariant ∧ loop guard ∧ one iteration ⇒ invariant afterwards;
- exit:         invariant ∧ ¬guard ⇒ the property (or the next loop's entry).

By induction on the number of iterations the property then holds after any
number of iterations, so for any number of running and waiting requests.

This module says which parts make which claim (`CLAIMS`) and under which
premises.  The modules of the loop claims, from the bottom up:

- loop_rules.py: the spec's rules and the known-bad variants each claim must refute;
- loop_config.py: what the loops read of the config, as z3 symbols;
- loop_running.py, loop_waiting.py, loop_update.py: the encodings, one iteration
  of the running loop, of the waiting loop, and update_after_schedule, the
  delivery of a batch and the finish loop (each with its iteration state);
- loop_parts.py: the parts, (premises, goal) builders: each loop's invariant
  entry and preservation, the exits, iterations and lemmas;
- loop_claims.py (here): the claims, each a tuple of parts and its bad variants;
- loop_vacuity.py: the check that no part holds vacuously;
- loop_obligations.py: discharge and the `loop:<name>` obligations of `schedspec prove`;
- loop_witnesses.py: the fixed witness scenarios (witnesses/*.json) of the claims
  the bounded encoding cannot reach.

**Scope.** A paused engine or not (`LoopConfig.pa` / `pn`, free flags, S:3213): PAUSED_ALL
starts the step with no token budget (S:735, 739-741), so nothing is scheduled, every
running request is skipped on purpose (`running_never_starved` names it), and the waiting
loop is not entered (S:1066); PAUSED_NEW admits only requests holding KV blocks
(S:1100-1107), none here, where the KV connector is not encoded.  No encoder inputs (a request's items can only shorten its chunk, or skip it;
their own budget and cache are proved in encoder_invariants.py); prefix caching on or
off (an admission starts from its hit, `WaitReq.hb` / `he`; `H` counts a shared block
once, so a preempted or finished request frees `RunSplit.Fv` / `fr` <= its blocks;
each request's cached blocks `cb`, which a grant and a delivery extend, `cache_extent`,
`deliver_tokens`);
prefill throttling on or off (`LoopConfig.hold`, the step's `defer_prefills`, free, so
either gate, data-parallel or local, is covered; vLLM 0.33.0 only): a held step skips
every running prefill chunk (S:838; whether a request is one, `is_prefill_chunk` as the
last update left it, is free) and stops admission at the first request with more than
its last token to compute (S:1340), one more named exception to `running_never_starved`
and to `running_before_waiting`; async scheduling on or off (`LoopConfig.asy`, a
symbolic flag, so every claim covers both engines): output placeholders in a
running request's need (S:855), the async max_tokens guard (S:816-830: 0
tokens, skipped), the waiting loop's skip of a request with stale output in
flight (S:1123), the placeholder `update_after_schedule` adds
(async_scheduler.py:24-56) and the delivery of an older batch (S:2301-2618);
`placeholders_never_negative`, a property of the async engine alone, is proved
with async on.  Structured output: a waiting head whose grammar is compiling or
failed is skipped and keeps its place (S:1118-1121), so `grammar_wait_respected`
holds for any number of requests.  LoRA (`LoopConfig.lora`, symbolic; 0.33.0 only,
Release.models(LORA)): a waiting head whose adapter would be one too many is skipped
and keeps its place (S:1128-1140), so `max_loras_respected` holds for any number of
requests and adapters; the iteration state counts the batch's adapters (`Lc`), and
whether the head's adapter is new to the batch is an input of each iteration.
Speculative decoding (`LoopConfig.sd`, symbolic; 0.33.0 only,
Release.models(SPEC_DECODE)): a running request's drafts count in its need
(num_tokens_with_spec, S:855) and the grant sends those that fit (S:1025-1041);
allocations reserve the drafter's lookahead slots (K:571-574); a one-token
admission beside a decode is padded to 1 + num_speculative_tokens (S:1358-1380:
one token left, a running request granted, and no prefill chunk granted, which the
running loop's state records as `PS`, vLLM's prefill_scheduled, S:1016); a drafter that adds rows to
the batch (`max_num_new_slots_for_drafting`, `D`, a parallel drafter's K - 1)
has them charged to the input budget with every grant and refunded with a
victim's grant (S:737, 813, 862-864, 971, 1019, 1345).  A multi-module MTP
drafter's prefill lookahead (`num_prefill_lookahead_tokens` > 1, which cuts
chunks short of the prefill's end, S:695-714) is outside: the claims are stated
for drafters that read at most one token ahead (n-gram, the EAGLE family), and
the agreement test draws no other.  The claims about schedule()'s
loops (SPEC_DECODE) are proved with it on or off; the four whose lemmas model
the delivery of one sampled token are stated with it off (update_after_schedule's
placeholder per draft sent is in placeholders_after).  The block size is a case split over
BLOCK_SIZES (each `cdiv` then divides by a numeral); every other value is an
unbounded integer.

"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from schedspec.spec import versions

from .release import Release
from .loop_parts import (LoopVars, Part, exit_admissions_within_left, exit_computed_bounded, exit_counters_running,
                         exit_counters_waiting, exit_drafts_known, exit_grammar_wait, exit_kv_conserved,
                         exit_max_loras, exit_max_num_seqs, exit_max_num_seqs_running, exit_never_starved,
                         exit_no_admission_after_preemption, exit_preemption_failure, exit_running_full_needs,
                         exit_token_budget, exit_token_budget_running, exit_whole_need_when_it_fits,
                         iter_admission_caches_computed, iter_admission_positive, iter_grant_caches_computed,
                         iter_grants_positive, iter_padded_admission, lemma_cap_positive, lemma_cap_positive_sync,
                         lemma_caps_nonincreasing, lemma_delivery_caches_computed, lemma_delivery_keeps_bound,
                         lemma_grown_threshold_within_budget, part_drafts_entry, part_drafts_preserved,
                         part_finish_entry, part_finish_preserved, part_run_entry, part_run_preserved,
                         part_wait_entry, part_wait_preserved)


@dataclass(frozen=True)
class LoopClaim:
    """A claim for any number of requests: proved when every part is, for every
    block size; refuted by each of `bad_variants` (loop_rules.LOOP_VARIANTS)."""

    name: str  # the registry property, or a named theorem
    parts: tuple[Part, ...]
    bad_variants: tuple[str, ...]
    doc: str


RUN_INV: tuple[Part, ...] = (("running loop: entry", part_run_entry), ("running loop: preserved", part_run_preserved))
WAIT_INV: tuple[Part, ...] = (("waiting loop: entry", part_wait_entry), ("waiting loop: preserved", part_wait_preserved))
FIN_INV: tuple[Part, ...] = (("finish loop: entry", part_finish_entry),
                             ("finish loop: preserved", part_finish_preserved))

CLAIMS: dict[str, LoopClaim] = {c.name: c for c in (
    LoopClaim("token_budget_respected", RUN_INV + WAIT_INV + (
        ("exit: running loop", exit_token_budget_running), ("exit: waiting loop", exit_token_budget)),
        ("budget_off_by_one", "grant_ignores_input_budget", "admission_over_budget", "drafter_rows_not_charged"),
        "the grants of one step sum to <= max_num_scheduled_tokens and <= max_num_batched_tokens"),
    LoopClaim("max_num_seqs_respected", RUN_INV + WAIT_INV + (
        ("exit: running loop", exit_max_num_seqs_running), ("exit: waiting loop", exit_max_num_seqs)),
        ("run_slot_check_off_by_one",), "len(running) <= max_num_active_reqs after the step"),
    LoopClaim("running_before_waiting", RUN_INV + WAIT_INV + (
        ("exit: running needs met", exit_running_full_needs),
        ("exit: admissions within what running left", exit_admissions_within_left)),
        ("running_capped_at_1", "admit_after_preemption"),
        "an admission happens only after every running request got its whole capped need, from the budget left "
        "(a prefill chunk a step holding prefill skips excepted)"),
    LoopClaim("preemption_only_on_allocation_failure", RUN_INV + (
        ("exit: demand exceeds the pool, victims in policy order", exit_preemption_failure),
        ("exit: no admission after a preemption", exit_no_admission_after_preemption)),
        ("preemption_without_allocation_failure", "admit_after_preemption", "victim_head_of_running"),
        "a preemption only when the running requests' block demand exceeds the free pool, the policy's victims, "
        "no admission"),
    LoopClaim("grants_positive", RUN_INV + WAIT_INV + (
        ("iteration: running grant >= 1, once", iter_grants_positive),
        ("iteration: admission grant >= 1, once", iter_admission_positive)),
        ("zero_grant", "placeholders_not_in_need"), "every grant >= 1 token, no request granted twice"),
    LoopClaim("kv_blocks_conserved", RUN_INV + WAIT_INV + FIN_INV + (("exit: after the finish loop", exit_kv_conserved),),
              ("preemption_leaks_blocks", "finish_leaks_blocks", "evictable_hits_unchecked"),
              "free + held == usable blocks (a block shared through a prefix hit held once), and each request "
              "holds cdiv(min(computed, L)) blocks"),
    LoopClaim("computed_tokens_bounded", RUN_INV + WAIT_INV + (
        ("exit: computed <= num_tokens + placeholders", exit_computed_bounded),
        ("lemma: delivering a batch keeps the bound", lemma_delivery_keeps_bound)),
              ("running_need_plus_2", "no_placeholder_added", "placeholders_not_in_need"),
              "0 <= num_computed_tokens <= num_tokens + num_output_placeholders after the step (strictly below "
              "with async on), and < max_model_len"),
    LoopClaim("running_never_starved", RUN_INV + (
        ("exit: a running request that stays running got >= 1 token", exit_never_starved),
        ("exit: ... and all its capped need when that fits too", exit_whole_need_when_it_fits),
        ("lemma: outside the named exceptions the capped need is >= 1", lemma_cap_positive),
        ("lemma: without async scheduling the exceptions are void", lemma_cap_positive_sync),
        ("lemma: capped needs ahead never grow", lemma_caps_nonincreasing),
        ("lemma: a grown adaptive threshold keeps the needs ahead within budget",
         lemma_grown_threshold_within_budget)),
        ("no_cursor_fix", "no_refund", "last_token_guard_stops_loop", "paused_all_schedules"),
        "a request running before the step and after it received >= 1 token in it, given its premises "
        "(ahead_within_budget; exceptions: not_last_token_in_flight, below_max_model_len_cap, "
        "not_held_prefill_chunk, engine_not_paused_all)"),
    LoopClaim("grammar_wait_respected", RUN_INV + WAIT_INV + (
        ("exit: a request waiting for its grammar was not admitted", exit_grammar_wait),),
        ("grammar_head_admitted",),
        "structured output: a waiting request whose grammar is compiling or failed is not scheduled; it keeps "
        "its place"),
    LoopClaim("max_loras_respected", RUN_INV + WAIT_INV + (
        ("exit: at most max_loras adapters in the batch", exit_max_loras),),
        ("lora_cap_off_by_one",),
        "LoRA: the running requests use at most max_loras distinct adapters after the step, given the premise "
        "before_within_max_loras; a waiting request whose adapter would be one too many keeps its place"),
    LoopClaim("drafts_sent_are_known", RUN_INV + WAIT_INV + (
        ("drafts sent: entry", part_drafts_entry), ("drafts sent: preserved", part_drafts_preserved),
        ("exit: a running request's drafts sent are its own, only if scheduled", exit_drafts_known),
        ("iteration: a padded new decode is granted 1 + num_speculative_tokens", iter_padded_admission)),
        ("drafts_counted_twice", "victim_keeps_drafts", "padded_decode_budget_unchecked"),
        "speculative decoding: the drafts a step sends are a scheduled running request's own (a prefix), or for "
        "an admitted new decode num_speculative_tokens paddings, given the premise threshold_admits_padded_decode"),
    LoopClaim("placeholders_never_negative", RUN_INV + WAIT_INV + (
        ("exit: a request of before.running, after the delivery", exit_counters_running),
        ("exit: a request of before.waiting, after the delivery", exit_counters_waiting)),
        ("inflight_not_added", "stale_not_decremented", "stale_head_admitted"),
        "async: placeholders, in-flight and stale tokens >= 0 and stale <= in flight after the step"),
    LoopClaim("prefix_hit_within_shared_prefix", RUN_INV + WAIT_INV + (
        ("iteration: a running grant caches only blocks the step computes", iter_grant_caches_computed),
        ("iteration: an admission caches only blocks the step computes", iter_admission_caches_computed),
        ("lemma: a delivery caches only computed tokens out of flight", lemma_delivery_caches_computed)),
        ("grant_caches_known_tokens", "delivery_caches_sampled_tokens"),
        "prefix caching: a grant caches only full blocks it holds whose tokens the step computes, an admission "
        "from its hit, and a delivery only blocks of tokens computed out of flight, after rejected drafts and "
        "discarded tokens (the cached prefix the property checks hits against)"),
)}

# Claims only the async engine has (the property is registered for async_scheduling alone).
ASYNC_ONLY = frozenset({"placeholders_never_negative"})
# Claims of a feature schedspec models for 0.33.0 only: whether the modelled release
# has it (the spec refuses the feature for the others).
# Claim -> the feature (spec/versions.py FEATURES_SINCE), asked as `release.models(feature)`.
FEATURE_ONLY: dict[str, str] = {"max_loras_respected": versions.LORA,
                                "grammar_wait_respected": versions.STRUCTURED_OUTPUT,
                                "drafts_sent_are_known": versions.SPEC_DECODE}
# Claims proved with speculative decoding on or off (`LoopConfig.sd` free): those
# about schedule()'s two loops, whose iterations model drafts and the lookahead,
# and which blocks a step caches, whose delivery lemma delivers several tokens
# (deliver_tokens).  The other four are stated with it off (their premises add `not sd`): their
# lemmas model the delivery of one sampled token, where speculative decoding
# delivers accepted drafts and rolls back rejected ones (S:2392-2426), and their
# exits bound computed tokens by num_tokens + placeholders, which a synchronous
# grant of drafts passes until that rollback.
SPEC_DECODE = frozenset({"token_budget_respected", "max_num_seqs_respected", "running_before_waiting",
                         "preemption_only_on_allocation_failure", "grants_positive", "grammar_wait_respected",
                         "max_loras_respected", "drafts_sent_are_known", "prefix_hit_within_shared_prefix"})


def claim_premises(claim: LoopClaim, V: LoopVars) -> list:
    """The premises a claim adds to every part: speculative decoding off unless
    the claim is one of SPEC_DECODE."""
    return [] if claim.name in SPEC_DECODE else [z3.Not(V.c.sd)]
