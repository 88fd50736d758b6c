"""`schedspec prove --vllm-version X`: the z3 encodings model release X's rules
(proofs/release.py), agree with the spec modelling X, and show X's known bug.

Each release below is the first without one gate's rule, so each gate's older
rule is compared: 0.32.0 (PRIORITY stops at a self-preemption), 0.30.0 (the
long-prefill threshold caps a lone request), 0.25.0 (no input budget).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings

import test_proofs_agreement as agreement
from machine import configs
from schedspec.proofs.release import DEFAULT, FINDINGS, Release
from schedspec.proofs.agreement import StepEvaluator, spec_step
from schedspec.proofs.obligations import build_obligations
from schedspec.spec import versions

RELEASES = {"0.32.0": versions.PRIORITY_SELF_PREEMPTION_CONTINUES,
            "0.30.0": versions.LONG_PREFILL_THRESHOLD_NEEDS_TWO,
            "0.25.0": versions.INPUT_BUDGET}


def in_release(state, version):
    """`state` with its config modelling `version` (fields it lacks left at their older meaning)."""
    lacking = versions.fields_lacking(version)
    c = dataclasses.replace(state.config, vllm_version=version,
                            **({"max_num_active_seqs": None} if "max_num_active_seqs" in lacking else {}),
                            **({"watermark": 0.0} if "watermark" in lacking else {}))
    return dataclasses.replace(state, config=c)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_encoding_agrees_with_the_spec_of_each_release(version):
    assert not versions.has(version, RELEASES[version])
    seen = {"states": 0, "release differs": 0}
    ev = StepEvaluator("correct", agreement.MAX_RUNNING, agreement.MAX_WAITING, release=Release(version))

    def check(state, output_len):
        if not ev.fits(state):
            return
        got, _ = ev.evaluate(state, output_len)
        exp, _ = spec_step(state, output_len)
        diff = {k: (exp[k], got.get(k)) for k in exp if exp[k] != got.get(k)}
        assert not diff, (version, state, output_len, diff)
        seen["states"] += 1
        newest, _ = spec_step(in_release(state, versions.DEFAULT_RELEASE), output_len)
        seen["release differs"] += newest != exp

    @settings(max_examples=150, **agreement.SETTINGS)
    @given(config=configs(wave2=False), acts=agreement.actions)
    def reached(config, acts):
        for state, output_len in agreement.reached_states(in_release(state_of(config), version).config, acts):
            check(state, output_len)

    @settings(max_examples=250, **agreement.SETTINGS)
    @given(drawn=agreement.drawn_states())
    def direct(drawn):
        state, output_len = drawn
        check(in_release(state, version), output_len)

    for make in agreement.EXPLICIT_STATES:  # the budget and watermark boundaries, in this release
        state, output_len = make()
        check(in_release(state, version), output_len)
    reached()
    direct()
    assert seen["states"] >= 500, seen
    # The release's own rule was exercised: states where it schedules differently from 0.33.0.
    assert seen["release differs"] >= 3, seen


def state_of(config):
    from schedspec.spec.state import SchedulerState

    return SchedulerState(config)


# The one-step claims at 3 + 3 here: the default 4 + 4 is for `prove` runs
# (benchmarks/prove_time.py); what these tests check does not depend on the bound.
CI_BOUND = 3


def test_bad_variants_that_are_a_releases_own_rule_are_dropped():
    assert Release("0.30.0").bad_variants(("threshold_with_one_eligible", "budget_off_by_one")) == \
        ("budget_off_by_one",)
    obligations = {o.name: o for o in build_obligations(Release("0.30.0"))}
    assert all("threshold_with_one_eligible" not in o.bad_variants and "threshold_one_eligible" not in o.bad_variants
               for o in obligations.values())
    assert all(o.bad_variants for o in obligations.values())  # every obligation can still fail
    assert "vLLM 0.30.0" in str(obligations["step:token_budget_respected"].bound)


def test_spec_decode_variants_only_where_the_release_models_it():
    """A bad variant that differs from the rules only with speculative decoding on
    (a drafter's rows) cannot be refuted where the spec has no speculative decoding."""
    def token_claim_variants(rel):
        return {o.name: o for o in build_obligations(rel)}["loop:token_budget_respected"].bad_variants

    assert "drafter_rows_not_charged" in token_claim_variants(DEFAULT)
    variants = token_claim_variants(Release("0.32.0"))
    assert "drafter_rows_not_charged" not in variants and "budget_off_by_one" in variants


@pytest.mark.parametrize("prop,version,expected", [
    # Before 0.28.0 a step can grant more than max_num_batched_tokens (no input budget).
    ("token_budget_respected", "0.25.0", "refuted"), ("token_budget_respected", "0.28.0", "proved"),
    # Before 0.33.0, under PRIORITY, the running requests after a self-preempted one
    # stay running with no token that step.
    ("running_never_starved", "0.32.0", "refuted"), ("running_never_starved", "0.33.0", "proved"),
])
def test_findings_are_refuted_exactly_before_the_release_that_fixed_them(prop, version, expected):
    assert prop in FINDINGS
    chosen = [o for o in build_obligations(Release(version), CI_BOUND) if o.property == prop]
    assert chosen
    for o in chosen:
        assert o.expected == expected
        assert ("finding" in o.extra) is (expected == "refuted")
        assert o.discharge("correct").status == expected, o.name


@pytest.mark.parametrize("version,name", [
    # Obligations whose encodings read a gated rule or a looser config check:
    ("0.32.0", "loop:preemption_only_on_allocation_failure"),  # PRIORITY stops at a self-preemption
    ("0.25.0", "step:running_before_waiting"),  # the token budget alone
    ("0.20.0", "loop:kv_blocks_conserved"),  # thresholds above max_model_len accepted
])
def test_properties_that_hold_in_every_release_are_proved(version, name):
    # scripts/prove-releases.sh discharges every obligation on every release.
    (o,) = [o for o in build_obligations(Release(version), CI_BOUND) if o.name == name]
    assert o.discharge("correct").status == "proved", (version, o.name)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "schedspec", *args], capture_output=True, text=True, timeout=600)


def test_cli_prove_names_the_release_and_its_finding(tmp_path):
    r = run_cli("prove", "--vllm-version", "0.25.0", "--only", "token_budget_respected", "--json",
                "-o", str(tmp_path), "--jobs", "1", "--bound", str(CI_BOUND))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["vllm_version"] == "0.25.0"
    rows = report["obligations"]
    assert {row["result"] for row in rows} == {"refuted"}
    assert all("fixed in 0.28.0" in row["finding"] for row in rows)
    # The witness scenarios model the release and replay on it.
    for row in rows:
        scenario = json.loads(open(row["witness"]).read())
        assert scenario["config"]["vllm_version"] == "0.25.0"
        assert "max_num_active_seqs" not in scenario["config"]
        check = run_cli("check", row["witness"])
        violated = {w[0] for w in map(str.split, check.stdout.splitlines()) if len(w) > 1 and w[1] == "VIOLATED"}
        # A witness of a property the release violates may show the violation too.
        assert check.returncode in (0, 1) and violated <= {"token_budget_respected"}, check.stdout + check.stderr
        assert (check.returncode == 1) is bool(violated), check.stdout


def test_cli_prove_refuses_an_unknown_release_in_one_line(tmp_path):
    r = run_cli("prove", "--vllm-version", "0.29.0", "-o", str(tmp_path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "0.29.0" in r.stderr, r.stderr
