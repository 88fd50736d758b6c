"""The keep-up report's grouping (reference/keep_up.py) on a release pair whose
differences are known: the spec at 0.34.0 playing the new release, against the spec at
0.33.0.  Its gates (spec/versions.py) are the answer the grouping must find: the
resumed-as-new output change, needing no feature, and the long-prefill threshold with
chunked prefill off, needing both.  No vLLM needed; the command's run on the real
0.34.0 is docs/keep-up-0.34.0.md."""

from __future__ import annotations

import dataclasses

from schedspec.reference.changes import ReleaseSpec
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_in, generate_scenario, scenario_rng
from schedspec.reference.keep_up import features_used, group_divergences, needed_features, render_report, without
from schedspec.reference.scenario import load_scenario
from schedspec.reference.shrink import shrink
from schedspec.spec.config import config_as_given

from test_versions import CHANGES

NEW, OLD = ReleaseSpec("0.34.0"), ReleaseSpec("0.33.0")


def diverges(s):
    return compare_traces(run_scenario(s, NEW), run_scenario(s, OLD))


def found_divergences(n: int, seed: int = 1):
    out = []
    for i in range(n):
        s = generate_scenario(scenario_rng(seed, i), i, FLAGS_ALL, "0.33.0", features_in("0.33.0"))
        d = diverges(s)
        if d is not None:
            small, sd = shrink(s, NEW, OLD, d, budget_s=5)
            out.append((small, sd, None))
    return out


def test_grouping_finds_the_two_rule_changes_of_0_34_0():
    found = found_divergences(60)
    assert len(found) >= 5, len(found)
    groups = {g.key: g for g in group_divergences(found, diverges)}
    assert ("new", ()) in groups, sorted(groups)
    assert ("scheduled", ("chunked prefill off", "long-prefill threshold")) in groups, sorted(groups)
    text = render_report("0.34.0", "0.33.0", list(groups.values()), {"scenarios": 60, "divergences": found}, None)
    assert "`new` with none" in text and "chunked prefill off, long-prefill threshold" in text


def test_a_feature_is_needed_only_when_switching_it_off_ends_the_divergence():
    s = load_scenario(CHANGES / "long_prefill_threshold_needs_chunked_prefill.json")
    d = diverges(s)
    assert set(features_used(s)) == {"chunked prefill off", "long-prefill threshold"}
    assert needed_features(s, d, diverges) == ["chunked prefill off", "long-prefill threshold"]
    # A comparison that diverges whatever the features: none is needed.
    assert needed_features(s, d, lambda x: d) == []
    # Switched off, the scenario must still be one vLLM accepts, or the feature is not judged.
    big = dataclasses.replace(s, config={**config_as_given(s.config), "max_num_batched_tokens": 2, "max_num_seqs": 2})
    assert without(big, "chunked prefill off") is not None


KEEP_UP = CHANGES.parent / "keep-up-0.34.0"


def test_what_keep_up_found_on_0_34_0_the_gates_now_say():
    # The smallest scenario of each group `schedspec keep-up 0.34.0 --against 0.33.0`
    # reported (docs/keep-up-0.34.0.md): the spec at 0.33.0 and at 0.34.0 tell them
    # apart, so the release's gates and config checks cover each finding.
    files = sorted(KEEP_UP.glob("*.json"))
    assert len(files) == 4
    for path in files:
        s = load_scenario(path)
        new = dataclasses.replace(s, config={**config_as_given(s.config), "vllm_version": "0.34.0"})
        old = dataclasses.replace(s, config={**config_as_given(s.config), "vllm_version": "0.33.0"})
        assert compare_traces(run_scenario(new, NEW), run_scenario(old, OLD)) is not None, path.name


def test_what_keep_up_found_on_0_34_0_agrees_with_the_real_release(vllm):
    # vLLM 0.34.0 (the default release .venv has) schedules each as the spec at 0.34.0.
    from schedspec.reference.impl import SpecScheduler

    if vllm.vllm_version != "0.34.0":
        import pytest

        pytest.skip(f"this interpreter runs vLLM {vllm.vllm_version}")
    for path in sorted(KEEP_UP.glob("*.json")):
        s = load_scenario(path)
        assert compare_traces(run_scenario(s, SpecScheduler()), run_scenario(s, vllm)) is None, path.name


def test_keep_up_refuses_bad_input_in_one_line(tmp_path):
    from test_versions import run_cli

    p = run_cli("keep-up", "0.19.0")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "0.19.0" in p.stderr, p.stderr
    p = run_cli("keep-up", "0.34.0", "--against", "0.29.0", "-o", str(tmp_path / "r"))
    assert p.returncode == 2 and "--against" in p.stderr and "Traceback" not in p.stderr, p.stderr
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    p = run_cli("keep-up", "0.34.0", "--no-install", "-o", str(tmp_path / "used"))
    assert p.returncode == 2 and "not empty" in p.stderr, p.stderr
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"  # nothing the user had is touched
