"""vLLM's own core-scope (★) scheduler tests, re-expressed as scenarios run through
the engine (vLLM's own scheduler tests, restated as scenario -> outcome).  Their asserted outcomes are
checked on the traces, and every registered property is checked at every step.

Not here, because they are outside the synchronous core scope: the async-only
tests (`test_schedule_concurrent_batches`, placeholders), min_tokens, prefix
caching (`test_prefix_caching_*`, `test_scheduler_reset_prefix_cache`), blocked
waiting statuses (`test_prepend_skipped_requests_order`, mixed skipped types).
"""

from functools import lru_cache

import pytest

from conftest import vllm_required
from schedspec.reference.coverage import resumptions
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.spec.properties import check_step

# vLLM's tests/v1/core/utils.py create_scheduler defaults.
VLLM_TEST_CONFIG = {"max_num_seqs": 16, "max_num_batched_tokens": 8192, "max_model_len": 8192,
                    "block_size": 16, "num_gpu_blocks": 10000}


@lru_cache(maxsize=1)
def vllm_impl():
    """The real vLLM scheduler, when installed: every catalogue scenario is also
    diffed against it.  CI (CI=true) must have it."""
    try:
        from schedspec.reference.vllm_adapter import VllmScheduler

        return VllmScheduler()
    except ImportError:
        if vllm_required():
            raise
        return None


def run(requests, aborts=(), max_steps=200, **config):
    data = {"format": "schedspec.scenario/1", "name": "catalogue", "config": {**VLLM_TEST_CONFIG, **config},
            "requests": requests, "aborts": list(aborts), "max_steps": max_steps}
    violations = []

    def on_step(t):
        violations.extend((t.step, n, v.detail) for n, v in check_step(t.before, t.output, t.after).items()
                          if not v.holds)

    scenario = scenario_from_json(data)
    trace = run_scenario(scenario, SpecScheduler(), on_step=on_step)
    assert "error" not in trace, trace.get("error")
    assert violations == []
    vllm = vllm_impl()
    if vllm is not None:
        divergence = compare_traces(trace, run_scenario(scenario, vllm))
        assert divergence is None, str(divergence)
    return trace


def reqs(n, prompt_len=10, max_tokens=16, **kw):
    return [{"id": str(i), "prompt_len": prompt_len, "max_tokens": max_tokens, **kw} for i in range(n)]


def test_schedule():
    t = run(reqs(10), max_steps=1)
    s = t["steps"][0]
    assert s["new"] == [str(i) for i in range(10)] and s["resumed"] == []
    assert s["scheduled"] == [[str(i), 10] for i in range(10)]
    assert s["waiting"] == [] and s["running"] == [str(i) for i in range(10)]


def test_add_and_finish_requests():
    # test_add_requests / test_finish_request: abort one per step while nothing can run.
    t = run(reqs(10), aborts=[{"id": str(i), "step": i + 1} for i in range(10)], max_steps=12,
            max_num_seqs=1, max_num_batched_tokens=8192)
    assert [len(s["waiting"]) for s in t["steps"][:10]] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
    assert all(s["finished"] == [[str(i), "aborted"]] for i, s in enumerate(t["steps"][1:11]))


def test_schedule_concurrent_partial_requests():
    t = run(reqs(3, prompt_len=800), max_steps=3, max_num_batched_tokens=1024, max_model_len=1024,
            long_prefill_token_threshold=400)
    assert [dict(s["scheduled"]) for s in t["steps"]] == [
        {"0": 400, "1": 400, "2": 224}, {"0": 400, "1": 400, "2": 224}, {"0": 1, "1": 1, "2": 352}]


@pytest.mark.parametrize("chunked, new", [(True, {"0": 800, "1": 224}), (False, {"0": 800})])
def test_schedule_order(chunked, new):
    t = run([{"id": "0", "prompt_len": 800}, {"id": "1", "prompt_len": 800},
             {"id": "2", "prompt_len": 10}, {"id": "3", "prompt_len": 10}], max_steps=1,
            max_num_batched_tokens=1024, max_model_len=1024, max_num_seqs=3, enable_chunked_prefill=chunked)
    assert dict(t["steps"][0]["scheduled"]) == new


def test_preempt_when_a_decode_needs_a_block():
    # test_preempt_during_execution, synchronous: the tail r1 is preempted for r0's 6th block.
    t = run(reqs(2, prompt_len=80, max_tokens=3), max_steps=10, max_num_batched_tokens=160,
            max_model_len=160, num_gpu_blocks=11)
    s = t["steps"][1]
    assert s["preempted"] == ["1"] and s["running"] == ["0"] and s["num_computed_tokens"]["1"] == 0
    assert t["summary"]["requests"]["1"]["num_preemptions"] == 1
    assert t["summary"]["unfinished"] == []


def test_stop_via_update_from_output():
    t = run([{"id": "eos", "prompt_len": 4, "max_tokens": 5, "output_len": 1},
             {"id": "len", "prompt_len": 4, "max_tokens": 2}])
    r = t["summary"]["requests"]
    assert (r["eos"]["finish_reason"], r["eos"]["num_output_tokens"]) == ("stopped", 1)
    assert (r["len"]["finish_reason"], r["len"]["num_output_tokens"]) == ("length", 2)


def test_memory_leak():
    t = run(reqs(5, max_tokens=10))
    assert t["summary"]["unfinished"] == [] and t["steps"][-1]["num_free_blocks"] == 9999
    assert t["steps"][-1]["running"] == [] and t["steps"][-1]["num_computed_tokens"] == {}


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_stop_by_max_tokens(max_tokens):
    t = run(reqs(2, max_tokens=max_tokens))
    assert all(r["num_output_tokens"] == max_tokens for r in t["summary"]["requests"].values())
    total = sum(n for s in t["steps"] for _, n in s["scheduled"])
    assert total == 2 * (10 + max_tokens - 1)


def test_abort_one_per_step():
    # test_abort, synchronous: every request samples at step 0, so the i-th abort (at step i+1)
    # leaves its request with i+1 outputs (async vLLM reports i: its first token is still in flight).
    order = [0, 8, 3, 1, 6, 4, 2, 5, 7, 9]
    t = run(reqs(10, max_tokens=100), aborts=[{"id": str(r), "step": k + 1} for k, r in enumerate(order)])
    for k, r in enumerate(order):
        assert t["summary"]["requests"][str(r)]["num_output_tokens"] == k + 1
        assert t["summary"]["requests"][str(r)]["finish_reason"] == "aborted"


PRIORITY = {"policy": "priority"}


@pytest.mark.parametrize("priorities, arrivals, expected", [
    ([2, 0, 1], [0, 1, 2], ["1", "2", "0"]),  # basic ordering
    ([0, 0, 0], [3, 1, 2], ["1", "2", "0"]),  # arrival-time tiebreaker
    ([2, 1, 1, 0], [1, 3, 2, 4], ["3", "2", "1", "0"]),  # mixed
    ([0, 0, 0, 0], [4, 1, 3, 2], ["1", "3", "2", "0"]),  # fcfs fallback
])
def test_priority_ordering(priorities, arrivals, expected):
    t = run([{"id": str(i), "prompt_len": 10, "priority": p, "arrival_time": a}
             for i, (p, a) in enumerate(zip(priorities, arrivals))], max_steps=1, **PRIORITY)
    assert t["steps"][0]["new"] == expected


@pytest.mark.parametrize("priorities, arrivals, seqs, running, waiting", [
    ([3, 2, 0], [0, 1, 2], 1, ["2"], ["1", "0"]),  # victim selection
    ([0, 0, 0], [3, 1, 2], 1, ["1"], ["2", "0"]),  # equal priority
    ([3, 1, 2, 0], [0, 1, 2, 3], 1, ["3"], ["1", "2", "0"]),  # waiting queue order
    ([3, 1, 2, 0], [0, 1, 2, 3], 2, ["3", "1"], ["2", "0"]),  # limited slots
])
def test_priority_with_limited_slots(priorities, arrivals, seqs, running, waiting):
    t = run([{"id": str(i), "prompt_len": 10, "priority": p, "arrival_time": a}
             for i, (p, a) in enumerate(zip(priorities, arrivals))], max_steps=1,
            max_num_seqs=seqs, **PRIORITY)
    assert t["steps"][0]["running"] == running and t["steps"][0]["waiting"] == waiting


def test_priority_heap_property():
    prios = [5, 1, 7, 3, 0, 6, 2, 4]
    t = run([{"id": str(i), "prompt_len": 10, "max_tokens": 1, "priority": p} for i, p in enumerate(prios)],
            max_num_seqs=1, **PRIORITY)
    served = [s["new"][0] for s in t["steps"] if s["new"]]
    assert [prios[int(i)] for i in served] == sorted(prios)


def test_priority_no_preemption_when_space_available():
    t = run([{"id": "lo1", "prompt_len": 10, "priority": 5}, {"id": "lo2", "prompt_len": 10, "priority": 5},
             {"id": "hi", "prompt_len": 10, "priority": 0, "arrival_step": 1}], max_steps=2, **PRIORITY)
    s = t["steps"][1]
    assert s["new"] == ["hi"] and s["preempted"] == [] and len(s["running"]) == 3 and s["waiting"] == []


def test_priority_preemption_and_resumption_when_out_of_kv():
    # 5 blocks (4 usable), B=200, M=2: low runs; high is admitted; low is preempted although already
    # scheduled in that step (its grant refunded); after high finishes, low resumes with 30 + 2 tokens.
    t = run([{"id": "low", "prompt_len": 30, "max_tokens": 10, "priority": 1},
             {"id": "high", "prompt_len": 32, "max_tokens": 2, "priority": 0, "arrival_step": 1}],
            max_num_batched_tokens=200, max_num_seqs=2, max_model_len=64, num_gpu_blocks=5, **PRIORITY)
    steps = t["steps"]
    assert steps[1]["new"] == ["high"] and steps[1]["num_free_blocks"] == 0
    assert steps[2]["preempted"] == ["low"] and dict(steps[2]["scheduled"]) == {"high": 1}
    assert steps[2]["waiting"] == ["low"]
    resume = next(s for s, back in zip(steps, resumptions(steps)) if back)
    assert dict(resume["scheduled"])["low"] == 32  # the 30-token prompt plus its 2 outputs


CURSOR_SCENARIO = dict(
    requests=[{"id": "A", "prompt_len": 60, "priority": 9},
              {"id": "B", "prompt_len": 21, "priority": 0, "arrival_step": 1},
              {"id": "C", "prompt_len": 4, "priority": 1, "arrival_step": 1}],
    max_steps=30, max_num_batched_tokens=48, max_model_len=80, num_gpu_blocks=9,
    long_prefill_token_threshold=15, scheduler_reserve_full_isl=False, **PRIORITY)


def test_priority_scheduler_preempt_skipped_request():
    # test_priority_preemption_bug.py (#49206): running = [A, B, C]; B's block allocation
    # preempts A, which sits before the cursor; C must still be scheduled and RUNNING.
    t = run(**CURSOR_SCENARIO)
    step = next(s for s in t["steps"] if "A" in s["preempted"])
    assert t["steps"][step["step"] - 1]["running"] == ["A", "B", "C"]
    assert dict(step["scheduled"]) == {"B": 1, "C": 1} and step["running"] == ["B", "C"]
