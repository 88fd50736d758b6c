"""The state invariant (spec/invariants.py) holds in every state the hypothesis
machine reaches, and each predicate is shown able to fail on a broken spec."""

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from machine import load_mutant, make_machine
from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.invariants import STATE_INVARIANTS, check_state


class InvariantViolation(AssertionError):
    pass


def invariant_machine(scheduler=spec_scheduler, watch=None):
    base = make_machine(scheduler, watch="__none__")  # only the state invariant fails the run

    class InvariantMachine(base):
        def queues_partition_requests(self):
            # superseded by the registry's predicate of the same name (checked below)
            pass

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
INVARIANT_MUTANTS = {
    "queues_partition_requests": [(S, "            running.append(rid)\n", "            running.append(rid); waiting.append(rid)\n")],
    "statuses_match_queues": [(S, "reqs[victim] = r.evolve(status=RequestStatus.PREEMPTED,", "reqs[victim] = r.evolve(status=RequestStatus.RUNNING,")],
    "request_lengths_valid": [(S, "if request.num_tokens >= max_model_len or", "if request.num_tokens > max_model_len or")],
    "computed_tokens_below_num_tokens": [(S, "n = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens  # S:839 ", "n = r.num_tokens + r.num_output_placeholders - r.num_computed_tokens + 1  # ")],
    "waiting_requests_hold_nothing": [(S, "reqs[victim] = r.evolve(status=RequestStatus.PREEMPTED, num_computed_tokens=0,", "reqs[victim] = r.evolve(status=RequestStatus.PREEMPTED,")],
    "blocks_match_computed_tokens": [(K, "num_tokens_need_slot = min(total_computed_tokens + num_new_tokens, L)", "num_tokens_need_slot = min(total_computed_tokens + num_new_tokens + 1, L)")],
    "blocks_conserved": [(S, "free += blocks.pop(victim, 0)", "blocks.pop(victim, 0)")],
    "running_within_limit": [(S, "if len(running) >= c.max_num_active_reqs:", "if len(running) > c.max_num_active_reqs:"), (S, "assert len(running) <= c.max_num_seqs", "pass")],
    "waiting_queue_ordered": [(S, "_enqueue(c.policy, waiting, reqs, victim, front=True)", "waiting.append(victim)")],
}


def test_every_invariant_has_a_mutant():
    assert set(INVARIANT_MUTANTS) == set(STATE_INVARIANTS)


@pytest.mark.parametrize("name", sorted(INVARIANT_MUTANTS))
def test_invariant_catches_broken_rule(name):
    mutant = load_mutant(INVARIANT_MUTANTS[name], name=f"inv_{name}")
    with pytest.raises(InvariantViolation, match=name):
        run_state_machine_as_test(invariant_machine(mutant, watch=name), settings=settings(
            max_examples=2000, stateful_step_count=60, deadline=None, database=None,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
