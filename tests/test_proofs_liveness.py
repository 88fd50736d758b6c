"""The liveness theorem (proofs/liveness.py): its z3 lemmas, and the tie
of its aggregate quantities to the spec on concrete runs.

The z3 lemmas speak of aggregates (the head of `running`, the blocks the others
hold, the ranking function R).  Here every step of random spec runs that meet
the theorem's conditions is checked against the same three facts: the head is
granted >= 1 token and not preempted, an idle engine admits its waiting head
with >= 1 token, and R falls by >= 1; then every request finishes by
`finish_bound`.  A spec mutant that preempts the head must break the check.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mutants import Mutation, mutated
from schedspec.proofs import liveness
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import load_scenario
from schedspec.proofs.search.counterexample import evaluate
from schedspec.proofs.search.goals import get_goal
from schedspec.spec.config import config_as_given

COUNTEREXAMPLES = Path(__file__).parent / "counterexamples"


def test_the_theorem_is_proved_and_refuted_on_each_bad_variant():
    assert liveness.discharge("correct").status == "proved"
    # Each bad variant breaks one condition a lemma rests on, and is refuted there.
    where = {"victim_head": "head_kept", "waiting_hold_blocks": "head_kept", "no_admission_budget": "idle_admission",
             "watermark_when_idle": "idle_admission", "head_loses_progress": "ranking"}
    assert set(where) == set(liveness.BAD_VARIANTS)
    for variant, lemma in where.items():
        r = liveness.discharge(variant)
        assert r.status == "refuted" and r.detail.startswith(lemma), (variant, r)


def meeting_conditions(seed: int, count: int):
    """Random scenarios (reference/generator.py) made to meet the conditions: FCFS,
    both flags off, no aborts; chunked prefill kept as drawn where the budget allows."""
    for i in range(count):
        s = generate_scenario(scenario_rng(seed, i), i)
        config = {**config_as_given(s.config), "policy": "fcfs", "enable_prefix_caching": False, "async_scheduling": False}
        s = dataclasses.replace(s, config=config, aborts=(), max_steps=20_000)
        c = s.scheduler_config()
        if liveness.unmet_conditions(c):
            s = dataclasses.replace(s, config={**config, "enable_chunked_prefill": True})
        assert not liveness.unmet_conditions(s.scheduler_config())
        yield s


def ranking(state, W) -> int:
    head = state.running[0] if state.running else None
    out = sum(W[rid] for rid in state.requests if rid != head)
    if head is not None:
        out += W[head] - 1 - state.requests[head].num_computed_tokens
    return out


def lemma_violations(scenario, scheduler=None) -> tuple[list[str], dict[str, int]]:
    """The steps of `scenario` on the spec where a lemma fails, and what was seen."""
    L = scenario.scheduler_config().max_model_len
    W = {r.id: liveness.work(r, L) for r in scenario.requests}
    bad: list[str] = []
    seen = {"steps": 0, "head steps": 0, "idle admissions": 0, "preemptions": 0}

    def on_step(t) -> None:
        granted = dict(t.output.num_scheduled_tokens)
        seen["steps"] += 1
        seen["preemptions"] += len(t.output.preempted_req_ids)
        if t.before.running:
            head = t.before.running[0]
            seen["head steps"] += 1
            if granted.get(head, 0) < 1 or head in t.output.preempted_req_ids:
                bad.append(f"step {t.step}: head {head} got {granted.get(head, 0)} tokens, "
                           f"preempted {t.output.preempted_req_ids}")
        elif t.before.waiting:
            w = t.before.waiting[0]
            seen["idle admissions"] += 1
            if granted.get(w, 0) < 1:
                bad.append(f"step {t.step}: idle engine did not admit {w}")
        if t.before.requests and ranking(t.after, W) > ranking(t.before, W) - 1:
            bad.append(f"step {t.step}: R {ranking(t.before, W)} -> {ranking(t.after, W)}")

    trace = run_scenario(scenario, scheduler or SpecScheduler(), on_step=on_step)
    summary = trace["summary"]
    if summary["unfinished"]:
        bad.append(f"unfinished: {summary['unfinished']}")
    else:
        last = max((r["finish_step"] for r in summary["requests"].values()), default=0)
        if last > liveness.finish_bound(scenario):
            bad.append(f"last finish at step {last} > bound {liveness.finish_bound(scenario)}")
    return bad, seen


def test_the_lemmas_hold_on_every_step_of_spec_runs():
    totals = {"steps": 0, "head steps": 0, "idle admissions": 0, "preemptions": 0, "chunked off": 0}
    for s in meeting_conditions(11, 150):
        bad, seen = lemma_violations(s)
        assert not bad, (s.name, bad[:3])
        for k, v in seen.items():
            totals[k] += v
        totals["chunked off"] += not s.scheduler_config().enable_chunked_prefill
    # Not vacuous: the lemmas' interesting paths were taken, in both admission modes.
    assert totals["preemptions"] >= 50 and totals["idle admissions"] >= 100 and totals["chunked off"] >= 10, totals


def test_a_spec_that_preempts_the_head_breaks_the_check():
    # FCFS victim = the head of running instead of its tail (as proofs/variants.py fcfs_victim_head).
    with mutated([Mutation("scheduler.choose_victim", "s.running[-1]", "s.running[0]")]):
        broken = [bad for s in meeting_conditions(11, 150) for bad in [lemma_violations(s)[0]] if bad]
    assert broken, "the head-preempting mutant went unnoticed"


@pytest.mark.parametrize("name,unmet", [
    ("liveness-finishes-priority-tie.json", "fcfs"),
    ("liveness-finishes-resume.json", "chunked prefill on or a step budget >= max_model_len - 1"),
])
def test_each_condition_matters(name, unmet):
    # Dropping one condition: a scenario that never finishes (a repeated state), on
    # the spec here and on vLLM 0.33.0 in tests/test_counterexample_vllm.py.
    s = load_scenario(COUNTEREXAMPLES / name)
    assert liveness.unmet_conditions(s.scheduler_config()) == [unmet]
    assert evaluate(s, SpecScheduler(), get_goal("liveness:finishes"), 3) is not None


def test_finish_bound_counts_the_last_arrival_and_each_requests_work():
    s = load_scenario(COUNTEREXAMPLES / "liveness-finishes-priority-tie.json")
    L = s.scheduler_config().max_model_len
    assert liveness.finish_bound(s) == max(r.arrival_step for r in s.requests) + sum(
        min(r.prompt_len + (r.max_tokens if r.max_tokens is not None else L - r.prompt_len), L) for r in s.requests)


def test_the_witness_meets_the_conditions_and_finishes_within_the_bound():
    result, scenario = liveness.witness()
    assert result.status == "proved"
    assert not liveness.unmet_conditions(scenario.scheduler_config())
    bad, seen = lemma_violations(scenario)
    assert not bad and seen["preemptions"] >= 2


def test_the_chunked_off_livelock_needs_no_zero_threshold_from_0_34_0():
    # 0.33.0 capped grants by the threshold with chunked prefill off too, so a threshold
    # at most the budget cut a resumption into chunks that fit; from 0.34.0 it is ignored
    # there (versions.LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL) and the livelock
    # comes back.  The same scenario on vLLM itself: tests/test_counterexample_vllm.py.
    s = load_scenario(COUNTEREXAMPLES / "liveness-finishes-threshold.json")
    assert s.scheduler_config().long_prefill_token_threshold > 0
    assert liveness.unmet_conditions(s.scheduler_config()) == [
        "chunked prefill on or a step budget >= max_model_len - 1"]
    new = dataclasses.replace(s, config={**config_as_given(s.config), "vllm_version": "0.34.0"})
    old = dataclasses.replace(s, config={**config_as_given(s.config), "vllm_version": "0.33.0"})
    assert evaluate(new, SpecScheduler(), get_goal("liveness:finishes"), 3) is not None
    assert evaluate(old, SpecScheduler(), get_goal("liveness:finishes"), 3) is None
    assert run_scenario(old, SpecScheduler())["summary"]["unfinished"] == []
