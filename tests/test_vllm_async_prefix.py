"""The real vLLM 0.33.0 scheduler with `enable_prefix_caching` and `async_scheduling`
against the spec, step for step (reference/vllm_adapter.py).

Hand scenarios, each run under all four flag combinations, must give equal
traces and equal states after every step: the block pool block by block (free
queue order, reference counts, which blocks share a hash, each request's block
table) and every request's counters, async ones included.  The hash values
themselves differ (vLLM's digests, the spec's token tuples), so the pools are
compared on which blocks carry a hash and which share one.

The vLLM tests skip when vLLM is not installed (`schedspec install-vllm`), unless
SCHEDSPEC_REQUIRE_VLLM=1 or CI=true, where they fail instead (tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, generate_scenario, scenario_rng
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.properties import check_step
from schedspec.spec.request import RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.versions import RESUMED_SENT_AS_NEW, has

FLAG_IDS = {(False, False): "sync", (True, False): "prefix", (False, True): "async", (True, True): "prefix+async"}


def _scenario(name: str, description: str, config: dict, requests: list, aborts: list = ()) -> dict:
    return {"format": "schedspec.scenario/1", "name": name, "description": description,
            "config": config, "requests": requests, "aborts": list(aborts)}


SCENARIOS = {s["name"]: s for s in (
    _scenario(
        "dup-same-step",
        "two identical 100-token prompts admitted in one step: the second hits the 6 full blocks the "
        "first cached on allocation and schedules 4 tokens",
        {"max_num_batched_tokens": 256, "max_num_seqs": 4, "max_model_len": 512, "block_size": 16,
         "num_gpu_blocks": 64, "enable_prefix_caching": True},
        [{"id": "a", "prompt_len": 100, "max_tokens": 5, "prefix_group": "g", "prefix_len": 100},
         {"id": "b", "prompt_len": 100, "max_tokens": 5, "prefix_group": "g", "prefix_len": 100}]),
    _scenario(
        "shared-system-prompt",
        "four requests share a 64-token system prompt (4 blocks); s1 (same step) and the later ones hit "
        "it; s3's prompt is exactly the shared prefix, so its block-aligned full hit recomputes the last "
        "block (48 of 64 tokens hit) and caches a second block with that hash",
        {"max_num_batched_tokens": 256, "max_num_seqs": 8, "max_model_len": 256, "block_size": 16,
         "num_gpu_blocks": 64, "enable_prefix_caching": True},
        [{"id": "s0", "prompt_len": 80, "max_tokens": 3, "prefix_group": "sys", "prefix_len": 64},
         {"id": "s1", "prompt_len": 70, "max_tokens": 3, "prefix_group": "sys", "prefix_len": 64},
         {"id": "s2", "arrival_step": 2, "prompt_len": 100, "max_tokens": 3, "prefix_group": "sys",
          "prefix_len": 64},
         {"id": "other", "arrival_step": 2, "prompt_len": 40, "max_tokens": 3},
         {"id": "s3", "arrival_step": 6, "prompt_len": 64, "max_tokens": 3, "prefix_group": "sys",
          "prefix_len": 64}]),
    _scenario(
        "resume-own-blocks",
        "block_size 4, 8 usable blocks: b's decode needs a 5th block, none is free, and b (the tail of "
        "running) preempts itself; its 4 full blocks (the last holding 2 output tokens) stay cached, a "
        "finishes in that step, and b resumes hitting all 4 of its own blocks (16 of its 17 tokens)",
        {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 32, "block_size": 4,
         "num_gpu_blocks": 9, "enable_prefix_caching": True},
        [{"id": "a", "prompt_len": 12, "max_tokens": 4},
         {"id": "b", "prompt_len": 14, "max_tokens": 6}]),
    _scenario(
        "eviction-pressure",
        "block_size 4, 12 usable blocks: x caches a 16-token system prompt and finishes; y takes the 8 "
        "never-used blocks, then x's last two cached blocks (a freed request's last blocks are evicted "
        "first), and its first decode x's 2nd block; z of x's group hits only x's first block (4 tokens), "
        "and w, arriving after z, hits the 4 blocks z cached (16 tokens)",
        {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 48, "block_size": 4,
         "num_gpu_blocks": 13, "enable_prefix_caching": True},
        [{"id": "x", "prompt_len": 16, "max_tokens": 1, "prefix_group": "g", "prefix_len": 16},
         {"id": "y", "arrival_step": 1, "prompt_len": 40, "max_tokens": 2},
         {"id": "z", "arrival_step": 2, "prompt_len": 20, "max_tokens": 2, "prefix_group": "g",
          "prefix_len": 16},
         {"id": "w", "arrival_step": 6, "prompt_len": 18, "max_tokens": 2, "prefix_group": "g",
          "prefix_len": 16}]),
    _scenario(
        "async-decode",
        "async scheduling: each decode is scheduled while the previous token is in flight; a stops at "
        "max_tokens 4 without an extra step (the async max_tokens guard: step 4 schedules an empty "
        "batch), b stops at EOS with one more of its batches already scheduled, whose output is dropped",
        {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
         "num_gpu_blocks": 32, "async_scheduling": True},
        [{"id": "a", "prompt_len": 10, "max_tokens": 4},
         {"id": "b", "arrival_step": 1, "prompt_len": 6, "max_tokens": 8, "output_len": 2}]),
    _scenario(
        "async-preempt-in-flight",
        "async scheduling, 4 usable blocks of 4: a's decode needs a third block and preempts b while b's "
        "decode is in flight; b's stale token is still applied, it is b's output_len-th, so b finishes "
        "(stopped) while it waits",
        {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 16, "block_size": 4,
         "num_gpu_blocks": 5, "async_scheduling": True},
        [{"id": "a", "prompt_len": 4, "max_tokens": 10},
         {"id": "b", "prompt_len": 4, "max_tokens": 10, "output_len": 5}]),
    _scenario(
        "async-abort-in-flight",
        "async scheduling: b is aborted at step 3 with its decode from step 2 in flight, whose output is "
        "dropped; c, chunked by the 8-token budget, is aborted at step 6 with its last chunk in flight",
        {"max_num_batched_tokens": 8, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
         "num_gpu_blocks": 32, "async_scheduling": True},
        [{"id": "a", "prompt_len": 5, "max_tokens": 6},
         {"id": "b", "prompt_len": 3, "max_tokens": 20},
         {"id": "c", "arrival_step": 4, "prompt_len": 12, "max_tokens": 4}],
        [{"id": "b", "step": 3}, {"id": "c", "step": 6}]),
)}


def load(name: str, flags: tuple[bool, bool] | None = None):
    s = scenario_from_json(SCENARIOS[name])
    if flags is not None:
        s = dataclasses.replace(s, config=dataclasses.replace(s.config, enable_prefix_caching=flags[0],
                                                             async_scheduling=flags[1]))
    return s


# -- comparing states -----------------------------------------------------------------

REQUEST_FIELDS = ("status", "num_computed_tokens", "num_output_tokens", "num_preemptions",
                  "num_output_placeholders", "num_in_flight_tokens", "num_stale_output_tokens",
                  "is_prefill_chunk")


def state_view(s) -> dict[str, Any]:
    """What two implementations must agree on after a step (hash values aside)."""
    view: dict[str, Any] = {
        "requests": {rid: {f: getattr(r, f) for f in REQUEST_FIELDS}
                     | {"num_block_hashes": len(r.block_hashes), "partial_block_token_ids": r.partial_block_token_ids}
                     for rid, r in sorted(s.requests.items())},
        "running": s.running, "waiting": s.waiting, "num_free_blocks": s.num_free_blocks,
        "req_to_num_blocks": dict(sorted(s.req_to_num_blocks.items())),
        "finished_req_ids": sorted(s.finished_req_ids),
    }
    p = s.block_pool
    if p is not None:
        view["pool"] = {
            "free_queue": p.free_queue(),
            "ref_cnt": dict(sorted(p.ref_cnt.items())),
            "hashed": sorted(p.block_hash),
            # which blocks share a hash, each group in lookup order
            "cached": sorted(p.cached.values()),
            "req_to_blocks": dict(sorted(p.req_to_blocks.items())),
            "num_cached_block": dict(sorted(p.num_cached_block.items())),
        }
    return view


def run_with_states(scenario, impl):
    states = []
    trace = run_scenario(scenario, impl, on_step=lambda t: states.append((t.step, state_view(t.after))))
    return trace, states


def first_state_difference(a, b) -> str | None:
    for (step, x), (_, y) in zip(a, b):
        for k in x:
            if x[k] != y[k]:
                inner = ""
                if isinstance(x[k], dict) and isinstance(y[k], dict):
                    kk = next(kk for kk in list(x[k]) + list(y[k]) if x[k].get(kk) != y[k].get(kk))
                    return f"step {step}, {k}.{kk}: {x[k].get(kk)!r} != {y[k].get(kk)!r}"
                return f"step {step}, {k}{inner}: {x[k]!r} != {y[k]!r}"
    if len(a) != len(b):
        return f"{len(a)} steps != {len(b)} steps"
    return None


def agree(vllm, scenario, spec=None) -> tuple[dict, str | None]:
    """Run both; the first difference (trace, then state), or None."""
    tv, sv = run_with_states(scenario, vllm)
    ts, ss = run_with_states(scenario, spec or SpecScheduler())
    d = compare_traces(tv, ts)
    if d is not None:
        return tv, d.describe()
    return tv, first_state_difference(sv, ss)


def steps_of(trace) -> dict[int, dict]:
    return {r["step"]: r for r in trace["steps"]}


# -- the hand scenarios ------------------------------------------------------------------


@pytest.mark.parametrize("flags", list(FLAG_IDS), ids=list(FLAG_IDS.values()))
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_hand_scenario_agrees_step_for_step(vllm, name, flags):
    trace, difference = agree(vllm, load(name, flags))
    assert "error" not in trace, trace.get("error")
    assert difference is None, difference
    assert ("prefix_hits" in trace["steps"][0]) == flags[0]
    assert ("schedule_called" in trace["steps"][0]) == flags[1]


def test_dup_same_step_hits_what_the_first_just_cached(vllm):
    t = steps_of(run_scenario(load("dup-same-step"), vllm))
    assert t[0]["scheduled"] == [["a", 100], ["b", 4]]
    assert t[0]["prefix_hits"] == {"a": 0, "b": 96}
    # 7 blocks for a, 6 shared with b plus b's own 7th: 8 of the 63 usable.
    assert t[0]["num_free_blocks"] == 63 - 8


def test_shared_system_prompt_saves_prefill(vllm):
    t = steps_of(run_scenario(load("shared-system-prompt"), vllm))
    assert t[0]["prefix_hits"] == {"s0": 0, "s1": 64}
    assert t[2]["prefix_hits"] == {"s2": 64, "other": 0}
    assert dict(t[2]["scheduled"])["s2"] == 36
    # A block-aligned full-prompt hit leaves its whole last block to compute.
    assert t[6]["prefix_hits"] == {"s3": 48} and t[6]["scheduled"] == [["s3", 16]]


def test_resumed_request_hits_its_own_blocks(vllm):
    t = steps_of(run_scenario(load("resume-own-blocks"), vllm))
    assert t[3]["preempted"] == ["b"] and t[3]["finished"] == [["a", "length"]]
    # Sent among the new requests from 0.34.0 (spec/versions.py RESUMED_SENT_AS_NEW).
    admitted_as = "new" if has(vllm.vllm_version, RESUMED_SENT_AS_NEW) else "resumed"
    assert t[4][admitted_as] == ["b"] and t[4]["prefix_hits"] == {"b": 16}
    assert t[4]["scheduled"] == [["b", 1]]


def test_eviction_takes_the_last_blocks_first(vllm):
    t = steps_of(run_scenario(load("eviction-pressure"), vllm))
    assert t[3]["new"] == ["z"] and t[3]["prefix_hits"] == {"z": 4}
    assert t[6]["prefix_hits"] == {"w": 16}
    # Without the eviction z would have hit the whole 16-token system prompt.
    alone = load("eviction-pressure")
    alone = dataclasses.replace(alone, requests=tuple(r for r in alone.requests if r.id != "y"))
    assert steps_of(run_scenario(alone, vllm))[2]["prefix_hits"] == {"z": 16}


def test_async_decode_with_a_batch_in_flight(vllm):
    trace = run_scenario(load("async-decode"), vllm)
    t = steps_of(trace)
    assert [t[k]["applied_step"] for k in range(5)] == [None, 0, 1, 2, 3]
    assert t[1]["scheduled"] == [["a", 1], ["b", 6]]  # a's decode while its first token is in flight
    assert t[3]["finished"] == [["b", "stopped"]]
    assert t[4]["scheduled"] == [] and t[4]["schedule_called"] and t[4]["finished"] == [["a", "length"]]
    assert trace["summary"]["requests"]["a"]["num_output_tokens"] == 4


def test_async_preemption_applies_the_stale_token(vllm):
    trace = run_scenario(load("async-preempt-in-flight"), vllm)
    t = steps_of(trace)
    assert t[5]["preempted"] == ["b"] and t[5]["finished"] == [["b", "stopped"]]
    assert "b" in t[5]["sampled"] and t[5]["waiting"] == []
    assert trace["summary"]["requests"]["b"]["num_output_tokens"] == 5


def test_async_abort_drops_the_in_flight_output(vllm):
    trace = run_scenario(load("async-abort-in-flight"), vllm)
    t = steps_of(trace)
    assert t[3]["finished"] == [["b", "aborted"]] and t[3]["sampled"] == ["a"]
    assert t[6]["finished"][0] == ["c", "aborted"] and "c" not in t[6]["sampled"]
    assert trace["summary"]["requests"]["c"]["num_output_tokens"] == 0


def test_every_property_holds_on_vllm(vllm):
    """The spec's properties judge vLLM's own steps, read through observe()."""
    for name in SCENARIOS:
        for flags in FLAG_IDS:
            failed = []

            def on_step(t):
                failed.extend((t.step, p, v.detail) for p, v in check_step(t.before, t.output, t.after).items()
                              if not v.holds)

            run_scenario(load(name, flags), vllm, on_step=on_step)
            assert not failed, f"{name} {FLAG_IDS[flags]}: {failed[:3]}"


def test_random_scenarios_with_both_flags_agree(vllm):
    seen = set()
    for i in range(32):
        s = generate_scenario(scenario_rng(23, i), i, FLAGS_ALL)
        seen.add((s.config.enable_prefix_caching, s.config.async_scheduling))
        _, difference = agree(vllm, s)
        assert difference is None, f"random scenario {i} of seed 23: {difference}"
    assert seen == set(FLAG_IDS)


# -- the comparison can fail ---------------------------------------------------------------


class NoSharing(SpecScheduler):
    """A broken spec: every prompt gets its own tokens, so nothing is ever hit."""

    name = "broken-no-sharing"

    def add_request(self, request):
        own = 5000 + len(self.state.requests)  # a first token no other prompt has
        tokens = (own,) + request.prompt_token_ids[1:] if request.prompt_token_ids else ()
        super().add_request(make_request(self.state.config, request.request_id, request.num_prompt_tokens,
                                         request.max_tokens, request.priority, request.arrival_time,
                                         tokens if self.state.config.enable_prefix_caching else None))


class ForwardFree(SpecScheduler):
    """A broken spec: a finished request's blocks join the free queue in forward
    order, so the wrong cached block is evicted first (only the pool state shows it)."""

    name = "broken-forward-free"

    def update_from_output(self, output, sampled):
        from schedspec.spec import block_pool

        original = block_pool.PoolWork.free

        def free(pool, request_id):
            pool.req_to_blocks[request_id] = tuple(reversed(pool.req_to_blocks.get(request_id, ())))
            return original(pool, request_id)

        block_pool.PoolWork.free = free
        try:
            return super().update_from_output(output, sampled)
        finally:
            block_pool.PoolWork.free = original


class DropStale(SpecScheduler):
    """A broken spec: the output of a request preempted meanwhile is dropped."""

    name = "broken-drop-stale"

    def update_from_output(self, output, sampled):
        sampled = {rid: t for rid, t in sampled.items()
                   if self.state.requests.get(rid) is None
                   or self.state.requests[rid].status != RequestStatus.PREEMPTED}
        return super().update_from_output(output, sampled)


@pytest.mark.parametrize("broken, name, flags", [
    (NoSharing, "dup-same-step", (True, False)),
    (ForwardFree, "eviction-pressure", (True, True)),
    (DropStale, "async-preempt-in-flight", (False, True)),
], ids=["no-sharing", "forward-free", "drop-stale"])
def test_a_broken_spec_is_caught(vllm, broken, name, flags):
    _, difference = agree(vllm, load(name, flags), spec=broken())
    assert difference is not None


# -- the adapter ----------------------------------------------------------------------


def _config(**kw) -> SchedulerConfig:
    base = dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, block_size=4, num_gpu_blocks=32)
    return SchedulerConfig(**{**base, **kw})


@pytest.mark.parametrize("flags", list(FLAG_IDS), ids=list(FLAG_IDS.values()))
def test_reset_builds_the_scheduler_vllm_would(vllm, flags):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    vllm.reset(_config(enable_prefix_caching=flags[0], async_scheduling=flags[1]))
    # The CPU platform's switch-off of async scheduling does not stick.
    assert type(vllm.sched) is (AsyncScheduler if flags[1] else Scheduler)
    assert vllm._vllm_config.max_concurrent_batches == (2 if flags[1] else 1)
    assert vllm.sched.kv_cache_manager.enable_caching == flags[0]
    state = vllm.observe()
    assert (state.block_pool is not None) == flags[0]
    if flags[0]:
        assert state.block_pool.free_queue() == tuple(range(1, 32))  # the null block is never free


def test_update_from_output_takes_the_batch_it_is_given(vllm):
    c = _config(async_scheduling=True)
    vllm.reset(c)
    vllm.add_request(make_request(c, "a", 5, 3))
    first = vllm.schedule()
    second = vllm.schedule()  # a's decode, its first token still in flight
    assert first.scheduled == {"a": 5} and second.scheduled == {"a": 1}
    assert vllm.observe().requests["a"].num_output_placeholders == 2
    assert vllm.update_from_output(first, {"a": [100]}) == []
    r = vllm.observe().requests["a"]
    assert (r.num_output_tokens, r.num_output_placeholders, r.num_in_flight_tokens) == (1, 1, 1)
    with pytest.raises(RuntimeError):
        vllm.update_from_output(first, {"a": [100]})  # already applied
    with pytest.raises(RuntimeError):
        vllm.update_from_output(dataclasses.replace(second), {"a": [100]})  # not one it returned


def test_prefix_hits_only_with_caching(vllm):
    for caching in (False, True):
        c = _config(enable_prefix_caching=caching)
        vllm.reset(c)
        tokens = tuple(range(10, 19)) if caching else None
        for rid in ("a", "b"):
            vllm.add_request(make_request(c, rid, 9, 2, prompt_token_ids=tokens))
        out = vllm.schedule()
        assert out.prefix_hits == ((("a", 0), ("b", 8)) if caching else ())
        assert out.scheduled == ({"a": 9, "b": 1} if caching else {"a": 9, "b": 9})
