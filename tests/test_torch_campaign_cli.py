"""`schedspec diff` with torch as one side: batched campaigns, divergence files,
shrinking with torch at S = 1, and the --device flag on run, check and diff."""

import copy
import dataclasses
import json
import sys

import pytest
import torch
from schedspec.reference.scenario import load_scenario

from schedspec.reference.example_files import EXAMPLES_DIR

from helpers import assert_one_line_error, cli

@pytest.fixture
def batch_calls(monkeypatch):
    """Record the size of every run_batch_traces call (the campaign must batch)."""
    from schedspec.gpu import batch

    sizes = []
    real = batch.run_batch_traces

    def spy(scenarios, **kw):
        sizes.append(len(scenarios))
        return real(scenarios, **kw)

    monkeypatch.setattr(batch, "run_batch_traces", spy)
    return sizes


def test_batched_campaign_agrees(capsys, tmp_path, batch_calls):
    rc, out, err = cli(capsys, "diff", "--impl", "torch", "--scenarios", 50, "--seed", 3, "--batch-size", 20,
                       "--device", "cpu", "-o", tmp_path / "div", "--json")
    assert rc == 0, out + err
    report = json.loads(out)
    assert report["scenarios"] == 50 and report["divergences"] == []
    assert report["steps_compared"] > 1000
    assert report["coverage"].get("preemptions", 0) > 0
    assert batch_calls == [20, 20, 10]
    assert not (tmp_path / "div").exists()
    # every torch trace agreed as text: none was parsed into dicts
    assert report["torch_traces_parsed"] == 0


def _break_free_blocks_after_preemption(trace):
    """A plausible bug: after the first preemption the pool reports one block too few."""
    t = copy.deepcopy(trace)
    broken = False
    for st in t.get("steps", []):
        broken |= bool(st["preempted"])
        if broken:
            st["num_free_blocks"] -= 1
    return t, broken


@pytest.mark.long
def test_divergence_is_reported_written_and_shrunk(capsys, tmp_path, monkeypatch):
    from schedspec.gpu import batch, impl
    from schedspec.gpu.trace_text import TorchTrace

    real_batch = batch.run_batch_traces
    hit = []

    def broken_batch(scenarios, **kw):
        out = []
        for tr in real_batch(scenarios, **kw):
            tr, broken = _break_free_blocks_after_preemption(tr.to_dict())
            hit.append(broken)
            out.append(TorchTrace.from_dict(tr))
        return out

    # The same bug at S = 1, which the shrinker drives.
    real_observe = impl.TorchScheduler.observe

    def broken_observe(self):
        state = real_observe(self)
        if getattr(self, "_test_preempted", False) or any(r.num_preemptions for r in state.requests.values()):
            self._test_preempted = True
            kv = state.kv_cache
            return dataclasses.replace(state, kv_cache=dataclasses.replace(kv, num_free_blocks=kv.num_free_blocks - 1))
        return state

    real_reset = impl.TorchScheduler.reset

    def reset(self, config):
        self._test_preempted = False
        return real_reset(self, config)

    monkeypatch.setattr(batch, "run_batch_traces", broken_batch)
    monkeypatch.setattr(impl.TorchScheduler, "observe", broken_observe)
    monkeypatch.setattr(impl.TorchScheduler, "reset", reset)
    outdir = tmp_path / "div"
    rc, out, err = cli(capsys, "diff", "--impl", "torch", "--scenarios", 12, "--seed", 3, "--device", "cpu",
                       "-o", outdir, "--shrink-seconds", 8)
    assert rc == 1, out + err
    assert any(hit), "seed 3's first 12 scenarios should preempt"
    assert f"divergences: {sum(hit)}" in out
    assert "field num_free_blocks" in out
    first = hit.index(True)
    written = outdir / f"random-s3-{first}.json"
    assert f"DIVERGENCE in random-s3-{first}: " in out and str(written) in out
    s = load_scenario(written)
    assert "Reproduce: schedspec diff --impl torch " in s.description
    small = load_scenario(outdir / f"random-s3-{first}-min.json")
    assert len(small.requests) <= len(s.requests) and small.max_steps <= s.max_steps
    assert (len(small.requests), small.max_steps) != (len(s.requests), s.max_steps)
    assert "schedspec diff --impl torch" in small.description


def test_a_crashing_scenario_is_a_divergence_not_the_end(capsys, tmp_path, monkeypatch):
    from schedspec.gpu import batch

    real = batch.run_batch_traces

    def crash_on_3(scenarios, **kw):
        if any(s.name == "random-s5-3" for s in scenarios):
            raise RuntimeError("boom")
        return real(scenarios, **kw)

    monkeypatch.setattr(batch, "run_batch_traces", crash_on_3)
    rc, out, _err = cli(capsys, "diff", "--impl", "torch", "--scenarios", 6, "--seed", 5, "-o", tmp_path,
                       "--device", "cpu", "--json")
    assert rc == 1
    report = json.loads(out)
    assert [d["scenario"] for d in report["divergences"]] == ["random-s5-3"]
    assert report["divergences"][0]["field"] == "crash" and "boom" in report["divergences"][0]["torch"]


def test_spec_against_torch_on_files(capsys, tmp_path):
    rc, out, err = cli(capsys, "diff", "--impl", "spec", "--against", "torch", EXAMPLES_DIR / "preemption.json",
                       "table3-b16", "-o", tmp_path)
    assert rc == 0, out + err
    assert "scenarios: 2" in out and "divergences: 0" in out


def test_vllm_against_torch(capsys, tmp_path):
    pytest.importorskip("vllm")
    rc, out, err = cli(capsys, "diff", "--impl", "vllm", "--against", "torch", "preemption", "-o", tmp_path)
    assert rc == 0, out + err
    assert "divergences: 0" in out


@pytest.mark.parametrize("args, words", [
    (("run", "table3-b8", "--device", "cpu"), ["--device cpu", "'spec'"]),
    (("check", "preemption", "--impl", "spec", "--device", "cpu"), ["--device cpu"]),
    (("diff", "--impl", "vllm", "--scenarios", "3", "--device", "cpu"), ["--device cpu", "'vllm'"]),
    (("run", "table3-b8", "--impl", "torch", "--device", "tpu"), ["--device"]),
    (("diff", "--impl", "torch", "--scenarios", "3", "--batch-size", "0"), ["--batch-size"]),
])
def test_device_errors(capsys, args, words):
    rc, _out, err = cli(capsys, *args)
    assert rc == 2
    last = err.strip().splitlines()[-1]  # argparse's own errors come after a usage block
    assert "Traceback" not in err, err
    for w in words:
        assert w in last, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("cmd", [("run", "table3-b8"), ("check", "preemption"), ("diff", "--scenarios", "2")])
def test_cuda_without_cuda_is_one_line_exit_2(capsys, cmd):
    rc, _out, err = cli(capsys, *cmd, "--impl", "torch", "--device", "cuda")
    assert_one_line_error(rc, err, "--device cuda", "CUDA is not available")


@pytest.mark.parametrize("cmd", [("diff", "--impl", "torch", "--scenarios", "2"), ("run", "table3-b8", "--impl", "torch"),
                                 ("sweep", "table3-b8", "--set", "max_num_seqs=4,8")])
def test_bad_trace_renderer_is_one_line_exit_2(capsys, monkeypatch, tmp_path, cmd):
    """$SCHEDSPEC_TRACE_RENDERER (gpu/trace_native.py) is checked before anything
    runs: a bad value, or `native` where the C extension is not built, is a
    usage error, not a crash of every scenario reported as divergences."""
    from schedspec.gpu import trace_native

    monkeypatch.chdir(tmp_path)
    try:
        monkeypatch.setenv(trace_native.RENDERER_ENV, "fast")
        trace_native.reset()
        rc, _out, err = cli(capsys, *cmd)
        assert_one_line_error(rc, err, "SCHEDSPEC_TRACE_RENDERER=fast", "auto, numpy, native")
        monkeypatch.setenv(trace_native.RENDERER_ENV, "native")
        monkeypatch.setitem(sys.modules, trace_native.EXTENSION, None)  # the import fails: not built
        trace_native.reset()
        rc, _out, err = cli(capsys, *cmd)
        assert_one_line_error(rc, err, "SCHEDSPEC_TRACE_RENDERER=native", "cannot be had")
        assert not (tmp_path / "divergences").exists()
    finally:
        monkeypatch.undo()
        trace_native.reset()


def test_run_and_check_on_torch_cpu(capsys):
    rc, out, err = cli(capsys, "run", "preemption", "--impl", "torch", "--device", "cpu")
    assert rc == 0, err
    assert out.startswith("# preemption on torch")
    rc, out, err = cli(capsys, "check", "preemption", "--impl", "torch", "--device", "cpu")
    assert rc == 0, err
    assert "0 violated" in out
