"""The state invariant (spec/invariants.py) holds in every state the hypothesis
machine reaches, and each predicate is shown able to fail on a broken spec."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from machine import make_machine
from mutants import Mutation, mutated
from schedspec.spec.invariants import STATE_INVARIANTS, check_state


class InvariantViolation(AssertionError):
    pass


def invariant_machine(watch=None):
    base = make_machine(watch="__none__")  # only the state invariant fails the run

    class InvariantMachine(base):
        def queues_partition_requests(self):
            # superseded by the registry's predicate of the same name (checked below)
            pass

        def step(self):
            # After every engine step, not only after each rule (a rule runs up to
            # four steps, and a broken state can crash the next one first).
            super().step()
            self.state_invariant()

        @invariant()
        def state_invariant(self):
            bad = {n: v for n, v in check_state(self.state).items()
                   if not v.holds and (watch is None or n == watch)}
            if bad:
                raise InvariantViolation("; ".join(f"{n}: {v.detail} {dict(v.values)}" for n, v in bad.items()))

    return InvariantMachine


def test_invariant_holds_in_every_reachable_state():
    run_state_machine_as_test(invariant_machine(), settings=settings(
        max_examples=300, stateful_step_count=50, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))


S, K = "scheduler.py", "kv_cache.py"
# invariant -> a one-line break of the spec that must violate it.
M = Mutation
INVARIANT_MUTANTS = {
    # The last running request also left in waiting once the loop is over (a duplicate the same
    # step could admit again would crash the spec first, not break the invariant).
    "queues_partition_requests": [M("scheduler.schedule_waiting", "s.waiting.extendleft(reversed(skipped))",
                                    "s.waiting.extendleft(reversed(skipped + s.running[-1:]))")],
    "statuses_match_queues": [M("scheduler.preempt", "r.status = PREEMPTED", "r.status = RUNNING")],
    "request_lengths_valid": [M("scheduler.check_stop", "request.num_tokens >= max_model_len", "request.num_tokens > max_model_len")],
    "computed_tokens_below_num_tokens": [M("scheduler.num_new_tokens_running",
                                           "r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens",
                                           "r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens + 1")],
    "waiting_requests_hold_nothing": [M("scheduler.preempt", "r.num_computed_tokens = 0", "pass")],
    "blocks_match_computed_tokens": [M("kv_cache.allocate_slots",
                                       "min(total_computed_tokens + num_new_tokens + lookahead, L)",
                                       "min(total_computed_tokens + num_new_tokens + lookahead + 1, L)")],
    "blocks_conserved": [M("kv_cache.BlockCountsWork.free",
                           "self.num_free_blocks += self.req_to_num_blocks.pop(request_id, 0)",
                           "self.req_to_num_blocks.pop(request_id, 0)")],
    "running_within_limit": [M("scheduler.schedule_waiting", "len(s.running) < s.config.max_num_active_reqs",
                               "len(s.running) <= s.config.max_num_active_reqs"),
                             M("scheduler.schedule", "assert len(s.running) <= s.config.max_num_seqs", "pass")],
    "waiting_queue_ordered": [M("scheduler.preempt", "enqueue(s.config.policy, s.waiting, s.requests, victim, front=True)",
                                "s.waiting.append(victim)")],
}


def test_every_invariant_has_a_mutant():
    assert set(INVARIANT_MUTANTS) == set(STATE_INVARIANTS)


@pytest.mark.parametrize("name", sorted(INVARIANT_MUTANTS))
def test_invariant_catches_broken_rule(name):
    with mutated(INVARIANT_MUTANTS[name]), pytest.raises(InvariantViolation, match=name):
        run_state_machine_as_test(invariant_machine(watch=name), settings=settings(
            max_examples=2000, stateful_step_count=60, deadline=None, database=None,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
