"""The stateful test: random add_request / schedule+update_from_output / abort
sequences on random configs, every registered property checked after every step.

The mutant tests show the machine is not blind: each breaks one rule of the spec
and expects the machine to find a step that violates the named property."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from machine import COVERAGE, PROPERTIES, PropertyViolation, SpecMachine, load_mutant, make_machine

MACHINE_SETTINGS = settings(max_examples=250, stateful_step_count=60, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])

TestSpecMachine = SpecMachine.TestCase
TestSpecMachine.settings = MACHINE_SETTINGS

S, K, P = "scheduler.py", "kv_cache.py", "block_pool.py"

# property -> one broken rule it must catch (file, original text, broken text).
MUTANTS = {
    "token_budget_respected": [
        (S, "n = min(n, request_token_budget)", "n = min(n, request_token_budget + 1)"),
        (S, "assert token_budget >= 0 and input_budget >= 0", "pass"),
    ],
    "grants_positive": [
        (S, "n = min(n, c.max_model_len - r.num_computed_tokens - 1)", "n = min(n, c.max_model_len - r.num_computed_tokens - 2)"),
        (S, "if n == 0:  # S:891-909", "if n < 0:  #"),
        (K, "if num_new_tokens <= 0:", "if num_new_tokens < 0:"),
    ],
    "running_before_waiting": [
        (S, "n = min(n, token_budget, input_budget)", "n = min(n, token_budget, input_budget, 1)"),
    ],
    "preemption_only_on_allocation_failure": [
        (S, "if not preempted:", "if True:"),
    ],
    "starvation_condition": [
        (S, "n = min(n, request_token_budget)", "n = min(n, request_token_budget, 2)"),
    ],
    "max_num_seqs_respected": [
        (S, "if len(running) >= c.max_num_active_reqs:", "if len(running) > c.max_num_active_reqs:"),
        (S, "assert len(running) <= c.max_num_seqs", "pass"),
    ],
    "kv_blocks_conserved": [
        (S, "free += blocks.pop(victim, 0)", "blocks.pop(victim, 0)"),
    ],
    "computed_tokens_bounded": [
        (S, "n = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens  # S:839 ",
         "n = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens + 2  # "),
    ],
    "scheduled_requests_run": [
        (S, "            running.append(rid)\n", "            waiting.append(rid)\n"),
    ],
    "computed_tokens_advance_by_grant": [
        (S, "ncomp = r.num_computed_tokens + n\n", "ncomp = r.num_computed_tokens + n - (n > 2)\n"),
    ],
    "waiting_order_preserved": [
        (S, "_enqueue(c.policy, waiting, reqs, victim, front=True)", "_enqueue(c.policy, waiting, reqs, victim, front=False)\n        if c.policy != 'fcfs': waiting.rotate(1)"),
    ],
    "preempted_restart_from_zero": [
        (S, "num_preemptions=r.num_preemptions + 1,", "num_preemptions=r.num_preemptions,"),
    ],
    # Async scheduling: vLLM asserts placeholders never go below 0 (S:2769).
    "placeholders_never_negative": [
        (S, "if tokens and not stale and r.num_output_placeholders > 0:", "if tokens and not stale:"),
    ],
    # Prefix caching: an admission that forgets its hit recomputes cached tokens past num_tokens.
    "scheduled_within_known_tokens": [
        (S, "n = r.num_tokens - num_computed_tokens\n", "n = r.num_tokens - r.num_computed_tokens\n"),
    ],
    # A hit on a block another request holds must raise its count, not reset it.
    "block_ref_counts_match_holders": [
        (P, "            self.ref_cnt[b] = self.ref_cnt.get(b, 0) + 1\n", "            self.ref_cnt[b] = 1\n"),
    ],
    # Freed blocks without a hash must go back to the free queue.
    "kv_pool_partitioned": [
        (P, "(last if b in self.block_hash else first).append(b)", "(last if b in self.block_hash else []).append(b)"),
    ],
    # A full-prompt hit must leave a token to compute (K:295-302): without the cap, a
    # block-aligned prompt is "all cached" and only a forced token is scheduled.
    "prefix_hit_within_shared_prefix": [
        (P, "block_hashes[:(num_tokens - 1) // block_size]", "block_hashes[:num_tokens // block_size]"),
        (S, "n = r.num_tokens - num_computed_tokens\n", "n = max(r.num_tokens - num_computed_tokens, 1)\n"),
    ],
}


def test_machine_reaches_prefix_caching_and_async_events():
    """The machine's steps really exercise the wave-2 features: hits, shared blocks,
    evictions, preemptions with a batch in flight and their stale outputs."""
    COVERAGE.clear()
    run_state_machine_as_test(SpecMachine, settings=settings(
        max_examples=200, stateful_step_count=60, deadline=None, database=None, derandomize=True,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    # (A stale output applied to a waiting request is rarer here; tests/test_rules_wave2.py
    # pins it down on a fixed scenario.)
    for event in ("prefix hits", "shared blocks", "evictions", "preemptions", "in-flight preemptions"):
        assert COVERAGE[event] > 0, (event, dict(COVERAGE))
    for caching in (False, True):
        for async_ in (False, True):
            assert COVERAGE[f"steps caching={caching} async={async_}"] > 0


def test_every_property_has_a_mutant():
    assert set(MUTANTS) == set(PROPERTIES)


@pytest.mark.parametrize("prop", sorted(MUTANTS))
def test_machine_catches_broken_rule(prop):
    mutant = load_mutant(MUTANTS[prop], name=prop)
    machine = make_machine(mutant, watch=prop)
    with pytest.raises(PropertyViolation, match=prop):
        run_state_machine_as_test(machine, settings=settings(
            max_examples=3000, stateful_step_count=60, deadline=None, database=None, derandomize=True,
            phases=[Phase.generate],  # finding the violation is the point; shrinking only costs time
            suppress_health_check=list(HealthCheck)))
