"""CI's differential campaign under vLLM's engine flags: `schedspec diff --impl
vllm --scenarios 400 --seed 11`, whose generator draws enable_prefix_caching and
async_scheduling in all four combinations (reference/generator.py), agrees with
the spec step by step, and exercises what the flags bring: prefix hits (also on
resumption), evictions, shared blocks, preemptions with a batch in flight and
their stale outputs, aborts with a batch in flight.

Skips without vLLM (fails instead under CI=true or SCHEDSPEC_REQUIRE_VLLM=1;
tests/conftest.py).  About 45 s after vLLM's import on one core."""

from __future__ import annotations

import json

from schedspec.cli.diff import main as diff_main

SEED, SCENARIOS = 11, 400

FEATURES = (
    "preemptions", "resumptions", "prefix hits", "prefix hits on resumption", "prefix tokens saved",
    "evicted blocks", "steps with shared blocks", "in-flight preemptions", "stale outputs applied",
    "aborts with a batch in flight", "async max_tokens guard", "empty async batches",
    # prefill throttling (generator.py draws prefill_schedule_interval beside the flags)
    "scenarios with prefill throttling", "steps holding prefill back", "steps holding an admission back",
    "scenarios with the adaptive long-prefill threshold", "steps with the long-prefill cap raised to a fair share",
    # KV connector hits (generator.py draws kv_connector_tokens)
    "scenarios with KV connector hits", "KV connector loads", "KV connector loads on resumption",
    "KV connector loads beyond a prefix hit",
    # asynchronous loads, KV delivery (generator.py draws kv_connector_load_steps, requires_kv_delivery)
    "KV connector async loads", "KV connector async loads admitted", "steps scheduling past a request loading KV",
    "scenarios with a KV connector requiring delivery", "in-flight outputs dropped for KV delivery",
    # requests aborted mid-load, held until the load ends; lookahead block hashes; the EAGLE block drop
    "KV connector loads ended after their request finished",
    # a KV producer's sends: finished requests held until the send is reported
    "scenarios with KV connector sends", "KV connector sends ended after their request finished",
    "steps scheduling past blocks held for a KV send",
    "scenarios with lookahead block hashes", "prefix hits on lookahead block hashes",
    "scenarios with the EAGLE block drop", "prefix hits with the EAGLE block dropped",
    "scenarios with a multi-module MTP drafter", "steps with a prefill chunk under an MTP drafter's lookahead",
)
COMBINATIONS = ("sync", "sync + prefix caching", "async", "async + prefix caching")


def test_campaign_with_engine_flags_agrees_with_vllm(vllm, tmp_path, capsys):
    out = tmp_path / "divergences"
    rc = diff_main(["--impl", "vllm", "--scenarios", str(SCENARIOS), "--seed", str(SEED), "--json",
                    "-o", str(out), "--shrink-seconds", "60"])
    report = json.loads(capsys.readouterr().out)
    found = report["divergences"]
    assert rc == 0 and not found, "\n".join(
        f"{d['scenario']}: step {d['step']}, field {d['field']}; minimal: {d.get('minimal', {}).get('file')}"
        for d in found[:5])
    assert report["scenarios"] == SCENARIOS and report["steps_compared"] > 20 * SCENARIOS
    cov = report["coverage"]
    for name in COMBINATIONS:
        assert cov.get(f"scenarios ({name})", 0) >= SCENARIOS // 6, f"few scenarios ({name}): {cov}"
        assert cov.get(f"steps ({name})", 0) > 0, cov
    for key in FEATURES:
        assert cov.get(key, 0) > 0, f"the campaign never exercised {key}: {cov}"
    assert cov.get("rejected scenarios", 0) == 0, cov
