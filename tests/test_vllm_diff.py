"""Differential tests: the spec against the real vLLM 0.33.0 scheduler.

The vLLM tests skip when vLLM is not installed (`schedspec install-vllm`),
unless SCHEDSPEC_REQUIRE_VLLM=1 or CI=true (CI must not skip them), when they
fail instead.  vLLM is imported
once per process (about 10 s), by the module-scoped fixture.  The tests of
`compare_traces` and of the shrinker run without vLLM.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from schedspec.reference import loader as loader_module
from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.compare import Divergence, compare_traces
from schedspec.cli.diff import main as diff_main
from schedspec.reference.shrink import shrink
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import (config_rng, generate_config_dict, generate_scenario,
                                           scenario_rng)
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import load_scenario
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.json"))
CAMPAIGN_SEED = 7
CAMPAIGN_SIZE = 400
CONFIGS = 400


class NoWatermark(SpecScheduler):
    """A deliberately broken spec: it forgets the admission watermark."""

    name = "broken-no-watermark"

    def reset(self, config):
        super().reset(dataclasses.replace(config, watermark=0.0))


class ReversedPreemptions(SpecScheduler):
    """A deliberately broken spec: it reports preemptions in reverse order."""

    name = "broken-preempt-order"

    def schedule(self):
        out = super().schedule()
        return dataclasses.replace(out, preempted_req_ids=tuple(reversed(out.preempted_req_ids)))


def _campaign(a, b, n, seed):
    steps, divergences = 0, []
    for i in range(n):
        s = generate_scenario(scenario_rng(seed, i), i)
        ta, tb = run_scenario(s, a), run_scenario(s, b)
        steps += len(tb["steps"])
        d = compare_traces(ta, tb)
        if d is not None:
            divergences.append((s.name, d))
    return steps, divergences


# -- with vLLM ---------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_agree_with_vllm(vllm, path):
    scenario = load_scenario(path)
    tv = run_scenario(scenario, vllm)
    ts = run_scenario(scenario, SpecScheduler())
    assert "error" not in tv, tv.get("error")
    assert tv["steps"], "vLLM ran no step"
    d = compare_traces(tv, ts)
    assert d is None, d.describe()


def test_random_campaign_has_no_divergence(vllm):
    steps, divergences = _campaign(vllm, SpecScheduler(), CAMPAIGN_SIZE, CAMPAIGN_SEED)
    assert steps > 10 * CAMPAIGN_SIZE
    assert not divergences, "\n".join(f"{name}: {d.describe()}" for name, d in divergences[:5])


def test_campaign_reaches_the_core_scope(vllm):
    """The random scenarios do reach preemption, aborts in every state and
    every finish reason (on the agreed traces)."""
    from schedspec.reference.coverage import add_coverage as _coverage

    cov: dict[str, int] = {}
    spec = SpecScheduler()
    for i in range(CAMPAIGN_SIZE):
        s = generate_scenario(scenario_rng(CAMPAIGN_SEED, i), i)
        _coverage(s, run_scenario(s, spec), cov)
    for key in ("preemptions", "resumptions", "aborts of running requests", "aborts of waiting requests",
                "aborts of preempted requests", "finished: stopped", "finished: max_tokens",
                "finished: max_model_len"):
        assert cov.get(key, 0) > 0, f"no {key} in {CAMPAIGN_SIZE} scenarios: {cov}"


def test_config_agreement(vllm):
    accepted = rejected = 0
    for i in range(CONFIGS):
        raw = generate_config_dict(config_rng(CAMPAIGN_SEED, i), valid_bias=0.5)
        try:
            config_from_dict(raw)
            spec_ok = True
        except ConfigError:
            spec_ok = False
        try:
            vllm.reset(SchedulerConfig(**{k: (float(v) if k == "watermark" else v) for k, v in raw.items()}))
            vllm_ok = True
        except ValueError as e:
            vllm_ok = False
            assert "\n" not in str(e), "vLLM's rejection must be one line"
        assert spec_ok == vllm_ok, f"config {raw}: spec {'accepts' if spec_ok else 'rejects'}, " \
                                   f"vLLM {'accepts' if vllm_ok else 'rejects'}"
        accepted += spec_ok
        rejected += not spec_ok
    assert accepted > CONFIGS // 5 and rejected > CONFIGS // 5


def test_broken_spec_is_caught_against_vllm(vllm):
    """The differential check can fail: a spec without the watermark diverges
    from vLLM on the random campaign."""
    _, divergences = _campaign(vllm, NoWatermark(), 200, CAMPAIGN_SEED)
    assert divergences


def test_diff_command_against_vllm(vllm, tmp_path, capsys):
    rc = diff_main(["--impl", "vllm", "--scenarios", "20", "--seed", "3", "--json", "-o", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert report["scenarios"] == 20 and report["divergences"] == []
    assert report["steps_compared"] > 0 and set(report["ms_per_step"]) == {"vllm", "spec"}
    assert not any(tmp_path.iterdir())


def test_vllm_rejects_like_the_engine(vllm):
    """vLLM's start-up check, applied by the adapter, reads as one line."""
    with pytest.raises(ValueError) as e:
        vllm.reset(SchedulerConfig(max_model_len=64, block_size=16, num_gpu_blocks=4))
    assert "start-up" in str(e.value) and "\n" not in str(e.value)
    vllm.reset(SchedulerConfig(max_model_len=64, block_size=16, num_gpu_blocks=5))


# -- without vLLM --------------------------------------------------------------


def _trace(steps, error=None, summary=None):
    t = {"format": "schedspec.trace/1", "scenario": "x", "implementation": "i", "steps": steps}
    if error is not None:
        t["error"] = error
    elif summary is not None:
        t["summary"] = summary
    return t


def _step(k, **kw):
    base = {"step": k, "scheduled": [["a", 1]], "new": [], "resumed": [], "preempted": [], "finished": [],
            "running": ["a"], "waiting": [], "num_computed_tokens": {"a": k + 1}, "num_free_blocks": 5}
    base.update(kw)
    return base


def test_compare_traces_rules():
    s = {"steps": 1, "finished": 0, "unfinished": ["a"], "requests": {}}
    assert compare_traces(_trace([], error="x"), _trace([], error="y")) is None
    d = compare_traces(_trace([], error="x"), _trace([_step(0)], summary=s))
    assert d is not None and d.field == "error"
    assert compare_traces(_trace([_step(0)], summary=s), _trace([_step(0)], summary=s)) is None
    d = compare_traces(_trace([_step(0)], summary=s), _trace([_step(0), _step(1)], summary=s))
    assert d is not None and d.field == "steps"
    d = compare_traces(_trace([_step(0, num_computed_tokens={"a": 3})], summary=s), _trace([_step(0)], summary=s))
    assert d is not None and (d.step, d.field, d.a, d.b) == (0, "num_computed_tokens.a", 3, 1)
    # A field only one side reports (an implementation without a KV pool) is not compared.
    no_pool = _step(0)
    del no_pool["num_free_blocks"]
    assert compare_traces(_trace([no_pool], summary=s), _trace([_step(0, num_free_blocks=9)], summary=s)) is None
    d = compare_traces(_trace([_step(0)], summary=s), _trace([_step(0)], summary={**s, "finished": 1}))
    assert d is not None and d.field == "summary.finished"


def test_broken_spec_is_caught_and_shrunk(tmp_path):
    spec = SpecScheduler()
    for broken in (NoWatermark(), ReversedPreemptions()):
        found = None
        for i in range(300):
            s = generate_scenario(scenario_rng(CAMPAIGN_SEED, i), i)
            d = compare_traces(run_scenario(s, broken), run_scenario(s, spec))
            if d is not None:
                found = (s, d)
                break
        assert found is not None, f"{broken.name} was not caught"
        s, d = found
        small, sd = shrink(s, broken, spec, d, budget_s=30)
        assert isinstance(sd, Divergence)
        assert len(small.requests) <= len(s.requests) and small.max_steps <= s.max_steps
        assert compare_traces(run_scenario(small, broken), run_scenario(small, spec)) is not None


def test_diff_command_exit_codes_and_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(loader_module.BUILTIN_IMPLS, "broken", f"{__name__}:NoWatermark")
    out = tmp_path / "div"
    # --workers 1: "broken" is registered in this process only, which worker processes would not see.
    rc = diff_main(["--impl", "broken", "--scenarios", "40", "--seed", str(CAMPAIGN_SEED), "-o", str(out),
                    "--shrink-seconds", "5", "--workers", "1"])
    text = capsys.readouterr().out
    assert rc == 1 and "DIVERGENCE" in text
    minimal = sorted(out.glob("*-min.json"))
    assert minimal
    data = json.loads(minimal[0].read_text())
    assert f"schedspec diff --impl broken {minimal[0]}" in data["description"]
    before = {p: p.read_text() for p in out.iterdir()}
    # Reproduce from the written file: still diverges; nothing is overwritten.
    assert diff_main(["--impl", "broken", str(minimal[0]), "-o", str(out)]) == 1
    capsys.readouterr()
    assert all(p.read_text() == text_ for p, text_ in before.items())
    # Agreement exits 0; user errors exit 2 with one line.
    assert diff_main(["--impl", "spec", "--against", "broken", EXAMPLES[0].as_posix(), "-o", str(out)]) in (0, 1)
    capsys.readouterr()
    for argv in (["--impl", "broken", str(tmp_path / "missing.json")],
                 ["--impl", "broken"],
                 ["--impl", "nosuchimpl", "--scenarios", "1"],
                 ["--impl", "broken", "--scenarios", "0"]):
        with pytest.raises(SystemExit) as e:
            diff_main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("schedspec: error:")
