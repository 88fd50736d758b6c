"""The stateful test: random add_request / schedule+update_from_output / abort
sequences on random configs, every registered property checked after every step.

The mutant tests show the machine is not blind: each breaks one rule of the spec
and expects the machine to find a step that violates the named property."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from machine import COVERAGE, PROPERTIES, PropertyViolation, SpecMachine, make_machine
from mutants import Mutation, mutated

# Random runs, different in each CI run; test_machine_reaches_prefix_caching_and_async_events
# walks 250 more, derandomized, whose coverage it checks.
MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=60, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])

TestSpecMachine = SpecMachine.TestCase
TestSpecMachine.settings = MACHINE_SETTINGS

M = Mutation

# property -> the broken rule(s) it must catch: the function, its code, the broken code.
MUTANTS = {
    "token_budget_respected": [
        M("scheduler.num_new_tokens_waiting", "min(n, chunk_budget(s))", "min(n, chunk_budget(s) + 1)"),
        M("scheduler.schedule", "assert s.token_budget >= 0 and s.input_budget >= 0", "pass"),
    ],
    "grants_positive": [
        M("scheduler.num_new_tokens_running", "s.config.max_model_len - r.num_computed_tokens - 1",
          "s.config.max_model_len - r.num_computed_tokens - 2"),
        M("scheduler.schedule_running", "n == 0", "n < 0"),
        M("kv_cache.allocate_slots", "num_new_tokens <= 0", "num_new_tokens < 0"),
    ],
    "running_before_waiting": [
        M("scheduler.num_new_tokens_running", "chunk_budget(s)", "min(chunk_budget(s), 1)"),
    ],
    "preemption_only_on_allocation_failure": [
        M("scheduler.schedule", "not s.preempted", "True"),
    ],
    "starvation_condition": [
        # Admissions cut to 2 tokens; not with drafts, where a padded admission must keep 1 + k (S:1643).
        M("scheduler.num_new_tokens_waiting", "min(n, chunk_budget(s))",
          "(min(n, chunk_budget(s)) if s.config.num_speculative_tokens else min(n, chunk_budget(s), 2))"),
    ],
    "max_num_seqs_respected": [
        M("scheduler.schedule_waiting", "len(s.running) < s.config.max_num_active_reqs",
          "len(s.running) <= s.config.max_num_active_reqs"),
        M("scheduler.schedule", "assert len(s.running) <= s.config.max_num_seqs", "pass"),
    ],
    "kv_blocks_conserved": [
        M("kv_cache.BlockCountsWork.free", "self.num_free_blocks += self.req_to_num_blocks.pop(request_id, 0)",
          "self.req_to_num_blocks.pop(request_id, 0)"),
    ],
    "computed_tokens_bounded": [
        M("scheduler.num_new_tokens_running", "r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens",
          "r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens + 2"),
    ],
    "scheduled_requests_run": [
        # The first admission of a step ends in waiting, and the loop stops there: put
        # back in waiting and left in the loop, it was admitted a second time in the same
        # step, and the spec crashed before the step's end, where the property is checked.
        # (An admission that starts a KV load leaves nothing running to put back.)
        M("scheduler.schedule_waiting", "loras.update(lora.running_loras((s.requests[x] for x in s.running[-1:])))",
          "if s.running and s.running[-1] == rid:\n    s.waiting.append(s.running.pop())\nbreak"),
    ],
    "computed_tokens_advance_by_grant": [
        M("scheduler.update_after_schedule", "r.num_computed_tokens += n", "r.num_computed_tokens += n - (n > 2)"),
    ],
    "waiting_order_preserved": [
        M("scheduler.preempt", "enqueue(s.config.policy, s.waiting, s.requests, victim, front=True)",
          "enqueue(s.config.policy, s.waiting, s.requests, victim, front=False)\n"
          "if s.config.policy != 'fcfs': s.waiting.rotate(1)"),
    ],
    "preempted_restart_from_zero": [
        M("scheduler.preempt", "r.num_preemptions += 1", "pass"),
    ],
    # Async scheduling: vLLM asserts placeholders never go below 0 (S:2904).
    "placeholders_never_negative": [
        M("scheduler.deliver_output", "if had_placeholders:\n    r.num_output_placeholders -= len(tokens)",
          "r.num_output_placeholders -= len(tokens)"),
    ],
    # Prefix caching: an admission that forgets its hit recomputes cached tokens past num_tokens.
    "scheduled_within_known_tokens": [
        M("guards.wanted_tokens_waiting", "r.num_tokens - num_computed_tokens",
          "r.num_tokens - r.num_computed_tokens"),
    ],
    # Speculative decoding: a running request's drafts sent as padding.
    "drafts_sent_are_known": [
        M("spec_decode.schedule_drafts", "r.spec_token_ids[:num_drafts]", "(-1,) * num_drafts"),
    ],
    # LoRA: an admission that brings one adapter too many.
    "max_loras_respected": [
        M("lora.exceeds_max_loras", "len(loras) == c.max_loras", "len(loras) == c.max_loras + 1"),
    ],
    # Structured output: a grammar still compiling taken for a compiled one.
    "grammar_wait_respected": [
        M("structured_output.waits_for_grammar", "r.grammar == COMPILING", "False"),
    ],
    # A hit on a block must raise its count by one: counted twice, the block is never freed.
    "block_ref_counts_match_holders": [
        M("block_pool.PoolWork.add_hits", "self.ref_cnt.get(b, 0) + 1", "self.ref_cnt.get(b, 0) + 2"),
    ],
    # Freed blocks without a hash must go back to the free queue.
    "kv_pool_partitioned": [
        M("block_pool.PoolWork.free", "(last if b in self.block_hash else first).append(b)",
          "(last if b in self.block_hash else []).append(b)"),
    ],
    # An item over the encoder budget left must not be encoded (ECM:163-164).
    "encoder_budget_respected": [
        M("encoder_cache.EncoderCacheWork.can_allocate", "num_embeds > encoder_compute_budget", "False"),
    ],
    # The items a request plans in one step count against the cache together (ECM:166).
    "encoder_cache_within_capacity": [
        M("encoder_cache.EncoderCacheWork.can_allocate", "num_embeds + num_embeds_to_schedule", "num_embeds"),
    ],
    # A chunk starting inside an item it cannot encode must schedule nothing (S:2220-2225).
    "encoder_inputs_available": [
        M("encoder_inputs.plan", "min(n, f.offset - num_computed_tokens) if num_computed_tokens < f.offset else 0",
          "min(n, f.offset - num_computed_tokens) if num_computed_tokens < f.offset else n"),
    ],
    # A full-prompt hit must leave a token to compute (K:318-324): without the cap, a
    # block-aligned prompt is "all cached" and only a forced token is scheduled.
    "prefix_hit_within_shared_prefix": [
        M("block_pool.PoolWork.get_computed_blocks", "block_hashes[:(num_tokens - 1) // block_size]",
          "block_hashes[:num_tokens // block_size]"),
        M("guards.wanted_tokens_waiting", "r.num_tokens - num_computed_tokens",
          "max(r.num_tokens - num_computed_tokens, 1)"),
    ],
}


def test_machine_reaches_prefix_caching_and_async_events():
    """The machine's steps really exercise the wave-2 features: hits, shared blocks,
    evictions, preemptions with a batch in flight and their stale outputs."""
    COVERAGE.clear()
    # 500 runs (about 15 s): each event reached (measured: 160 shared blocks; at 250 runs
    # a draw could leave shared blocks at 0 or 2, as whether one happens depends on two
    # requests of one prefix running at once).
    run_state_machine_as_test(SpecMachine, settings=settings(
        max_examples=500, stateful_step_count=60, deadline=None, database=None, derandomize=True,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    # (A stale output applied to a waiting request is rarer here; tests/test_rules_wave2.py
    # pins it down on a fixed scenario.)
    for event in ("prefix hits", "shared blocks", "evictions", "preemptions", "in-flight preemptions",
                  "drafts sent", "adapters held back", "grammar waits", "grammar errors", "steps holding prefill",
                  "KV loads within the step", "async KV loads", "async KV loads admitted", "aborts mid-load",
                  "encoder inputs encoded", "encoder cache evictions", "encoder cache hits"):
        assert COVERAGE[event] > 0, (event, dict(COVERAGE))
    for caching in (False, True):
        for async_ in (False, True):
            assert COVERAGE[f"steps caching={caching} async={async_}"] > 0


def test_every_property_has_a_mutant():
    assert set(MUTANTS) == set(PROPERTIES)


# The properties' rules for a KV connector's asynchronous loads (the holders' queue, a
# head still loading, the blocks a load takes): each with a mutant of its own, since a
# property that exempts those requests could exempt too much.
LOAD_MUTANTS = {
    # Requests whose load started queued behind the others, not at the end of the holders'.
    "waiting_order_preserved": [
        M("kv_connector.requeue_holders", "holders + [x for x in s.waiting if not holds_kv_blocks(s.requests[x])]",
          "[x for x in s.waiting if not holds_kv_blocks(s.requests[x])] + holders")],
    # A finished load never promoted: the head waits for ever though nothing stops it.
    "starvation_condition": [
        M("kv_connector.load_in_flight", "not r.kv_load_finished", "True")],
    # A load that takes one block more than its tokens fill.
    "kv_blocks_conserved": [
        M("kv_connector.start_load", "s.kv.allocate(rid, hits, num_new_blocks)",
          "s.kv.allocate(rid, hits, num_new_blocks + 1)")],
}


CASES = {prop: (prop, MUTANTS[prop]) for prop in sorted(MUTANTS)} | \
    {f"{prop}-load": (prop, LOAD_MUTANTS[prop]) for prop in sorted(LOAD_MUTANTS)}


@pytest.mark.parametrize("prop, mutations", CASES.values(), ids=CASES.keys())
def test_machine_catches_broken_rule(prop, mutations):
    with mutated(mutations), pytest.raises(PropertyViolation, match=prop):
        machine = make_machine(watch=prop)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=3000, stateful_step_count=60, deadline=None, database=None, derandomize=True,
            phases=[Phase.generate],  # finding the violation is the point; shrinking only costs time
            suppress_health_check=list(HealthCheck)))
