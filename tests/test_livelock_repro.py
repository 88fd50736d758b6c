"""scripts/livelock_repro.py reproduces the chunked-off resume livelock on vLLM 0.33.0
(proofs/LIVENESS.md, "Report: the chunked-off resume livelock"), and
reports none once the livelock's condition is removed, so this test can fail.

The script imports vLLM only, so it runs in a subprocess, as a maintainer runs it;
the four runs share one (its `main`, once per set of flags, its output caught), since
importing vLLM is most of a run's time.  The bad-input checks run the script itself.
The `--scenario blocks-queue` run is left out for time; tests/test_counterexample_vllm.py
replays that file on vLLM through schedspec's adapter.
Skips when vLLM is not installed, unless SCHEDSPEC_REQUIRE_VLLM=1 or CI=true (then
it fails), as tests/test_counterexample_vllm.py does.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import vllm_required

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "livelock_repro.py"
TIMEOUT_S = 120

DEFAULT_ENGINE = ["--scenario", "evicted-cache", "--enable-prefix-caching", "--async-scheduling", "--scale", "8"]
RUNS = {
    # The counterexample's config, after vLLM's own CLI parser has accepted its flags.
    "livelock": ["--check-cli"],
    # vLLM's defaults (prefix caching and async scheduling on) at block size 16.
    "default-engine": [*DEFAULT_ENGINE, "--check-cli"],
    # The condition removed, one way each: chunked prefill on, or a step budget of
    # max_model_len for a resumed request to replay in (S:1387-1394).
    "chunked-on": ["--enable-chunked-prefill"],
    "budget-max-model-len": ["--max-num-scheduled-tokens", "16"],
}


# Each run's (exit status, stdout, stderr), by name, from one interpreter.
DRIVER = r"""
import contextlib, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("livelock_repro", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
done = {}
for name, args in json.loads(sys.argv[2]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = script.main(args)
        except SystemExit as e:
            rc = e.code
    done[name] = [rc, out.getvalue(), err.getvalue()]
print("RUNS " + json.dumps(done))
"""


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess]:
    if importlib.util.find_spec("vllm") is None:  # finds the package without importing it
        if vllm_required():
            pytest.fail("vLLM is required here (SCHEDSPEC_REQUIRE_VLLM=1 or CI=true) but is not installed")
        pytest.skip("vLLM 0.33.0 is not installed; run `schedspec install-vllm`")
    try:
        p = subprocess.run([sys.executable, "-c", DRIVER, str(SCRIPT), json.dumps(RUNS)], cwd=ROOT, text=True,
                           capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the livelock_repro.py runs ran past {TIMEOUT_S} s")
    lines = [x for x in p.stdout.splitlines() if x.startswith("RUNS ")]
    assert p.returncode == 0 and lines, p.stdout[-2000:] + p.stderr[-3000:]
    return {name: subprocess.CompletedProcess([str(SCRIPT), *RUNS[name]], rc, out, err)
            for name, (rc, out, err) in json.loads(lines[-1][5:]).items()}


def test_livelock_reproduces(runs):
    r = runs["livelock"]
    assert r.returncode == 0, r.stdout + r.stderr
    # The counterexample's run, step for step (tests/counterexamples/liveness-finishes-resume.json):
    # r1 is preempted in step 3 with 7 prompt + 2 output tokens and never comes back.
    assert "step   3   1 tok  r0:1 | PREEMPTED r1 | finished r0(FINISHED_LENGTH_CAPPED)" in r.stdout
    assert "LIVELOCK: the scheduler state before step 5 equals the state before step 4" in r.stdout
    repeating = "waiting=['r1'] running=[] free_blocks=9; r1 PREEMPTED computed=0 tokens=9 outputs=2"
    assert f"  repeating state: {repeating}" in r.stdout
    # Every step from 4 on starts from that state and grants nothing.
    for t in (4, 5, 6):
        assert f"step {t:3d}   0 tok  - | {repeating}" in r.stdout
    assert "never finishes: r1 (PREEMPTED, 2 of 3 outputs): needs 9 tokens in one step" in r.stdout
    assert "> token budget 8 with chunked prefill off" in r.stdout


def test_cli_accepts_the_flags(runs):
    r = runs["livelock"]
    assert ("# vLLM's own CLI parser and config checks accept: vllm serve MODEL --no-enable-chunked-prefill "
            "--max-num-scheduled-tokens 8 --max-model-len 16") in r.stdout, r.stdout + r.stderr


def test_livelock_on_the_default_engine(runs):
    """Prefix caching does not save the request once its cached blocks are evicted,
    and the AsyncScheduler has the same rule."""
    r = runs["default-engine"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--max-num-scheduled-tokens 64 --max-model-len 128" in r.stdout
    assert "--block-size 16" in r.stdout and "--enable-prefix-caching --async-scheduling" in r.stdout
    assert "(AsyncScheduler)" in r.stdout
    assert "LIVELOCK: the scheduler state before step 106 equals the state before step 105" in r.stdout
    assert ("never finishes: r1 (PREEMPTED, 25 of 48 outputs): needs 65 tokens in one step "
            "(num_tokens 81, prefix-cache hit 16, S:1356) > token budget 64") in r.stdout


@pytest.mark.parametrize("name", ["chunked-on", "budget-max-model-len"])
def test_no_livelock_without_its_condition(runs, name):
    r = runs[name]
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NO LIVELOCK: every request finished" in r.stdout
    assert "LIVELOCK:" not in r.stdout.replace("NO LIVELOCK:", "")


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--scenario", "nope"], "invalid choice"),
    (["--model", "/nonexistent"], "no config.json there"),
])
def test_bad_input_is_one_line(args, message):
    """Bad flags: exit 2, one line on stderr, no traceback (argparse fails before vLLM is imported)."""
    r = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
