"""Prefix caching and async scheduling, rule by rule, on fixed scenarios.

Each test pins one rule of vLLM 0.33.0 that the spec models (the source lines are
in spec/block_pool.py and spec/scheduler.py); tests/test_vllm_async_prefix.py
replays such scenarios on vLLM itself."""

from __future__ import annotations

from schedspec.reference.coverage import resumptions
from schedspec.reference.engine import run_scenario
from schedspec.reference.loader import load_impl
from schedspec.reference.scenario import scenario_from_json
from schedspec.spec.properties import check_step


def run(config: dict, requests: list[dict], aborts=(), max_steps=400):
    scenario = scenario_from_json({"format": "schedspec.scenario/1", "name": "t", "config": config,
                                   "requests": requests, "aborts": list(aborts), "max_steps": max_steps})
    violations = []

    def on_step(t):
        violations.extend((t.step, n, v.detail) for n, v in check_step(t.before, t.output, t.after).items()
                          if not v.holds)

    trace = run_scenario(scenario, load_impl("spec"), on_step=on_step)
    assert "error" not in trace, trace.get("error")
    assert not violations, violations
    return trace


def step(trace, k):
    return next(s for s in trace["steps"] if s["step"] == k)


BIG = {"max_num_batched_tokens": 512, "max_num_seqs": 8, "max_model_len": 512, "block_size": 16,
       "num_gpu_blocks": 200, "enable_prefix_caching": True}


def test_same_step_duplicate_hits_blocks_cached_by_the_first():
    # vLLM test_prefix_caching_for_prefill_dedup: the first admission caches its full
    # blocks at allocation, so the second identical prompt hits 6 blocks (96 tokens).
    t = run(BIG, [{"id": "a", "prompt_len": 100, "max_tokens": 2, "prefix_group": "g", "prefix_len": 100},
                  {"id": "b", "prompt_len": 100, "max_tokens": 2, "prefix_group": "g", "prefix_len": 100}])
    s0 = step(t, 0)
    assert s0["scheduled"] == [["a", 100], ["b", 4]]
    assert s0["prefix_hits"] == {"a": 0, "b": 96}


def test_block_aligned_full_hit_recomputes_its_last_block():
    # 32 tokens cached: the hit is capped at 31 tokens, rounded down to 16.
    t = run(BIG, [{"id": "a", "prompt_len": 32, "max_tokens": 1, "prefix_group": "g", "prefix_len": 32},
                  {"id": "b", "arrival_step": 3, "prompt_len": 32, "max_tokens": 1, "prefix_group": "g",
                   "prefix_len": 32}])
    s3 = step(t, 3)
    assert s3["prefix_hits"] == {"b": 16} and s3["scheduled"] == [["b", 16]]


def test_shared_system_prompt_saves_prefill_tokens():
    reqs = [{"id": f"u{i}", "arrival_step": i, "prompt_len": 90 + i, "max_tokens": 3, "prefix_group": "sys",
             "prefix_len": 64} for i in range(4)]
    t = run(BIG, reqs)
    hits = {rid: h for s in t["steps"] for rid, h in s["prefix_hits"].items()}
    assert hits == {"u0": 0, "u1": 64, "u2": 64, "u3": 64}
    off = run({**BIG, "enable_prefix_caching": False}, reqs)
    granted = lambda tr: sum(n for s in tr["steps"] for _, n in s["scheduled"])
    assert granted(off) - granted(t) == 3 * 64


PREEMPT = {"max_num_batched_tokens": 160, "max_num_seqs": 16, "max_model_len": 160, "block_size": 16,
           "num_gpu_blocks": 11}
TWO_80 = [{"id": "r0", "prompt_len": 80, "max_tokens": 20}, {"id": "r1", "prompt_len": 80, "max_tokens": 20}]


def test_resumed_request_hits_its_own_cached_blocks():
    t = run({**PREEMPT, "enable_prefix_caching": True}, TWO_80)
    resumed = [s for s, back in zip(t["steps"], resumptions(t["steps"])) if back == ["r1"]]
    assert all(s["resumed"] == [] and "r1" in s["new"] for s in resumed)  # sent as new from 0.34.0
    assert len(resumed) == 1
    hit = resumed[0]["prefix_hits"]["r1"]
    # r0's decodes evicted r1's freed blocks tail first (they were freed in reverse),
    # so r1 keeps a leading run of its prompt's blocks.
    assert 0 < hit < 80 and hit % 16 == 0
    assert resumed[0]["scheduled"] == [["r1", 80 + 19 - hit]] or resumed[0]["scheduled"][0][0] == "r1"


def test_freed_blocks_are_evicted_tail_first():
    from schedspec.spec import scheduler as S
    from schedspec.spec.config import SchedulerConfig
    from schedspec.spec.request import RequestStatus
    from schedspec.spec.input_processor import make_request
    from schedspec.spec.state import SchedulerState

    c = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=48, block_size=16,
                        num_gpu_blocks=5, enable_prefix_caching=True)
    st = S.add_request(SchedulerState(c), make_request(c, "a", 48 - 1, 1, prompt_token_ids=[5] * 47))
    out, st = S.schedule(st)
    assert st.block_pool.req_to_blocks["a"] == (1, 2, 3)
    _, st = S.finish_requests(st, ["a"], RequestStatus.FINISHED_ABORTED)
    # Blocks 1 and 2 are full (hashed): LRU tail, last block first; block 3 is not: head.
    assert st.block_pool.free_queue() == (3, 4, 2, 1)


ASYNC = {**PREEMPT, "async_scheduling": True}


def test_async_decode_is_scheduled_while_its_token_is_in_flight():
    t = run({**BIG, "async_scheduling": True, "enable_prefix_caching": False},
            [{"id": "a", "prompt_len": 10, "max_tokens": 3}])
    assert [s["scheduled"] for s in t["steps"][:3]] == [[["a", 10]], [["a", 1]], [["a", 1]]]
    assert [s["applied_step"] for s in t["steps"][:3]] == [None, 0, 1]
    # max_tokens 3: the async guard schedules no 4th token (S:816-828); the last
    # batch is applied by a step that schedules nothing.
    assert t["summary"]["requests"]["a"]["num_output_tokens"] == 3
    assert all(n == 1 for s in t["steps"][1:] for _, n in s["scheduled"])
    assert sum(len(s["scheduled"]) for s in t["steps"]) == 3


def test_async_preempted_request_gets_its_in_flight_token_while_waiting():
    t = run(ASYNC, TWO_80)
    s1 = step(t, 1)
    assert s1["preempted"] == ["r1"] and s1["applied_step"] == 0
    assert t["summary"]["requests"]["r1"]["first_token_step"] == 1  # applied while it waited


def test_async_in_flight_token_can_finish_a_waiting_request():
    reqs = [{"id": "r0", "prompt_len": 80, "max_tokens": 20}, {"id": "r1", "prompt_len": 80, "max_tokens": 1}]
    t = run(ASYNC, reqs)
    s1 = step(t, 1)
    assert s1["preempted"] == ["r1"] and s1["finished"] == [["r1", "length"]]
    assert "r1" not in s1["waiting"]
    assert t["summary"]["requests"]["r1"]["num_preemptions"] == 1


def test_async_output_of_an_aborted_request_is_dropped():
    t = run({**BIG, "async_scheduling": True, "enable_prefix_caching": False},
            [{"id": "a", "prompt_len": 10, "max_tokens": 50}], aborts=[{"id": "a", "step": 3}])
    s3 = step(t, 3)
    assert s3["finished"] == [["a", "aborted"]] and s3["schedule_called"] is True
    assert t["summary"]["requests"]["a"]["num_output_tokens"] == 2  # batches 0-1 applied; 2 dropped


def test_stale_output_in_flight_keeps_a_preempted_request_waiting():
    """S:1123: a preempted request whose old output is still in flight is skipped, not
    admitted, even with room to spare.  With two batches in flight that output always
    returns in the step of the preemption, so only a deeper pipeline (here: three
    schedule() calls before any output) reaches this rule."""
    from schedspec.spec import scheduler as S
    from schedspec.spec.config import SchedulerConfig
    from schedspec.spec.request import RequestStatus
    from schedspec.spec.input_processor import make_request
    from schedspec.spec.state import SchedulerState

    c = SchedulerConfig(max_num_batched_tokens=160, max_num_seqs=16, max_model_len=160, block_size=16,
                        num_gpu_blocks=11, async_scheduling=True)
    st = SchedulerState(c)
    for rid in ("r0", "r1"):
        st = S.add_request(st, make_request(c, rid, 80, 20))
    batch0, st = S.schedule(st)  # both prefills
    batch1, st = S.schedule(st)  # r0's decode needs a 6th block: r1 is preempted
    assert batch1.preempted_req_ids == ("r1",) and st.requests["r1"].num_stale_output_tokens == 80
    _, st = S.finish_requests(st, ["r0"], RequestStatus.FINISHED_ABORTED)  # the pool is free again
    batch2, st = S.schedule(st)
    assert batch2.num_scheduled_tokens == () and st.waiting == ("r1",)  # skipped: output in flight
    _, st = S.update_from_output(st, batch0, {"r1": [100]})  # the stale token still counts
    assert st.requests["r1"].num_output_tokens == 1 and st.requests["r1"].num_stale_output_tokens == 0
    _, st = S.update_from_output(st, batch1, {})
    _, st = S.update_from_output(st, batch2, {})
    batch3, st = S.schedule(st)
    # sent among the new requests from 0.34.0 (versions.RESUMED_SENT_AS_NEW)
    assert batch3.scheduled_new_reqs == ("r1",) and batch3.scheduled_resumed_reqs == ()
    assert batch3.num_scheduled_tokens == (("r1", 81),)


def test_wave2_traces_follow_the_trace_schema():
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "reference" / "schemas" / "trace.schema.json")
                        .read_text())
    t = run({**ASYNC, "enable_prefix_caching": True}, TWO_80)
    jsonschema.validate(t, schema)
    assert all("prefix_hits" in s and "applied_step" in s and "schedule_called" in s for s in t["steps"])
