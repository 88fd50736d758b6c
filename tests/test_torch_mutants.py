"""Every mutant of tests/torch_mutants.py is caught by the default differential
campaign (the scenarios of `schedspec diff --impl torch --scenarios 500 --seed 0`:
generator seed 0, indexes 0..499, the four combinations of prefix caching and
async scheduling drawn as torch campaigns draw them), and the unmutated code
agrees on all of them.  The few mutants whose rule the two-batch engine never
exercises in a trace (torch_mutants.py NOT_IN_DEFAULT_CAMPAIGN) are caught by
the test named there instead.

A mutant's campaign stops at its first divergence (that is all "caught" needs),
in batches, in index order."""

import pytest
from schedspec.gpu.batch import run_batch
from schedspec.gpu.campaign import TORCH_FLAGS
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from torch_mutants import MUTANTS, NOT_IN_DEFAULT_CAMPAIGN, load_torch_mutant

SEED, COUNT, BATCH = 0, 500, 64

# The scenario that first caught `refund_not_refunded` (a campaign biased to
# PRIORITY with token budgets of 1..12), kept as a regression test; the default
# campaign catches it too since the generator draws budget-bound priority
# scenarios (reference/generator.py `_budget_bound_priority`).
TARGETED = {
    "refund_not_refunded": {
        "format": "schedspec.scenario/1", "name": "refund-then-budget-binds",
        "config": {"max_num_batched_tokens": 6, "max_num_seqs": 6, "max_model_len": 21, "block_size": 9,
                   "num_gpu_blocks": 4, "enable_chunked_prefill": True, "policy": "priority",
                   "watermark": 0.01, "scheduler_reserve_full_isl": False, "max_num_scheduled_tokens": 3},
        "requests": [
            {"id": "r0", "arrival_step": 0, "prompt_len": 1, "priority": 1, "arrival_time": 0.0},
            {"id": "r1", "arrival_step": 1, "prompt_len": 8, "max_tokens": 18, "arrival_time": 1.0},
            {"id": "r2", "arrival_step": 1, "prompt_len": 16, "max_tokens": 3, "arrival_time": 2.0},
            {"id": "r3", "arrival_step": 2, "prompt_len": 12, "priority": 2, "arrival_time": 3.0},
            {"id": "r4", "arrival_step": 2, "prompt_len": 18, "max_tokens": 3, "priority": 2, "arrival_time": 4.0},
            {"id": "r5", "arrival_step": 2, "prompt_len": 12, "max_tokens": 24, "output_len": 21, "priority": 1,
             "arrival_time": 5.0}],
        "aborts": [], "max_steps": 150},
}


@pytest.fixture(scope="module")
def default_campaign():
    scenarios = [generate_scenario(scenario_rng(SEED, i), i, TORCH_FLAGS) for i in range(COUNT)]
    return scenarios, [run_scenario(sc, SpecScheduler()) for sc in scenarios]


def first_divergence(run, scenarios, spec_traces):
    for k in range(0, len(scenarios), BATCH):
        for sc, a, b in zip(scenarios[k:k + BATCH], spec_traces[k:k + BATCH], run(scenarios[k:k + BATCH], device="cpu")):
            if compare_traces(a, b) is not None:
                return sc.name
    return None


def test_unmutated_code_agrees(default_campaign):
    assert first_divergence(run_batch, *default_campaign) is None


def test_at_least_ten_mutants():
    assert len(MUTANTS) >= 10


def test_prefix_caching_mutants():
    """At least four mutants break a prefix-caching rule (gpu/pool.py and the
    admissions that look the cache up)."""
    pc = {"hit_not_capped", "free_head_first", "hashed_to_front", "no_hashing_within_step",
          "no_hits_on_resumption", "no_eviction"}
    assert pc <= set(MUTANTS)


def test_async_mutants():
    """At least four mutants break an async-scheduling rule and are caught by the
    default campaign; the rest name the test that catches them."""
    async_names = {n for n in MUTANTS if n.startswith("async_")}
    assert len(async_names - set(NOT_IN_DEFAULT_CAMPAIGN)) >= 4
    assert set(NOT_IN_DEFAULT_CAMPAIGN) <= async_names
    assert all(TORCH_FLAGS.count(f) for f in ((False, True), (True, True)))


@pytest.mark.parametrize("name", sorted(set(MUTANTS) - set(NOT_IN_DEFAULT_CAMPAIGN)))
def test_default_campaign_catches_mutant(name, default_campaign):
    mutant = load_torch_mutant(MUTANTS[name], name=f"campaign_{name}")
    assert first_divergence(mutant.batch.run_batch, *default_campaign) is not None, f"{name} not caught"


@pytest.mark.parametrize("name", sorted(TARGETED))
def test_targeted_scenario_catches_mutant(name):
    sc = scenario_from_json(TARGETED[name])
    spec = run_scenario(sc, SpecScheduler())
    assert compare_traces(spec, run_batch([sc], device="cpu")[0]) is None
    mutant = load_torch_mutant(MUTANTS[name], name=f"targeted_{name}")
    assert compare_traces(spec, mutant.batch.run_batch([sc], device="cpu")[0]) is not None
