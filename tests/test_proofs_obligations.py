"""Obligations: every property has one; the z3 property and invariant formulas
mean what the Python predicates mean; witnesses replay; bad variants are
refuted with counterexamples a broken spec also exhibits; `schedspec prove`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import z3
from hypothesis import given, settings

from mutants import Mutation, mutated
from test_proofs_agreement import SETTINGS, drawn_states
from schedspec.proofs.agreement import StepEvaluator, formula_terms, spec_step, to_spec_step
from schedspec.proofs import encoding
from schedspec.proofs.release import DEFAULT, Release
from schedspec.proofs.obligations import (BOUND_OVERRIDES, OUTSIDE_BOUNDED, OUTSIDE_ENCODING, STEP_BAD_VARIANTS,
                                          STEP_LEMMAS, build_obligations, covered_properties, outside_encoding,
                                          step_claim)
from schedspec.proofs.solving import check
from schedspec.proofs.property_formulas import INVARIANT_FORMULAS, PROPERTY_FORMULAS
from schedspec.proofs.symbolic import concrete_state
from schedspec.proofs.witness import find_witness
from schedspec.reference.engine import run_scenario
from schedspec.reference.loader import load_impl
from schedspec.spec import properties
from schedspec.spec.invariants import STATE_INVARIANTS, check_state
from schedspec.spec.properties import PROPERTIES, Property, check_step


def test_every_property_has_an_obligation_and_formula(monkeypatch):
    obligations = build_obligations(DEFAULT)
    # The properties of prefix caching and async scheduling are outside the bounded
    # encoding (both flags off), and only those; the loop encoding (async on or off)
    # covers async's placeholders_never_negative, structured output's grammar_wait_respected,
    # LoRA's max_loras_respected and speculative decoding's drafts_sent_are_known, the
    # pool encoding prefix caching's three, the encoder encoding encoder inputs' three: none
    # is left not encoded.
    encoder_only = {"encoder_budget_respected", "encoder_cache_within_capacity", "encoder_inputs_available"}
    assert set(OUTSIDE_BOUNDED) == {"placeholders_never_negative", "block_ref_counts_match_holders",
                                    "kv_pool_partitioned", "prefix_hit_within_shared_prefix",
                                    "drafts_sent_are_known", "max_loras_respected", "grammar_wait_respected"} | encoder_only
    loop_only = {"placeholders_never_negative", "grammar_wait_respected", "max_loras_respected",
                 "drafts_sent_are_known"}
    pool_only = {"block_ref_counts_match_holders", "kv_pool_partitioned", "prefix_hit_within_shared_prefix"}
    assert set(OUTSIDE_ENCODING) == set(outside_encoding(DEFAULT)) == \
        set(OUTSIDE_BOUNDED) - loop_only - pool_only - encoder_only == set()
    assert {f"loop:{name}" for name in loop_only} | {f"pool:{name}" for name in pool_only} | \
        {f"encoder:{name}" for name in encoder_only} <= {o.name for o in obligations}
    # A release for which schedspec models neither LoRA, structured output nor
    # speculative decoding has no claim of any, and says so.
    names = {o.name for o in build_obligations(Release("0.25.0"))}
    features = {"max_loras_respected", "grammar_wait_respected", "drafts_sent_are_known",
                "encoder_budget_respected", "encoder_cache_within_capacity", "encoder_inputs_available"}
    assert not ({f"loop:{name}" for name in features} | {f"encoder:{name}" for name in features}) & names
    assert set(outside_encoding(Release("0.25.0"))) == set(OUTSIDE_ENCODING) | features
    assert set(PROPERTIES) - set(OUTSIDE_ENCODING) <= covered_properties(obligations)
    bounded = set(PROPERTIES) - set(OUTSIDE_BOUNDED)
    assert set(PROPERTY_FORMULAS) == bounded and set(INVARIANT_FORMULAS) == set(STATE_INVARIANTS)
    assert set(STEP_BAD_VARIANTS) == bounded
    assert all(o.bad_variants for o in obligations)
    # A property added to the registry without an obligation is noticed.
    monkeypatch.setitem(properties.PROPERTIES, "new_property", Property("new_property", "", lambda b, o, a: None))
    with pytest.raises(KeyError):
        build_obligations(DEFAULT)


# Between them these variants violate every property and every invariant.
FORMULA_VARIANTS = ["correct", "admission_over_budget", "zero_grant", "running_capped_at_1",
                    "admit_after_preemption", "admission_capped_at_2", "run_slot_check_off_by_one",
                    "running_need_plus_2", "admitted_to_waiting", "advance_short", "preempted_to_back",
                    "computed_tokens_not_reset", "preemption_leaks_blocks"]
# No rule variant breaks these two (a slot cannot hold a request twice; no variant
# touches the length stop); their formulas are only shown to hold where they hold.
NOT_BROKEN_BY_VARIANTS = {"queues_partition_requests", "request_lengths_valid"}


def test_formulas_agree_with_predicates():
    """On each variant's own steps, every z3 property formula gives the Python
    predicate's (applicable, holds), and every invariant formula check_state's."""
    evs = {v: StepEvaluator(v, 3, 3, extra_terms=formula_terms) for v in FORMULA_VARIANTS}
    names = list(PROPERTY_FORMULAS)
    seen = {"violated": set(), "applicable": set(), "inv_violated": set(), "steps": 0}

    @settings(max_examples=300, **SETTINGS)
    @given(drawn=drawn_states())
    def run(drawn):
        state, output_len = drawn
        for v, ev in evs.items():
            if not ev.fits(state):
                return
            got, extra = ev.evaluate(state, output_len)
            out, after = to_spec_step(state, got)
            verdicts = check_step(state, out, after)
            for i, name in enumerate(names):
                app, holds = extra[2 * i], extra[2 * i + 1]
                py = verdicts[name]
                z = (app, holds or not app)
                assert (py.applicable, py.holds) == z, (v, name, state, got, py)
                if not py.holds:
                    seen["violated"].add(name)
                if py.applicable:
                    seen["applicable"].add(name)
            inv = check_state(after)
            for k, name in enumerate(INVARIANT_FORMULAS):
                assert inv[name].holds == extra[2 * len(names) + k], (v, name, state, got)
                if not inv[name].holds:
                    seen["inv_violated"].add(name)
            seen["steps"] += 1

    run()
    assert seen["steps"] >= 500
    assert seen["applicable"] == set(names)
    assert seen["violated"] == set(names), set(names) - seen["violated"]
    assert seen["inv_violated"] == set(INVARIANT_FORMULAS) - NOT_BROKEN_BY_VARIANTS, seen["inv_violated"]


@pytest.mark.parametrize("prop", ["preemption_only_on_allocation_failure", "starvation_condition",
                                  "running_before_waiting", "preempted_restart_from_zero"])
def test_witness_replays(prop):
    result, scenario = find_witness(f"property:{prop}", DEFAULT)
    assert result.status == "proved", result
    step = result.model["step"]
    seen = {}

    def on_step(t):
        seen[t.step] = check_step(t.before, t.output, t.after)[prop]

    run_scenario(scenario, load_impl("spec"), on_step=on_step)
    assert seen[step].applicable and seen[step].holds


def test_lemmas_are_proved_before_use_and_say_something(monkeypatch):
    """The preemption claim's lemma is a premise only once z3 has proved it: a false
    lemma taken unproved would make every variant "proved".  And it is no
    tautology: an ask happens in some state, and a variant whose asks exceed the
    demand breaks it."""
    prop = "preemption_only_on_allocation_failure"
    premise, _, _, before, stages = step_claim(prop, 2, 2, DEFAULT).build("correct", (2,))
    asks: list = []
    encoding.schedule_update(before, "correct", [0, 1], [2, 3], asks=asks)
    assert check(premise + [z3.Or([cond for _, cond, _ in asks])], 20)[0] == "sat"
    assert len(stages) == 1 and check(premise + [z3.Not(z3.And(stages[0]))], 20)[0] == "unsat"
    premise, _, _, _, stages = step_claim(prop, 2, 2, DEFAULT).build("running_need_plus_2", (2,))
    assert check(premise + [z3.Not(z3.And(stages[0]))], 20)[0] == "sat"
    monkeypatch.setitem(STEP_LEMMAS, prop, lambda before, asks, pools: [[z3.BoolVal(False)]])
    claim = step_claim(prop, 2, 2, DEFAULT, block_sizes=(2,))
    assert claim.discharge("admit_after_preemption").status == "refuted"
    assert claim.discharge("correct").status == "proved"


def test_pool_lemma_stages_each_follow_from_the_ones_before():
    """kv_blocks_conserved's stages (one per loop iteration: free >= 0 and free +
    held == usable) are proved in order, each from the stages before it, and a
    variant that leaks a victim's blocks breaks one (and is still refuted)."""
    prop = "kv_blocks_conserved"
    premise, _, _, _, stages = step_claim(prop, 2, 2, DEFAULT).build("correct", (2,))
    assert len(stages) == 4  # two running and two waiting iterations
    for i, stage in enumerate(stages):
        assert check(premise + [f for st in stages[:i] for f in st] + [z3.Not(z3.And(stage))], 20)[0] == "unsat"
    premise, _, _, _, stages = step_claim(prop, 2, 2, DEFAULT).build("preemption_leaks_blocks", (2,))
    assert check(premise + [z3.Not(z3.And([f for st in stages for f in st]))], 20)[0] == "sat"
    assert step_claim(prop, 2, 2, DEFAULT, block_sizes=(2,)).discharge("preemption_leaks_blocks").status == "refuted"


def test_bad_variant_refuted_and_spec_mutant_exhibits_it():
    res = step_claim("kv_blocks_conserved", 2, 2, DEFAULT).discharge("preemption_leaks_blocks")
    assert res.status == "refuted", res
    state, output_len = concrete_state(res.model, DEFAULT)
    assert all(v.holds for v in check_state(state).values())
    leak = Mutation("kv_cache.BlockCountsWork.free", "self.num_free_blocks += self.req_to_num_blocks.pop(request_id, 0)",
                    "self.req_to_num_blocks.pop(request_id, 0)")
    with mutated([leak]) as mutant:
        _, (out, after) = spec_step(state, output_len, mutant)
    assert not PROPERTIES["kv_blocks_conserved"].check(state, out, after).holds
    _, (out, after) = spec_step(state, output_len)
    assert PROPERTIES["kv_blocks_conserved"].check(state, out, after).holds


def _prove(*args):
    return subprocess.run([sys.executable, "-m", "schedspec", "prove", *args], capture_output=True, text=True)


def test_prove_cli(tmp_path):
    r = _prove("--bound", "2", "--only", "step:computed_tokens_advance_by_grant", "-o", str(tmp_path), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    row = rep["obligations"][0]
    assert row["result"] == "proved" and row["bad_variants"] == {"advance_short": "refuted"}
    assert (tmp_path / "step-computed_tokens_advance_by_grant.json").exists()
    # the witness is a scenario `schedspec check` accepts, and a rerun replaces only its own file
    c = subprocess.run([sys.executable, "-m", "schedspec", "check", row["witness"]], capture_output=True, text=True)
    assert c.returncode == 0, c.stderr
    (tmp_path / "initial.json").write_text("{}")  # not ours: never overwritten
    r = _prove("--bound", "2", "--only", "initial", "-o", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "initial.json").read_text() == "{}" and (tmp_path / "initial-1.json").exists()
    r = _prove("--only", "no_such_obligation")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no_such_obligation" in r.stderr


@pytest.mark.parametrize("bound", [2, pytest.param(3, marks=pytest.mark.long)])
def test_prove_whole_run(bound, tmp_path):
    """`schedspec prove` over every obligation: each has its expected result, a
    witness file that replays, and every bad variant refuted.  The suite runs it at
    2 + 2 (about 90 s on 2 idle cores; every bad variant is refuted there already),
    scripts/long-tests.sh at 3 + 3 (about 200 s); the default 4 + 4, 6 + 6 for some,
    takes about 105 s on 2 idle cores (benchmarks/prove_time.py runs it).  An
    obligation whose own default is below `bound` (BOUND_OVERRIDES) runs at that
    default.  The loop, pool, starvation and liveness obligations do not depend on
    the bound: both runs prove them whole."""
    every = [o.name for o in build_obligations(DEFAULT)]
    lower = [name for name in every if BOUND_OVERRIDES.get(name, bound) < bound]
    runs = [["--bound", str(bound)] + [a for n in every if n not in lower for a in ("--only", n)]]
    if lower:
        runs.append([a for n in lower for a in ("--only", n)])
    rows = []
    for args in runs:
        r = _prove("-o", str(tmp_path), "--json", *args)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr
        rows += json.loads(r.stdout)["obligations"]
    names = [row["name"] for row in rows]
    assert sorted(names) == sorted(every) and len(set(names)) == len(every)
    for row in rows:
        assert row["ok"] and row["result"] == row["expected"], row
        assert row["bad_variants"] and set(row["bad_variants"].values()) == {"refuted"}, row
        witness = row["witness"]
        assert witness and json.loads(open(witness).read())["format"] == "schedspec.scenario/1", row
