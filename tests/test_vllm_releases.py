"""Each vLLM release schedspec models, in its own environment
(`schedspec install-vllm --version X`): the adapter's bridges over vLLM's internal
API differences, one check per bridge, and the version gates' scenarios replayed on
the real release against the spec.

A release whose environment is missing is skipped with the install command as
the reason (0.33.0 is also found in this interpreter, .venv).  Each check runs in
the release's interpreter, a subprocess: vLLM's releases cannot share a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import python_of
from schedspec.spec.versions import RELEASES, release_key

ROOT = Path(__file__).resolve().parents[1]
CHANGES = sorted((ROOT / "docs" / "changes").glob("*.json"))

# Run inside release X's interpreter: what each bridge found, as JSON.
PROBE = r'''
import json, sys
from schedspec.reference import vllm_adapter as va
from schedspec.reference.vllm_lift import lift_state
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.request import RequestStatus
from schedspec.spec.input_processor import make_request

release = sys.argv[1]
impl = va.VllmScheduler()
v = va.import_vllm()
out = {"version": impl.vllm_version}
from vllm.platforms import current_platform
from vllm.platforms.cpu import CpuPlatform
out["cpu_platform"] = isinstance(current_platform, CpuPlatform)
out["check_module"] = va.import_check_enough_kv_cache_memory().__module__
cfg = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, num_gpu_blocks=20,
                      vllm_version=release)
out["active_seqs_default"] = "max_num_active_seqs" in va.scheduler_config_kwargs(v, cfg)
try:
    impl.reset(SchedulerConfig(max_num_active_seqs=2, vllm_version=release))
    out["active_seqs"] = "taken"
except ValueError as e:
    out["active_seqs"] = str(e)
# the VLLMError type
try:
    v["SamplingParams"](max_tokens=0)
    out["validation"] = "accepted"
except va.validation_errors() as e:
    out["validation"] = "ValueError" if isinstance(e, ValueError) else "VLLMError"
# finish_requests' answer, raw and bridged
impl.reset(cfg)
impl.add_request(make_request(cfg, "a", 5, 3))
raw = impl.sched.finish_requests(["a"], v["RequestStatus"].FINISHED_ABORTED)
out["finish_raw"] = type(raw[0]).__name__
impl.reset(cfg)
impl.add_request(make_request(cfg, "b", 5, 3))
out["finished"] = impl.finish_requests(["b", "zz"], RequestStatus.FINISHED_ABORTED)
# async: the batch queue of two, prefix caching: the block hasher
import dataclasses
acfg = dataclasses.replace(cfg, async_scheduling=True, enable_prefix_caching=True)
impl.reset(acfg)
out["batches"] = va.max_concurrent_batches(impl._vllm_config)
out["has_max_concurrent_batches"] = hasattr(impl._vllm_config, "max_concurrent_batches")
impl.add_request(make_request(acfg, "c", 40, 3, prompt_token_ids=tuple(range(3, 43))))
o = impl.schedule()
out["scheduled"] = [list(x) for x in o.num_scheduled_tokens]
state = impl.observe()
out["block_hashes"] = len(state.requests["c"].block_hashes)
out["waiting_lifted"] = list(state.waiting)
out["has_kv_holding_waiting"] = hasattr(impl.sched, "kv_holding_waiting")
out["lift_version"] = state.config.vllm_version
# The model runner's output (runner_index): req_id_to_index up to 0.33.0.
out["runner_index"] = sorted(va.runner_index(v["ModelRunnerOutput"], ["x"]))
# The Triton check (triton_presumed): HAS_TRITON as found once the config is built.
import vllm.triton_utils
out["has_triton_after"] = bool(vllm.triton_utils.HAS_TRITON)
# A preempted request admitted again (lift_output): among the resumed requests up to
# 0.33.0, among the new ones from 0.34.0 (spec/versions.py RESUMED_SENT_AS_NEW).
from schedspec.reference.engine import run_scenario
from schedspec.reference.example_files import EXAMPLES_DIR
from schedspec.reference.scenario import scenario_from_json
data = json.loads((EXAMPLES_DIR / "preemption.json").read_text())
data["config"]["vllm_version"] = release
trace = run_scenario(scenario_from_json(data), impl)
out["r1_admitted"] = [("new" if "r1" in st["new"] else "resumed") for st in trace["steps"]
                      if "r1" in st["new"] or "r1" in st["resumed"]]
# A request that skips prefix-cache reads (vllm_lift._shared_of): its flag lifts.
pcfg = dataclasses.replace(cfg, enable_prefix_caching=True)
impl.reset(pcfg)
impl.add_request(make_request(pcfg, "d", 20, 3, prompt_token_ids=tuple(range(3, 23))))
r = impl.sched.requests["d"]
if hasattr(r, "prefix_cache_hit_limit"):
    r.prefix_cache_hit_limit = 0
else:
    r.skip_reading_prefix_cache = True
out["skip_lifted"] = impl.observe().requests["d"].skip_reading_prefix_cache
print("PROBE " + json.dumps(out))
'''


def run_in(release: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([str(python_of(release)), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def before(release: str, first: str) -> bool:
    return release_key(release) < release_key(first)


# Both tests of a release share one run of its interpreter (vLLM's import is most of
# a run's time): PROBE, then `schedspec diff` over docs/changes in the same process
# (four files: one worker, which runs inline).
DIFF = r'''
from schedspec.cli.main import main
print("DIFF_EXIT", main(sys.argv[2:]))
'''
_RUNS: dict[str, subprocess.CompletedProcess] = {}


def probe_and_diff(release: str) -> subprocess.CompletedProcess:
    if release not in _RUNS:
        _RUNS[release] = run_in(release, "-c", PROBE + DIFF, release, "diff", "--impl", f"vllm=={release}",
                                *map(str, CHANGES), "--no-shrink", "-o", str(ROOT / ".pytest-divergences"))
    return _RUNS[release]


@pytest.mark.parametrize("release", RELEASES)
def test_the_adapters_bridges_on_each_release(release):
    p = probe_and_diff(release)
    lines = [x for x in p.stdout.splitlines() if x.startswith("PROBE ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    got = json.loads(lines[0][6:])
    assert got["version"] == got["lift_version"] == release
    # CPU platform (vllm_adapter.select_cpu_platform): set by hand up to 0.25.0, found from 0.28.0.
    assert got["cpu_platform"] is True
    # The start-up check's home (import_check_enough_kv_cache_memory).
    assert got["check_module"] == ("vllm.v1.core.kv_cache_utils" if before(release, "0.33.0")
                                   else "vllm.v1.core.kv_cache_planning")
    # Fields (scheduler_config_kwargs): max_num_active_seqs from 0.31.0.
    # (left out at its default; any other value refused by the release itself).
    if before(release, "0.31.0"):
        assert "max_num_active_seqs" in got["active_seqs"] and "Unexpected keyword" in got["active_seqs"]
        assert got["active_seqs_default"] is False
    else:
        assert got["active_seqs"] == "taken" and got["active_seqs_default"] is True
    # finish_requests' answer (finished_ids): (id, client index) pairs before 0.28.0.
    assert got["finish_raw"] == ("tuple" if before(release, "0.28.0") else "Request")
    assert got["finished"] == ["b"]
    # VLLMError (validation_errors): SamplingParams' refusal is a ValueError up to 0.25.0.
    assert got["validation"] == ("ValueError" if before(release, "0.28.0") else "VLLMError")
    # Batch queue (max_concurrent_batches): the executor's rule in 0.20.0.
    assert got["batches"] == 2
    assert got["has_max_concurrent_batches"] is not before(release, "0.25.0")
    # Block hasher (request_block_hasher) and the lift's queues (kv_holding_waiting).
    assert got["scheduled"] == [["c", 40]] and got["block_hashes"] == 40 // 16
    assert got["waiting_lifted"] == []
    assert got["has_kv_holding_waiting"] is not before(release, "0.31.0")
    # The model runner's output (runner_index): req_id_to_index up to 0.33.0.
    assert got["runner_index"] == ([] if not before(release, "0.34.0") else ["req_id_to_index"])
    # The Triton check (triton_presumed): never left presented as present.
    assert got["has_triton_after"] is False
    # A resumed request (lift_output): sent as new from 0.34.0; the first admission is new.
    assert got["r1_admitted"][0] == "new" and len(got["r1_admitted"]) >= 2
    assert set(got["r1_admitted"][1:]) == {"resumed" if before(release, "0.34.0") else "new"}
    # Prefix-cache reads skipped (vllm_lift._shared_of): prefix_cache_hit_limit 0 from 0.34.0.
    assert got["skip_lifted"] is True


@pytest.mark.parametrize("release", RELEASES)
def test_every_gate_scenario_replays_on_each_release_as_the_spec_says(release):
    """Each docs/changes scenario tells two releases apart on the spec; the real
    release must schedule it as the spec modelling that release does."""
    assert CHANGES
    p = probe_and_diff(release)
    assert p.returncode == 0 and "DIFF_EXIT 0" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
    assert f"scenarios: {len(CHANGES)}" in p.stdout and "divergences: 0" in p.stdout
