"""The monitor's scope detection, tested feature by feature (monitor/scope.py).

For each feature the spec does not model, a real vLLM 0.33.0 scheduler or
request using it is built on the CPU, the way vLLM's own tests build one (a
SpeculativeConfig, a LoRA adapter on the request, a sliding-window KV group,
...), the scheduler calls are made under the monitor, and each call must be
counted *outside scope* with exactly the features expected, never compared:
no divergence, no monitor error.  Where a feature cannot be built on the CPU,
the attribute vLLM derives from it is set on a real scheduler instead, and the
case says so.

A plain run with no feature must be *checked* throughout (the classification
is not vacuous), and a guard test fails when scope.py gains a feature this file
has no case for.
"""

from __future__ import annotations

import json

import re
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from monitor_helpers import (LLAMA, MIXTRAL, assert_all_checked, assert_clean, build_scheduler, calls_seen,
                             full_attention, kv_groups, loading, monitor, prompt, request, require_vllm, run_to_completion,
                             runner_output, sampled_for, shadow_monitor, step, vllm_config)

require_vllm()

import torch  # noqa: E402
from vllm.v1.core.sched.interface import PauseState  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from mutants import Mutation, mutated  # noqa: E402
from schedspec.monitor import scope  # noqa: E402
from schedspec.reference import vllm_lift  # noqa: E402
from schedspec.monitor.shadow import ShadowAsyncScheduler, ShadowScheduler  # noqa: E402

__all__ = ["monitor", "shadow_monitor"]  # fixtures, imported for pytest


# -- the cases ----------------------------------------------------------------------------
#
# A case makes its setup calls (which must be in scope, or its own feature's),
# then `mon.begin(...)`, the calls under test, and returns `mon.end()` with the
# set of feature names those calls must be counted under.  The variant is
# "attribute" where the feature could not be built on the CPU and the attribute
# vLLM derives from it is set on a real scheduler instead.


class Case:
    def __init__(self, feature: str, variant: str, fn: Callable, companions: tuple[str, ...]):
        self.feature, self.variant, self.fn, self.companions = feature, variant, fn, companions

    @property
    def id(self) -> str:
        return f"{self.feature}-{self.variant}"

    def expected(self) -> set[str]:
        return {getattr(scope, self.feature)} | {getattr(scope, c) for c in self.companions}


CASES: list[Case] = []


def case(feature: str, variant: str = "real", *, companions: tuple[str, ...] = ()):
    """Register a case for scope.FEATURE.  `companions`: features that building
    this one in vLLM necessarily brings along (e.g. a delayed free needs a KV
    connector), which the call is then counted under as well."""
    def register(fn):
        CASES.append(Case(feature, variant, fn, companions))
        return fn
    return register


def watch(mon, calls: Callable[[], Any]) -> dict:
    mon.begin("case")
    try:
        calls()
    finally:
        stats = mon.end()
    return stats


def add_and_step(sched, *reqs):
    def calls():
        for r in reqs:
            sched.add_request(r)
        step(sched)
    return calls


def add_and_schedule(sched, *reqs):
    def calls():
        for r in reqs:
            sched.add_request(r)
        sched.schedule()
    return calls


# Scheduler-wide features: from the config the scheduler is built with.


@case("SPECULATIVE_DECODING", "dynamic_drafts")
def _(mon, tmp_path, monkeypatch):
    # A draft count chosen per batch size (S:323-329, 1764-1769): not modelled.
    from vllm.config import SpeculativeConfig

    s = build_scheduler(speculative_config=SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, prompt_lookup_min=1,
        num_speculative_tokens_per_batch_size=[(1, 4, 2), (5, 64, 1)]))
    return watch(mon, add_and_step(s, request("a", 20)))


def connector_scheduler(tmp_path, name: str = "ExampleConnector", role: str = "kv_both", **kw):
    """A scheduler with KV connector `name`: vLLM's ExampleConnector (storing in
    tmp_path, empty: it loads nothing), or one of monitor_helpers.CONNECTORS."""
    from vllm.config import KVTransferConfig

    extra = {} if name == "ExampleConnector" else {"kv_connector_module_path": "monitor_helpers"}
    s = build_scheduler(kv_transfer_config=KVTransferConfig(
        kv_connector=name, kv_role=role, kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
        **extra), **kw)
    assert s.connector is not None
    return s


@case("KV_LOAD_CAP")
def _(mon, tmp_path, monkeypatch):
    # 0.34.0's cap on asynchronous KV loads (max_num_inflight_kv_loads, C:78), which
    # sorts requests a connector may load asynchronously into their own queue and starts
    # their loads while the batch is full (S:1090-1113, 1325-1334, 2781-2786): not
    # modelled.  Before 0.34.0 the field does not exist: set on a real scheduler's config.
    from vllm.config import SchedulerConfig

    if "max_num_inflight_kv_loads" in SchedulerConfig.__dataclass_fields__:
        s = connector_scheduler(tmp_path, scheduler={"max_num_inflight_kv_loads": 1})
    else:
        s = connector_scheduler(tmp_path)
        object.__setattr__(s.scheduler_config, "max_num_inflight_kv_loads", 1)
    return watch(mon, add_and_step(s, request("a", 20, sched=s)))


@case("PREFIX_HIT_LIMIT")
def _(mon, tmp_path, monkeypatch):
    # 0.34.0's prompt-logprobs request that reads the prefix cache up to its first scored
    # prompt token (RQ:364-377 prefix_cache_hit_limit, prompt_logprob_start): not modelled
    # (the spec reads all of a hit or none).  Before 0.34.0 no such request exists: the
    # attribute is set on a real request.
    s = build_scheduler(prefix_caching=True)
    r = request("a", 40, sched=s, sampling={"prompt_logprobs": 1, "prompt_logprob_start": 16,
                                           "skip_reading_prefix_cache": False})
    if not hasattr(r, "prefix_cache_hit_limit"):
        r = request("a", 40, sched=s)
        r.prefix_cache_hit_limit = 16
    assert r.prefix_cache_hit_limit == 16
    return watch(mon, add_and_step(s, r))


@case("KV_CONNECTOR", "failed_load")
def _(mon, tmp_path, monkeypatch):
    # A load the worker reports failed (S:2334-2336, 3839-3852): not modelled.
    s = connector_scheduler(tmp_path, "OneBlockAsyncConnector")
    s.add_request(request("a", 40, sched=s))
    out = s.schedule()
    assert s.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return watch(mon, lambda: s.update_from_output(out, runner_output(out, {}, failed_recving=["a"])))


def abort_mid_load(s) -> None:
    """"a" and "b" load a block each; "a" is aborted mid-load, "b" after its load was
    reported: vLLM keeps "a", finished, and its blocks until its load ends
    (S:3153-3164, 3722-3727), and frees "b" at once."""
    s.add_request(request("a", 40, sched=s))
    s.add_request(request("b", 40, sched=s))
    out = s.schedule()
    assert {s.requests[x].status for x in "ab"} == {RequestStatus.WAITING_FOR_REMOTE_KVS}
    s.update_from_output(out, runner_output(out, {}, finished_recving=["b"]))
    s.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert s.requests["a"].is_finished() and "b" not in s.requests
    out = s.schedule()  # nothing to schedule; "a" still held
    s.update_from_output(out, runner_output(out, {}, finished_recving=["a"]))
    assert "a" not in s.requests


def test_an_abort_mid_load_is_compared(monitor, tmp_path):
    s = connector_scheduler(tmp_path, "OneBlockAsyncConnector")
    stats = watch(monitor, lambda: abort_mid_load(s))
    assert_all_checked(stats, "schedule", "update_from_output", "add_request", "finish_requests")
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == s.kv_cache_manager.block_pool.num_gpu_blocks - 1


def test_a_spec_freeing_at_once_diverges_from_an_abort_mid_load(monitor, tmp_path):
    s = connector_scheduler(tmp_path, "OneBlockAsyncConnector")
    with mutated([Mutation("kv_connector.hold_loading", "loading(w.requests[rid]) and not w.requests[rid].kv_load_finished",
                           "False")], module="kv_connector"):
        stats = watch(monitor, lambda: abort_mid_load(s))
    assert stats["divergences"], stats


@case("KV_CONNECTOR", "request_kv_transfer_params")
def _(mon, tmp_path, monkeypatch):
    # P/D parameters on the request (request.py:118-121), no connector built.
    s = build_scheduler()
    r = request("a", 20, sampling={"extra_args": {"kv_transfer_params": {"do_remote_prefill": False}}})
    assert r.kv_transfer_params
    return watch(mon, add_and_schedule(s, r))


@case("EC_CONNECTOR")
def _(mon, tmp_path, monkeypatch):
    from vllm.config import ECTransferConfig

    s = build_scheduler(ec_transfer_config=ECTransferConfig(
        ec_connector="ECExampleConnector", ec_role="ec_both",
        ec_connector_extra_config={"shared_storage_path": str(tmp_path)}))
    assert s.ec_connector is not None
    s.add_request(request("a", 20))
    out = s.schedule()
    # The connector can no longer obtain an encoder input of "a": vLLM finishes it
    # with an error (S:2626-2629).
    s.ec_connector.take_unavailable_requests = lambda: {"a"}
    stats = watch(mon, lambda: s.update_from_output(out, runner_output(out, {"a": [7]})))
    assert s.requests.get("a") is None
    return stats


def test_an_encoder_cache_connector_on_text_only_requests_leaves_its_calls_checked(monitor, tmp_path):
    """vLLM's ECExampleConnector acts on requests with encoder inputs only: a
    text-only run to completion is compared call by call (scope.ConnectorWatch)."""
    from vllm.config import ECTransferConfig

    s = build_scheduler(ec_transfer_config=ECTransferConfig(
        ec_connector="ECExampleConnector", ec_role="ec_both",
        ec_connector_extra_config={"shared_storage_path": str(tmp_path)}))
    stats = watch(monitor, lambda: (s.add_request(request("a", 20)), s.add_request(request("b", 30)),
                                    run_to_completion(s)))
    assert_all_checked(stats, "schedule", "update_from_output", "add_request")
    assert not set(scope.ConnectorWatch.EC) & s.ec_connector.__dict__.keys()


@case("ENCODER_DECODER", "attribute")
def _(mon, tmp_path, monkeypatch):
    # Not buildable on this CPU box: an encoder-decoder model (e.g. Whisper,
    # whose VllmConfig does build offline) needs its multimodal processor for the
    # scheduler's encoder budget (scheduler.py:255-270), and
    # WhisperMultiModalProcessor refuses to start without a tokenizer, which
    # cannot be fetched offline.  So the flag Scheduler.__init__ copies from
    # model_config.is_encoder_decoder (scheduler.py:118) is set on a real
    # scheduler, and both scope.features() and the monitored calls are checked.
    s = build_scheduler()
    s.is_encoder_decoder = True
    assert scope.features(s) == (scope.ENCODER_DECODER,)
    return watch(mon, add_and_step(s, request("a", 20)))


@case("KV_CACHE_GROUPS", "sliding_window")
def _(mon, tmp_path, monkeypatch):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    spec = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=32)
    s = build_scheduler(groups=kv_groups(spec))
    return watch(mon, add_and_step(s, request("a", 40)))


@case("KV_CACHE_GROUPS", "hybrid_full_and_sliding")
def _(mon, tmp_path, monkeypatch):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    swa = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=32)
    s = build_scheduler(groups=kv_groups(full_attention(16), swa), prefix_caching=True)
    return watch(mon, add_and_step(s, request("a", 40, sched=s)))


@case("HASH_BLOCK_SIZE", companions=("KV_CACHE_GROUPS",))
def _(mon, tmp_path, monkeypatch):
    # A hash block smaller than the block needs the hybrid coordinator
    # (UnitaryKVCacheCoordinator asserts they are equal): two full-attention
    # groups of 16- and 32-token blocks, scheduled in 32-token blocks and hashed
    # in 16-token ones, as resolve_kv_cache_block_sizes (kv_cache_utils.py:815)
    # gives them.
    s = build_scheduler(groups=kv_groups(full_attention(16), full_attention(32)), block_size=32,
                        hash_block_size=16, prefix_caching=True)
    return watch(mon, add_and_step(s, request("a", 40, sched=s)))


@case("PP_DECODE_STAGGER", "attribute")
def _(mon, tmp_path, monkeypatch):
    # Attribute set: the stagger needs async scheduling on the V2 model runner,
    # which needs Triton; it sets next_decode_eligible_step on the request
    # (async_scheduler.py:50-56), as here.
    s = build_scheduler(async_scheduling=True)
    s.add_request(request("a", 20, max_tokens=8))
    s.schedule()  # in scope: admitted, now running

    def calls():
        s.requests["a"].next_decode_eligible_step = s.current_step + 3
        s.schedule()
    return watch(mon, calls)


def test_ngram_speculative_decoding_is_in_scope(monitor):
    """An n-gram drafter (no rows of its own, no prefill lookahead) is what the spec
    models (spec/spec_decode.py), and so are drafts handed over by hand on a
    scheduler built without one (EngineCore.post_step, core.py:699-706)."""
    from vllm.config import SpeculativeConfig
    from vllm.v1.outputs import DraftTokenIds

    s = build_scheduler(speculative_config=SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, prompt_lookup_min=1))
    assert scope.features(s) == ()
    s.add_request(request("a", 20, max_tokens=8))
    step(s)
    s.update_draft_token_ids(DraftTokenIds(req_ids=["a"], draft_token_ids=[[7, 8]]))
    run_to_completion(s)
    plain = build_scheduler()
    plain.add_request(request("b", 20, max_tokens=8))
    step(plain)
    plain.update_draft_token_ids(DraftTokenIds(req_ids=["b"], draft_token_ids=[[7, 8]]))
    assert plain.requests["b"].spec_token_ids == [7, 8]
    # schedule() only: vLLM's spec-decode stats in update_from_output need a drafter (metrics.py:49).
    assert dict(plain.schedule().scheduled_spec_decode_tokens) == {"b": [7, 8]}
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_block_completed_and_freed_in_one_call_is_compared(monitor, async_scheduling):
    """A request whose last tokens complete a block and finish it in one
    update_from_output: the block is cached under a hash no request holds
    afterwards, paired with the spec's by the finished request's own hashes
    (check.hash_renaming's `gone`).  Found by vLLM's
    test_finished_spec_request_caches_completed_blocks, which drives the same."""
    from vllm.config import SpeculativeConfig
    from vllm.v1.outputs import DraftTokenIds

    s = build_scheduler(speculative_config=SpeculativeConfig(
        method="ngram_gpu", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1),
        prefix_caching=True, block_size=4, async_scheduling=async_scheduling)
    r = request("a", tokens=[0, 1], sched=s, max_tokens=4, sampling={"ignore_eos": True})
    s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, runner_output(out, {"a": [2]}))
    s.update_draft_token_ids(DraftTokenIds(req_ids=["a"], draft_token_ids=[[3, 4]]))
    out = s.schedule()
    s.update_from_output(out, runner_output(out, {"a": [3, 4, 5]}))
    assert r.is_finished() and s.kv_cache_manager.block_pool.cached_block_hash_to_block
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["counts", "prefix"])
def test_a_preemption_before_schedule_leaves_the_call_checked(monitor, prefix_caching):
    """A preemption between two schedule() calls (a direct _preempt_request, as
    vLLM's test_preemption_re_records_prefix_cache_query makes, or
    reset_prefix_cache with reset_running_requests) is reported in the next
    output too (S:226, 1853).  That call is compared on the preemptions it
    makes itself: here, after c is preempted by hand, a and b each need a third
    block and one is free, so b preempts itself in the call."""
    s = build_scheduler(prefix_caching=prefix_caching, block_size=16, num_blocks=6,  # 5 usable blocks
                        max_num_batched_tokens=128)
    for rid, n, first in (("a", 32, 1000), ("b", 32, 2000), ("c", 16, 3000)):
        s.add_request(request(rid, tokens=list(range(first, first + n)), sched=s, max_tokens=20,
                              sampling={"ignore_eos": True}))
    step(s)
    assert [r.request_id for r in s.running] == ["a", "b", "c"]
    s._preempt_request(s.running.pop(), 0.0)  # noqa: SLF001 - as vLLM's test does
    out = step(s)
    assert set(out.preempted_req_ids) == {"b", "c"}  # c from before the call, b from it
    for _ in range(4):
        step(s)
    assert s.reset_prefix_cache(reset_running_requests=True)
    out = step(s)
    assert out.preempted_req_ids  # those reset_prefix_cache preempted
    for _ in range(30):
        step(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["counts", "prefix"])
def test_stale_output_dropped_after_reset_prefix_cache_is_compared(monitor, prefix_caching):
    """reset_prefix_cache(reset_running_requests=True) preempts with output still
    in flight and drops that output when it returns (S:3333-3344, 2383-2385):
    the waiting loop does not wait for it (S:1123) and update_from_output
    appends nothing.  Every call after it is compared (spec: drop_stale_output)."""
    s = build_scheduler(async_scheduling=True, prefix_caching=prefix_caching)
    s.add_request(request("a", 20, sched=s, max_tokens=8, sampling={"ignore_eos": True}))
    first = s.schedule()
    assert s.reset_prefix_cache(reset_running_requests=True)
    r = s.requests["a"]
    assert r.drop_stale_output and r.num_stale_output_tokens == 20
    second = s.schedule()  # resumed at once: the stale output is not waited for
    assert "a" in second.num_scheduled_tokens
    s.update_from_output(first, runner_output(first, {"a": [100]}))
    assert r.num_output_tokens == 0 and r.num_stale_output_tokens == 0  # dropped, not appended
    s.update_from_output(second, runner_output(second, {"a": [101]}))
    assert r.num_output_tokens == 1
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_prompt_logprobs_read_no_cached_prefix_and_are_compared(monitor):
    """A request with prompt logprobs reads no cached prefix (RQ:359-371,
    K:251-253) but its blocks are cached for others: b, with a's prompt and
    prompt logprobs, gets no hit; c, with the same prompt, hits a's blocks."""
    s = build_scheduler(prefix_caching=True)
    tokens = list(range(500, 540))
    s.add_request(request("a", tokens=tokens, sched=s))
    run_to_completion(s)
    b = request("b", tokens=tokens, sched=s, sampling={"prompt_logprobs": 1})
    assert vllm_lift.skips_prefix_cache(b)  # 0.34.0: prefix_cache_hit_limit 0 (request.py:364-377)
    s.add_request(b)
    assert step(s).scheduled_new_reqs[0].num_computed_tokens == 0
    s.add_request(request("c", tokens=tokens, sched=s))
    assert step(s).scheduled_new_reqs[0].num_computed_tokens == 32
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_caching", "caching"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_pause_states_are_compared(monitor, async_scheduling, prefix_caching):
    """set_pause_state (S:3213): PAUSED_NEW runs what is running and admits no
    waiting request; PAUSED_ALL schedules nothing (S:739-741, 1066, 1102).
    Every call is compared, and unpausing admits the waiting request.  With
    prefix caching the comparison renames the spec's new block hashes to vLLM's
    (check.py `renamed`), which until 2026-12-04 rebuilt the state without its
    pause state (and cadence): a paused call that completed a block diverged.  a's
    30-token prompt fills its second 16-token block in the first paused step."""
    s = build_scheduler(async_scheduling=async_scheduling, prefix_caching=prefix_caching)
    s.add_request(request("a", 30, max_tokens=30, sampling={"ignore_eos": True}, sched=s))
    step(s)
    s.set_pause_state(PauseState.PAUSED_NEW)
    s.add_request(request("b", 20, max_tokens=4, sched=s))
    out = step(s)
    assert "b" not in out.num_scheduled_tokens and out.num_scheduled_tokens
    s.set_pause_state(PauseState.PAUSED_ALL)
    assert not step(s).num_scheduled_tokens
    s.set_pause_state(PauseState.UNPAUSED)
    assert "b" in step(s).num_scheduled_tokens
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_drop_mode_survives_a_preemption_in_schedule_while_undrained(monitor):
    """Drop mode survives a preemption inside schedule() while its stale share has
    not returned (S:1886-1888; spec/stale_output.py make_stale): after a reset, a
    is resumed at once, then preempted by x's decode, both batches still in
    flight; both of a's outputs are then discarded."""
    s = build_scheduler(async_scheduling=True, num_blocks=4, max_num_batched_tokens=128)  # 3 usable blocks
    s.add_request(request("x", tokens=list(range(100, 131)), max_tokens=20, sampling={"ignore_eos": True}))
    s.add_request(request("a", tokens=list(range(200, 216)), max_tokens=20, sampling={"ignore_eos": True}))
    first = s.schedule()
    assert dict(first.num_scheduled_tokens) == {"x": 31, "a": 16}
    assert s.reset_prefix_cache(reset_running_requests=True)
    second = s.schedule()  # both resumed in drop mode, their first output still in flight
    assert dict(second.num_scheduled_tokens) == {"x": 31, "a": 16}
    third = s.schedule()  # x's next token needs a third block: a, the tail, is preempted
    a = s.requests["a"]
    assert third.preempted_req_ids == {"a"} and a.drop_stale_output and a.num_stale_output_tokens == 32
    for out in (first, second):
        s.update_from_output(out, runner_output(out, {"x": [7], "a": [8]}))
    assert a.num_output_tokens == 0  # both of a's outputs discarded
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def lookahead_run(sched) -> list[int]:
    """Two prompts sharing two blocks, the token after the second not shared, each
    with a hasher covering one token after each block, run to completion one
    after the other; then a third sharing the first's prompt and first output.
    The prefix hit of each."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    hasher = get_request_block_hasher(4, sha256, 1)
    hits = []
    for rid, tokens in (("a", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), ("b", [0, 1, 2, 3, 4, 5, 6, 7, 9]),
                        ("c", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 5, 5])):
        r = request(rid, tokens=tokens, max_tokens=3, block_hasher=hasher)
        assert len(r.block_hashes) == (len(tokens) - 1) // 4  # a block waits for the token after it
        sched.add_request(r)
        out = sched.schedule()
        hits.append(out.scheduled_new_reqs[0].num_computed_tokens)
        sched.update_from_output(out, runner_output(out, sampled_for(sched, out)))
        run_to_completion(sched)
    return hits


def test_a_lookahead_hasher_is_compared(monitor):
    """vLLM's lookahead hashes (kv_cache_utils.py get_request_block_hasher with
    num_hash_lookahead_tokens): the lift reads the hasher's lookahead, and every
    call, prefix hits included, is compared with the spec's lagging hashes."""
    s = build_scheduler(prefix_caching=True, block_size=4)
    # b's second block is not a's (the token after it differs), nor c's third.
    assert lookahead_run(s) == [0, 4, 8]
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_a_spec_hashing_blocks_as_they_fill_diverges_from_a_lookahead_hasher(monitor):
    """The comparison above can fail: the spec's requests hashed without their lookahead."""
    s = build_scheduler(prefix_caching=True, block_size=4)
    with mutated([Mutation("request.Request.append_output_token", "block_size + self.num_hash_lookahead_tokens",
                           "block_size")], module="request"):
        lookahead_run(s)
    assert monitor.summary()["divergences"]

def eagle_scheduler(drop: bool, mtp: bool = False):
    """A scheduler with an EAGLE-3 drafter of 2 tokens (or, `mtp`, a multi-module MTP
    one, reading 2 prompt tokens ahead) and prefix caching, block size 4: with `drop`,
    without lookahead block hashes, so a prefix hit gives back its last block
    (S:330-345); else with vLLM's default lookahead hashes and no drop.  Built from an
    n-gram config switched in place, as vLLM's own
    test_block_drafters_cap_requests_instead_of_draft_slots does (no draft model)."""
    from types import SimpleNamespace

    from vllm.config import SpeculativeConfig

    vc = vllm_config(prefix_caching=True, block_size=4, speculative_config=SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, prompt_lookup_min=1))
    object.__setattr__(vc.speculative_config, "method", "mtp" if mtp else "eagle3")
    if mtp:  # 0.33.0 counts the modules from num_nextn_predict_layers, 0.34.0 from n_predict
        object.__setattr__(vc.speculative_config, "draft_model_config", SimpleNamespace(
            hf_config=SimpleNamespace(num_nextn_predict_layers=2, n_predict=2, model_type="deepseek_mtp"),
            architectures=[]))
    object.__setattr__(vc.speculative_config, "disable_lookahead_block_hashes", drop)
    if hasattr(vc, "_resolve_num_hash_lookahead_tokens"):
        # 0.34.0 resolves the lookahead hashes once, when the config is built (config/vllm.py:
        # 633-654, 2261), not on each read as 0.33.0 (config/vllm.py:678): redone for the switch.
        vc.num_hash_lookahead_tokens = vc._resolve_num_hash_lookahead_tokens()
    s = build_scheduler(vc)
    lookahead = 2 if mtp else 1
    assert s.use_eagle_block_drop is drop and s.num_hash_lookahead_tokens == (0 if drop else lookahead)
    assert s.num_prefill_lookahead == lookahead and scope.features(s) == ()
    return s


def eagle_run(s) -> list[int]:
    """Two prompts, the first 14 tokens long and a prefix of the second, one after
    the other, each run to completion with drafts handed over after every step: the
    prefix hit of each."""
    from vllm.v1.outputs import DraftTokenIds

    hits = []
    for rid, tail in (("a", [50, 51]), ("b", [50, 51, 62])):
        s.add_request(request(rid, tokens=list(range(10, 22)) + tail, max_tokens=4, sched=s))
        out = s.schedule()
        hits.append(out.scheduled_new_reqs[0].num_computed_tokens)
        s.update_from_output(out, runner_output(out, sampled_for(s, out)))
        while s.has_requests():
            ids = list(s.requests)
            s.update_draft_token_ids(DraftTokenIds(req_ids=ids, draft_token_ids=[[7, 8]] * len(ids)))
            step(s)
    return hits


@pytest.mark.parametrize("drop", [True, False], ids=["block_drop", "lookahead_hashes"])
@pytest.mark.parametrize("mtp", [False, True], ids=["eagle3", "mtp"])
def test_an_eagle_family_drafter_is_in_scope(monitor, drop, mtp):
    """An EAGLE-family drafter (a prefill lookahead, KV lookahead; with prefix
    caching either the block drop or lookahead hashes) is what the spec models:
    every call, prefix hits included, is compared."""
    # b starts with a's prompt: its three full blocks and the two tokens after them
    # (what lookahead hashes of 1 or 2 cover) are a's.  The drop gives back the third.
    # Under MTP a's last computed token is not cached: a difference the lift sees in
    # the calls where a has just filled a block.
    assert eagle_run(eagle_scheduler(drop, mtp)) == [0, 8 if drop else 12]
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_a_spec_without_the_eagle_block_drop_diverges(monitor):
    with mutated([Mutation("spec_decode.eagle_block_drop",
                           "hits[:-1] if config.use_eagle_block_drop and hits else hits", "hits")],
                 module="spec_decode"):
        eagle_run(eagle_scheduler(True))
    assert monitor.summary()["divergences"]


def test_pipeline_parallelism_alone_is_in_scope(monitor):
    """PP changes no scheduling decision in 0.33.0 (the output's token payload
    only, S:1998): a PP scheduler's calls are checked."""
    from vllm.config import ParallelConfig

    s = build_scheduler(parallel_config=ParallelConfig(pipeline_parallel_size=2))
    assert s.use_pp
    s.add_request(request("a", 20))
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@case("CONTEXT_PARALLEL", "decode")
def _(mon, tmp_path, monkeypatch):
    from vllm.config import ParallelConfig

    # Decode context parallelism needs a tensor-parallel size above the model's
    # KV head count: a one-KV-head Llama.  EngineCore schedules in blocks of
    # block_size * dcp (kv_cache_utils.py:850).
    vc = vllm_config(hf_config=LLAMA,
                     parallel_config=ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2))
    s = build_scheduler(vc, groups=kv_groups(full_attention(16)), block_size=32)
    assert s.dcp_world_size == 2
    return watch(mon, add_and_step(s, request("a", 40)))


@case("CONTEXT_PARALLEL", "prefill")
def _(mon, tmp_path, monkeypatch):
    from vllm.config import ParallelConfig

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # the V1 runner refuses PCP
    s = build_scheduler(parallel_config=ParallelConfig(prefill_context_parallel_size=2))
    assert s.pcp_world_size == 2
    return watch(mon, add_and_step(s, request("a", 20)))


@case("POOLING", "pooling_runner")
def _(mon, tmp_path, monkeypatch):
    from vllm.pooling_params import PoolingParams

    s = build_scheduler(runner="pooling")
    assert s.num_sampled_tokens_per_step == 0
    return watch(mon, add_and_schedule(s, request("a", 20, sampling_params=None,
                                                  pooling_params=PoolingParams(task="embed"))))


@case("POOLING", "pooling_request")
def _(mon, tmp_path, monkeypatch):
    from vllm.pooling_params import PoolingParams

    s = build_scheduler()
    return watch(mon, add_and_schedule(s, request("a", 20, sampling_params=None,
                                                  pooling_params=PoolingParams(task="embed"))))


def holder_under_paused_new():
    """A scheduler under PAUSED_NEW whose waiting request holds blocks, which vLLM
    still admits (S:1100-1107): only a KV connector or streaming input leaves one
    there, so it is put in kv_holding_waiting by hand."""
    s = build_scheduler()
    s.add_request(request("a", 20, max_tokens=8))
    step(s)
    a = s.running.pop()
    a.status = RequestStatus.WAITING
    s.kv_holding_waiting.add_request(a)
    s.set_pause_state(PauseState.PAUSED_NEW)
    return s


@case("PAUSE", "attribute")
def _(mon, tmp_path, monkeypatch):
    # Modelled for 0.33.0 (spec/scheduler.py schedule_waiting): outside scope on an
    # older release, which this process is made to read as.
    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = holder_under_paused_new()
    return watch(mon, lambda: s.schedule())


@case("PREFILL_THROTTLING", "throttle_argument")
def _(mon, tmp_path, monkeypatch):
    # EngineCore passes _should_throttle_prefills() (core.py:676), True on a DP
    # engine's off-cadence steps; positional and keyword both.  The spec models
    # throttling for 0.33.0 only (spec/prefill_throttle.py): outside scope on an
    # older release, which this process is made to read as.
    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = build_scheduler()
    s.add_request(request("a", 20, max_tokens=8))
    step(s)
    s.add_request(request("b", 20))

    def calls():
        s.schedule(throttle_prefills=True)
        s.schedule(True)
    return watch(mon, calls)


@case("PREFILL_THROTTLING", "prefill_schedule_interval")
def _(mon, tmp_path, monkeypatch):
    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)  # as above
    s = build_scheduler(scheduler={"prefill_schedule_interval": 2})
    assert s.local_prefill_interval == 2
    return watch(mon, add_and_step(s, request("a", 20)))


@case("ADAPTIVE_THRESHOLD")
def _(mon, tmp_path, monkeypatch):
    # Modelled for 0.33.0 (spec/config.py long_prefill_threshold): outside scope on
    # an older release (0.31.0 and 0.32.0 have the field), which this process reads as.
    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = build_scheduler(scheduler={"long_prefill_token_threshold": 8, "long_prefill_token_threshold_adaptive": True})
    return watch(mon, add_and_step(s, request("a", 40), request("b", 40)))


@case("AUX_OUTPUT_CONNECTOR")
def _(mon, tmp_path, monkeypatch):
    from vllm.config.aux_output import AuxOutputConfig

    # Routed experts need a mixture-of-experts model, the V2 model runner and
    # prefix caching (config/vllm.py validation).
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    s = build_scheduler(hf_config=MIXTRAL, prefix_caching=True,
                        aux_output_config=AuxOutputConfig(enable_return_routed_experts=True))
    assert s.aux_output_connector is not None
    # (No update_from_output: it wants the routed experts from the worker.)
    # "a" leaves its two full blocks cached; the connector caps "b"'s hit of them
    # at one block, as vLLM's test_prefix_hit_is_capped_at_retained_auxiliary_outputs
    # has it answer.
    tokens = list(range(1, 41))
    s.add_request(request("a", tokens=tokens, sched=s))
    s.schedule()
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    s.add_request(request("b", tokens=tokens, sched=s))
    s.aux_output_connector.max_cache_hit = lambda r: 16
    outs: list = []
    stats = watch(mon, lambda: outs.append(s.schedule()))
    assert outs[0].num_scheduled_tokens == {"b": 24}  # 40 - 16, not 40 - 32
    return stats


def test_a_watch_blind_to_the_aux_cap_lets_it_diverge(monitor, tmp_path, monkeypatch):
    """Without the watch's judgement of max_cache_hit, the capped hit of the
    AUX_OUTPUT_CONNECTOR case is compared, and differs from the spec's."""
    blind = Mutation("scope.connector_answer_changes_step",
                     "type(result) is not int or prefix_hit(sched, request, result) != "
                     "prefix_hit(sched, request, request.num_tokens - 1)", "False")
    (aux_case,) = [c for c in CASES if c.feature == "AUX_OUTPUT_CONNECTOR"]
    with mutated([blind], package="schedspec.monitor", module="scope"):
        stats = aux_case.fn(monitor, tmp_path, monkeypatch)
    assert stats["divergences"] and not stats["outside_scope"], stats


def hit_after_abort(s):
    """"a" is scheduled and aborted, leaving its blocks cached; "b", with the same 40
    tokens, is admitted from a prefix hit of them: the output of "b"'s schedule()."""
    tokens = list(range(1, 41))
    s.add_request(request("a", tokens=tokens, sched=s))
    s.schedule()
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    s.add_request(request("b", tokens=tokens, sched=s))
    return s.schedule()


def test_an_aux_output_connector_that_caps_nothing_leaves_its_calls_checked(monitor, monkeypatch):
    """vLLM's aux output connector only caps prefix hits (S:1156-1160): with no
    cap below a hit, every call is compared (scope.ConnectorWatch), a prefix hit
    included."""
    from vllm.config.aux_output import AuxOutputConfig

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    s = build_scheduler(hf_config=MIXTRAL, prefix_caching=True,
                        aux_output_config=AuxOutputConfig(enable_return_routed_experts=True))
    outs: list = []
    stats = watch(monitor, lambda: outs.append(hit_after_abort(s)))
    assert outs[0].num_scheduled_tokens == {"b": 8}  # a hit of 32
    assert_all_checked(stats, "schedule", "add_request", "finish_requests")
    assert not set(scope.ConnectorWatch.AUX) & s.aux_output_connector.__dict__.keys()


def sends_run(s) -> None:
    """"a" stops, "b" is aborted with "a" held: a KV producer keeps both, finished, until
    the worker reports their sends (S:3180-3200, 3730-3733); "c" runs beside them."""
    for rid in "abc":
        s.add_request(request(rid, 20, sched=s, max_tokens=2))
    out = s.schedule()
    s.update_from_output(out, runner_output(out, {rid: [7] for rid in "abc"}))
    s.finish_requests(["b"], RequestStatus.FINISHED_ABORTED)
    out = s.schedule()
    s.update_from_output(out, runner_output(out, {rid: [7] for rid in "ac"}))
    assert {rid for rid in "abc" if s.requests[rid].is_finished()} == set("abc")  # all held
    out = s.schedule()
    s.update_from_output(out, runner_output(out, {}, finished_sending=["b", "a"]))
    assert set(s.requests) == {"c"}


def test_a_kv_producer_s_sends_are_compared(monitor, tmp_path):
    """A connector that keeps finished requests' blocks to send them, answering
    (True, params): its answers are the spec's kv_connector_sends, and every call,
    the report of the sends included, is compared."""
    s = connector_scheduler(tmp_path, "SendingConnector", role="kv_producer")
    assert_all_checked(watch(monitor, lambda: sends_run(s)), "schedule", "update_from_output", "finish_requests")


def test_a_spec_that_frees_at_the_finish_diverges_from_a_kv_producer(monitor, tmp_path):
    s = connector_scheduler(tmp_path, "SendingConnector", role="kv_producer")
    with mutated([Mutation("kv_connector.hold_sending", "w.requests[rid].kv_connector_sends", "False")],
                 module="kv_connector"):
        stats = watch(monitor, lambda: sends_run(s))
    assert stats["divergences"], stats


def test_a_mock_aux_output_connector_is_judged_by_its_answers(monitor):
    """Any aux output connector is judged call by call, a test's Mock included (as
    vLLM's test_finish_request sets one): the scheduler reads only its caps, so
    add_request and finish_requests are compared, and so is a schedule() whose caps
    come from vLLM's own connector behind a Mock (test_scheduler_reset_prefix_cache);
    a plain Mock's cap, not a number, puts its schedule() outside scope."""
    from unittest.mock import Mock

    from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector

    s = build_scheduler()
    s.aux_output_connector = Mock()

    def add_and_finish():
        for rid in ("a", "b"):
            s.add_request(request(rid, 20))
        s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert_all_checked(watch(monitor, add_and_finish), "add_request", "finish_requests")
    stats = watch(monitor, lambda: s.schedule())
    assert stats["outside_scope"] and not stats["divergences"], stats
    assert "aux output connector" in json.dumps(stats), stats

    s = build_scheduler(prefix_caching=True)
    s.aux_output_connector = Mock(wraps=AuxOutputSchedulerConnector(s.kv_cache_manager))
    assert_all_checked(watch(monitor, lambda: hit_after_abort(s)), "schedule", "add_request", "finish_requests")
    assert s.aux_output_connector.max_cache_hit.called


@case("PREFIX_REPLAY", companions=("KV_CACHE_GROUPS",))
def _(mon, tmp_path, monkeypatch):
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    # DeepSeek-V4.1's bounded-replay sliding-window group beside a full one.
    swa = SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=32,
                               bounded_replay=True)
    s = build_scheduler(groups=kv_groups(full_attention(16), swa), prefix_caching=True)
    assert s.prefix_replay_tokens == 32
    return watch(mon, add_and_step(s, request("a", 40, sched=s)))


# Request features: fixed when the request is made, or its state.


def image(identifier: str, offset: int, length: int, is_embed=None):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length, is_embed=is_embed))


def encoder_scheduler(budget: int = 12, cache: int = 20, **kw):
    """A scheduler with an encoder budget and cache, set as vLLM's own tests set them
    (the model directory is text-only: vLLM sizes neither)."""
    from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

    s = build_scheduler(**kw)
    s.max_num_encoder_input_tokens = budget
    s.encoder_cache_manager = EncoderCacheManager(cache_size=cache)
    return s


@case("ENCODER_INPUTS", "is_embed")
def _(mon, tmp_path, monkeypatch):
    # Placeholder tokens that are not all embeddings (an is_embed mask): not modelled.
    s = encoder_scheduler()
    mask = torch.tensor([True, False] * 4)
    return watch(mon, add_and_schedule(s, request("a", 20, mm_features=[image("x", 4, 8, mask)])))


@case("ENCODER_INPUTS", "identifier_sizes")
def _(mon, tmp_path, monkeypatch):
    # One identifier with two sizes: vLLM's schedule() finishes the second request with an
    # error (S:2027-2048).  Adding them is harmless, and checked.
    s = encoder_scheduler()
    s.add_request(request("a", 20, mm_features=[image("x", 4, 8)]))
    s.add_request(request("b", 20, mm_features=[image("x", 2, 6)]))
    return watch(mon, s.schedule)


@case("ENCODER_INPUTS", "older_release")
def _(mon, tmp_path, monkeypatch):
    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = encoder_scheduler()
    return watch(mon, add_and_schedule(s, request("a", 20, mm_features=[image("x", 4, 8)])))


@case("MAMBA_ALIGNED_SPLIT", "attribute")
def _(mon, tmp_path, monkeypatch):
    # Chunks cut to Mamba blocks (S:875-879): a hybrid model's; vLLM's own test sets the flag.
    s = build_scheduler()
    s.need_mamba_block_aligned_split = True
    return watch(mon, add_and_schedule(s, request("a", 20)))


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_encoder_inputs_are_compared(monitor, async_scheduling, prefix_caching):
    """Items shared by identifier, a chunk cut before an item the budget cannot take,
    an eviction, an abort holding a reference: every call checked, none diverging."""
    s = encoder_scheduler(budget=10, cache=14, async_scheduling=async_scheduling, prefix_caching=prefix_caching,
                          max_num_batched_tokens=16)
    reqs = [request("a", 30, sched=s, mm_features=[image("x", 2, 8), image("y", 14, 6)]),
            request("b", 24, sched=s, mm_features=[image("x", 0, 8)]),
            request("c", 20, sched=s, mm_features=[image("z", 4, 10)])]

    def calls():
        for r in reqs:
            s.add_request(r)
        step(s)
        s.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
        s.add_request(request("d", 12, sched=s, mm_features=[image("w", 0, 9)]))
        run_to_completion(s)

    stats = watch(monitor, calls)
    assert_all_checked(stats, "schedule", "update_from_output", "add_request", "finish_requests")
    assert_clean(stats)


@case("LORA")
def _(mon, tmp_path, monkeypatch):
    # A release before 0.33.0: the spec has 0.33.0's LoRA rule only (spec/lora.py).
    from vllm.config import LoRAConfig
    from vllm.lora.request import LoRARequest

    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = build_scheduler(lora_config=LoRAConfig(max_loras=1, max_lora_rank=8))
    return watch(mon, add_and_step(s, request("a", 20, lora_request=LoRARequest("adapter", 1, str(tmp_path)))))


@case("STRUCTURED_OUTPUT")
def _(mon, tmp_path, monkeypatch):
    # A release before 0.33.0: the spec has 0.33.0's grammar wait only (spec/structured_output.py).
    from vllm.sampling_params import StructuredOutputsParams

    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)
    s = build_scheduler()
    r = request("a", 20, sampling={"structured_outputs": StructuredOutputsParams(regex="[ab]+")})
    assert r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    return watch(mon, add_and_schedule(s, r))


@case("GRAMMAR_ACCEPTANCE")
def _(mon, tmp_path, monkeypatch):
    # A compiled grammar judges the sampled tokens (S:2488-2499): the spec's grammar
    # accepts them all, a real one may not, so that update_from_output is not compared.
    from vllm.sampling_params import StructuredOutputsParams

    from schedspec.reference.vllm_adapter import AcceptingGrammar

    s = build_scheduler()
    r = request("a", 20, sampling={"structured_outputs": StructuredOutputsParams(regex="[ab]+")})
    r.structured_output_request.grammar = AcceptingGrammar()
    s.add_request(r)
    out = s.schedule()
    assert dict(out.num_scheduled_tokens) == {"a": 20}

    def calls():
        s.update_from_output(out, runner_output(out, sampled_for(s, out)))
    return watch(mon, calls)


@case("STREAMING_INPUT", "resumable_request")
def _(mon, tmp_path, monkeypatch):
    s = build_scheduler()
    return watch(mon, add_and_step(s, request("a", 20, max_tokens=1, resumable=True)))


@case("STREAMING_INPUT", "next_input_chunk")
def _(mon, tmp_path, monkeypatch):
    # A streaming session's turn ends (WAITING_FOR_STREAMING_REQ), then its next
    # input chunk arrives as an add_request with the same id (scheduler.py:2931).
    # Ending the turn sets drop mode (scheduler.py:2717-2733), but with no stale
    # output in flight that changes nothing, and is not named.
    s = build_scheduler()
    s.add_request(request("a", 20, max_tokens=1, resumable=True))
    step(s)
    assert s.requests["a"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    return watch(mon, add_and_step(s, request("a", 8, max_tokens=2, resumable=True)))


@case("CACHE_SALT")
def _(mon, tmp_path, monkeypatch):
    s = build_scheduler(prefix_caching=True)
    return watch(mon, add_and_step(s, request("a", 40, sched=s, cache_salt="tenant-1")))


@case("PROMPT_EMBEDS")
def _(mon, tmp_path, monkeypatch):
    s = build_scheduler(prefix_caching=True)
    r = request("a", None, sched=s, prompt_token_ids=None, prompt_embeds=torch.zeros(40, 8))
    assert r.num_prompt_tokens == 40
    return watch(mon, add_and_step(s, r))


@case("REPETITION_DETECTION")
def _(mon, tmp_path, monkeypatch):
    from vllm.sampling_params import RepetitionDetectionParams

    s = build_scheduler()
    params = RepetitionDetectionParams(max_pattern_size=2, min_count=3)
    return watch(mon, add_and_step(s, request("a", 20, sampling={"repetition_detection": params})))


@case("DELAYED_FREE", companions=("KV_CONNECTOR",))
def _(mon, tmp_path, monkeypatch):
    from vllm.config import KVTransferConfig

    # A connector still sending a finished request's KV keeps its blocks
    # (scheduler.py:3031-3061): vLLM's ExampleConnector, told to do so, loaded
    # through vLLM's connector factory by module path.
    s = build_scheduler(kv_transfer_config=KVTransferConfig(
        kv_connector="DelayFreeConnector", kv_connector_module_path="monitor_helpers", kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)}))
    s.add_request(request("a", 20, sched=s, max_tokens=1))
    step(s)
    assert s.requests["a"].is_finished()  # finished, still held

    def calls():
        s.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
        out = s.schedule()
        # The connector reports the send done: vLLM frees the blocks (S:3730-3733).
        # The output names no held request, so only KV_CONNECTOR names this call.
        result = runner_output(out, {})
        result.kv_connector_output = KVConnectorOutput(finished_sending={"a"})
        s.update_from_output(out, result)
        assert "a" not in s.requests
    return watch(mon, calls)


@case("MM_ENCODER_ONLY", variant="attribute")
def _(mon, tmp_path, monkeypatch):
    # Attribute set: an encoder-only instance needs a multimodal model, whose
    # processor needs a tokenizer, not available offline.  Such an instance
    # samples nothing and stops a request once its prompt is consumed
    # (scheduler.py:2419-2430); a text-only request there names no other feature.
    s = build_scheduler()
    s.is_mm_encoder_only = True

    def calls():
        s.add_request(request("a", 20))
        out = s.schedule()
        s.update_from_output(out, runner_output(out, {}))
    return watch(mon, calls)


@case("KV_BLOCK_SIZE")
def _(mon, tmp_path, monkeypatch):
    # vLLM allocates in the group's 8-token blocks (single_type_kv_cache_manager.py:109),
    # the spec would count in sched.block_size = 16.  EngineCore never builds this
    # (one group: block size = the group's, times DCP); a scheduler built directly can.
    s = build_scheduler(groups=kv_groups(full_attention(8)), block_size=16, hash_block_size=16)

    def calls():
        for i in range(2):
            s.add_request(request(f"r{i}", 30, max_tokens=3))
        run_to_completion(s)
    return watch(mon, calls)


@case("HASH_LOOKAHEAD", "unreadable_hasher")
def _(mon, tmp_path, monkeypatch):
    # A block hasher with one lookahead token behind a wrapper: the lift cannot read
    # its lookahead (vllm_lift.hasher_lookahead), and its hashes lag the blocks.
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    s = build_scheduler(prefix_caching=True)
    fn = get_hash_fn_by_name(s.vllm_config.cache_config.prefix_caching_hash_algo)
    inner = get_request_block_hasher(s.hash_block_size, fn, 1)
    r = request("a", 32, block_hasher=lambda req: inner(req))
    assert len(r.block_hashes) == 1  # 2 full blocks, the second waits for token 33
    return watch(mon, add_and_step(s, r))


@case("NO_BLOCK_HASHER")
def _(mon, tmp_path, monkeypatch):
    s = build_scheduler(prefix_caching=True)
    return watch(mon, add_and_step(s, request("a", 40)))  # no sched=: no hasher


@case("HAND_ASSEMBLED", "object_new")
def _(mon, tmp_path, monkeypatch):
    # As vLLM's tests build one to drive a single code path: object.__new__ and
    # the few fields it reads.
    from vllm.v1.core.sched.scheduler import Scheduler

    s = object.__new__(Scheduler)
    s.requests, s.running, s.finished_req_ids = {}, [], set()

    def calls():
        s.finish_requests(["x"], RequestStatus.FINISHED_ABORTED)
    return watch(mon, calls)


@case("PATCHED_INTERNALS", "allocate_slots_mock")
def _(mon, tmp_path, monkeypatch):
    # An allocate_slots that always fails, as vLLM's tests inject one with a Mock.
    from unittest.mock import Mock

    s = build_scheduler()
    s.kv_cache_manager.allocate_slots = Mock(return_value=None)
    return watch(mon, add_and_step(s, request("a", 20)))


@case("PATCHED_INTERNALS", "scheduler_method_replaced_and_used")
def _(mon, tmp_path, monkeypatch):
    # A scheduler method of its own replaced by a stub the step calls: vLLM's
    # _update_after_schedule (S:1837) made a no-op, so computed tokens never advance.
    s = build_scheduler()
    s.add_request(request("a", 20))
    monkeypatch.setattr(s, "_update_after_schedule", lambda output: None)
    return watch(mon, lambda: s.schedule())


def test_a_replaced_scheduler_method_the_call_never_uses_leaves_it_checked(monitor, monkeypatch):
    """A stats builder replaced by a Mock that fails if called, as vLLM's
    test_scheduled_encoder_input_stats_disabled_* do: a step logging no stats
    never reaches it, so every call is compared (scope.ReplacementWatch), and the
    Mock itself is back in place after each call."""
    from unittest.mock import Mock

    s = build_scheduler()
    s.log_stats = False
    make_stats = Mock(side_effect=AssertionError("stats should not be computed"))
    monkeypatch.setattr(s, "_make_scheduled_encoder_input_stats", make_stats)
    assert scope.own_replacements(s) and not scope.patched(s)
    stats = watch(monitor, lambda: (s.add_request(request("a", 20)), run_to_completion(s)))
    make_stats.assert_not_called()
    assert s.__dict__["_make_scheduled_encoder_input_stats"] is make_stats
    assert_all_checked(stats, "schedule", "update_from_output", "add_request")


def test_a_replaced_scheduler_method_a_watch_never_sees_would_be_a_false_divergence(monitor, monkeypatch):
    """The case above can fail: with a watch that never records a use, the stub
    step of scheduler_method_replaced_and_used is compared and reported as vLLM's
    divergence."""
    s = build_scheduler()
    s.add_request(request("a", 20))
    monkeypatch.setattr(s, "_update_after_schedule", lambda output: None)
    monkeypatch.setattr(scope.ReplacementWatch, "features", lambda self: ())
    stats = watch(monitor, lambda: s.schedule())
    assert stats["divergences"], stats


def refuse_once(obj, name: str) -> list:
    """Replace obj.name with a spy that refuses its first call (None), then calls
    the real method, as vLLM's test_scheduler.py:2417-2426 wraps allocate_slots.
    Returns the list of the spy's answers."""
    real = getattr(obj, name)
    answers: list = []

    def spy(*a, **k):
        answers.append(None if not answers else real(*a, **k))
        return answers[-1]
    setattr(obj, name, spy)
    return answers


@case("SPY_CHANGED_STEP", "allocate_slots_refused_once")
def _(mon, tmp_path, monkeypatch):
    s = build_scheduler()
    s.add_request(request("a", 20))
    refuse_once(s.kv_cache_manager, "allocate_slots")
    return watch(mon, lambda: s.schedule())  # the spec grants "a" its prompt; vLLM, refused, nothing


# -- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_feature_is_counted_outside_scope(c: Case, monitor, tmp_path, monkeypatch):
    stats = c.fn(monitor, tmp_path, monkeypatch)
    expected = c.expected()
    seen = calls_seen(stats)
    assert seen, "the case made no monitored call"
    for call, n in seen.items():  # every call: outside scope, never compared
        assert n.get("outside_scope", 0) == n["total"], (call, n)
        assert n.get("checked", 0) == 0 and n.get("monitor_error", 0) == 0 and n.get("vllm_raised", 0) == 0, \
            (call, n)
    assert set(stats["outside_scope"]) == expected, f"named {sorted(stats['outside_scope'])}"
    assert_clean(stats)
    assert_clean(monitor.summary())  # the setup calls too


@pytest.mark.parametrize("num_blocks", [64, 7], ids=["no-preemption", "preemption"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("delivery", [True, False], ids=["spec", "spec-without-delivery"])
def test_a_connector_that_changes_nothing_leaves_its_calls_checked(monitor, tmp_path, num_blocks, async_scheduling,
                                                                   delivery):
    """vLLM's ExampleConnector with nothing stored answers no external tokens and
    keeps no block: every call is compared (scope.ConnectorWatch), a schedule()
    that preempts included, where this producer's connector requires KV delivery
    and has vLLM drop the preempted request's in-flight output (S:988-992; the
    config's requires_kv_delivery).  A spec that delivers it instead differs.  The
    watch leaves the connector as it found it.  A producer's: a consumer's under async
    scheduling defers frees (S:187-193), which the spec does not model."""
    s = connector_scheduler(tmp_path, role="kv_producer", num_blocks=num_blocks, async_scheduling=async_scheduling)
    assert s.requires_kv_delivery
    preempting = 0

    def calls():
        nonlocal preempting
        for rid in "ab":
            s.add_request(request(rid, 40, sched=s, max_tokens=30))
        if async_scheduling:  # two batches in flight: a preempted request has output in flight
            run_to_completion(s)
            return
        for _ in range(200):
            if not s.requests:
                break
            preempting += bool(step(s).preempted_req_ids)
    mutation = Mutation("scheduler.preempt", "s.config.requires_kv_delivery", "False")
    with mutated([] if delivery else [mutation]):
        stats = watch(monitor, calls)
    assert not s.requests
    if not async_scheduling:
        assert preempting == (0 if num_blocks == 64 else 1)
    if not delivery:
        if num_blocks == 7:
            assert stats["divergences"], stats
        return
    assert_all_checked(stats, "schedule", "update_from_output", "add_request")
    assert not set(scope.ConnectorWatch.KV) & s.connector.__dict__.keys()
    assert_clean(monitor.summary())


def async_load_run(s, prompts: Mapping[str, int], max_tokens: int = 3, finish_after: int | Mapping[str, int] = 1,
                   policy_priority: Mapping[str, int] | None = None) -> list:
    """Requests `prompts` (id -> prompt length) added, then steps to completion; each
    KV load is reported finished `finish_after` steps after it started (by request
    where a mapping)."""
    outs: list = []
    started: dict[str, int] = {}
    for rid, n in prompts.items():
        s.add_request(request(rid, n, sched=s, max_tokens=max_tokens,
                              **({"priority": policy_priority[rid]} if policy_priority else {})))
    after = finish_after if isinstance(finish_after, Mapping) else dict.fromkeys(prompts, finish_after)
    for k in range(200):
        if not s.requests:
            break
        out = s.schedule()
        outs.append(out)
        for rid in loading(s):
            started.setdefault(rid, k)
        done = [rid for rid in loading(s) if k - started[rid] + 1 >= after[rid]]
        s.update_from_output(out, runner_output(out, sampled_for(s, out), done))
    assert not s.requests
    return outs


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no-prefix-caching", "prefix-caching"])
@pytest.mark.parametrize("finish_after", [1, 3])
@pytest.mark.parametrize("connector", ["OneBlockAsyncConnector", "WholePromptAsyncConnector"])
def test_async_loads_are_compared(monitor, tmp_path, prefix_caching, finish_after, connector):
    """An asynchronous KV load (S:1336-1338, 1465-1513, 1576-1607), the request's wait
    for it and its promotion once reported finished (S:3616-3681) are the spec's
    rules (spec/kv_connector.py): every call of a run to completion is compared, and
    agrees.  Two requests share a prefix, so under prefix caching the second one's
    local hit meets the first one's blocks, cached only when its load ends."""
    s = connector_scheduler(tmp_path, connector, prefix_caching=prefix_caching)
    stats = watch(monitor, lambda: async_load_run(s, {"a": 40, "b": 70, "c": 20}, finish_after=finish_after))
    assert_all_checked(stats, "schedule", "update_from_output", "add_request")


@pytest.mark.parametrize("reserve", [True, False], ids=["spec", "spec-without-reservation"])
def test_an_async_load_is_admitted_only_within_the_in_flight_reservation(monitor, tmp_path, reserve):
    """A load is started only if its blocks fit beside what the prefills in flight
    still need (S:1482-1492, 3538-3570): "b" waits while "a", mid-prefill (48
    tokens a step, the long-prefill cap), needs every free block.  Without the
    reservation the spec starts the load, and differs from vLLM."""
    s = connector_scheduler(tmp_path, "OneBlockAsyncConnector", num_blocks=13,  # 12 usable blocks
                            scheduler={"long_prefill_token_threshold": 48})
    outs = []
    s.add_request(request("a", 180, sched=s, max_tokens=1))  # 12 blocks in all
    step(s, finish_loads=True)  # "a" loads its first block
    step(s)  # promoted and admitted: 48 more tokens, 4 blocks

    def calls():
        s.add_request(request("b", 40, sched=s))
        outs.append(s.schedule())  # "a": 48 more, 7 blocks; 5 free, 5 reserved for "a"
    mutation = Mutation("kv_connector.reserved_blocks", "total", "0")
    with mutated([] if reserve else [mutation], module="kv_connector"):
        stats = watch(monitor, calls)
    assert outs[0].num_scheduled_tokens == {"a": 48}
    assert s.requests["b"].status == RequestStatus.WAITING
    assert s.requests["b"].__dict__["schedspec_kv_connector_tokens"] == 16  # asked, and refused
    if reserve:
        assert_all_checked(stats, "schedule", "add_request")
    else:
        assert stats["divergences"], stats


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("holders_first", [True, False], ids=["spec", "spec-with-one-queue"])
def test_a_preempted_request_waits_behind_the_requests_holding_blocks(monitor, tmp_path, policy, holders_first):
    """A request loading KV waits in its own queue, drained first (S:1091-1107,
    2776-2787): a request preempted meanwhile goes to the front of the other
    one (S:1896), behind it.  "c" loads for 40 steps while "a" and "b" grow until
    one is preempted.  A spec with one queue puts the preempted request first."""
    s = connector_scheduler(tmp_path, "OneBlockAsyncConnector", num_blocks=9, scheduler={"policy": policy})
    preempted_while_loading = []

    def calls():
        outs = async_load_run(s, {"a": 40, "b": 40, "c": 20}, max_tokens=30, finish_after={"a": 1, "b": 1, "c": 40},
                              policy_priority={"a": 0, "b": 1, "c": 2} if policy == "priority" else None)
        preempted_while_loading.extend(rid for out in outs[2:40] for rid in out.preempted_req_ids)
    mutation = Mutation("kv_connector.queue_span", "num_holding(waiting, requests)", "0")
    with mutated([] if holders_first else [mutation], module="kv_connector"):
        stats = watch(monitor, calls)
    assert preempted_while_loading
    if holders_first:
        assert_all_checked(stats, "schedule", "update_from_output", "add_request")
    else:
        assert stats["divergences"], stats


@pytest.mark.parametrize("holders_admitted", [True, False], ids=["spec", "spec-admitting-nothing"])
def test_paused_new_admits_the_requests_holding_blocks(monitor, holders_admitted):
    """Under PAUSED_NEW the waiting loop still drains the holders' queue (S:1100-1107):
    compared, and the spec that admits nobody paused differs."""
    s = holder_under_paused_new()
    mutation = Mutation("scheduler.schedule_waiting", 'kv_connector.holds_kv_blocks(s.requests[s.waiting[0]])',
                        "False")
    with mutated([] if holders_admitted else [mutation]):
        stats = watch(monitor, lambda: s.schedule())
    assert s.running and s.running[0].request_id == "a"
    if holders_admitted:
        assert_all_checked(stats, "schedule")
    else:
        assert stats["divergences"], stats


@pytest.mark.parametrize("mutation,connector", [
    (Mutation("kv_connector.loads_async", "external > 0 and r.kv_connector_async", "False"), "OneBlockAsyncConnector"),
    (Mutation("kv_connector.load_in_flight", "not r.kv_load_finished", "True"), "OneBlockAsyncConnector"),
    (Mutation("kv_connector.promote", "r.num_computed_tokens == r.num_tokens", "False"), "WholePromptAsyncConnector"),
], ids=["loads-within-the-step", "never-promoted", "whole-load-kept"])
def test_a_spec_without_the_async_load_rules_diverges(monitor, tmp_path, mutation, connector):
    """The comparison above can fail: the spec without each rule disagrees with vLLM
    somewhere in the run (without the whole load's rule, it raises: nothing left to compute)."""
    s = connector_scheduler(tmp_path, connector, prefix_caching=True, num_blocks=9)
    with mutated([mutation], module="kv_connector"):
        stats = watch(monitor, lambda: async_load_run(s, {"a": 40, "b": 70, "c": 20}, finish_after=2))
    assert stats["divergences"] or (connector == "WholePromptAsyncConnector" and stats["monitor_errors"]), stats


@pytest.mark.parametrize("case_id", [
                                     "EC_CONNECTOR-real", "AUX_OUTPUT_CONNECTOR-real"])
def test_a_watch_that_never_names_a_connector_lets_each_case_diverge(monitor, tmp_path, monkeypatch, case_id):
    """Each connector case is outside scope because of what the watch saw, not by
    accident: a watch that names nothing lets the case's call be compared, and it
    differs from the spec."""
    (c,) = [c for c in CASES if c.id == case_id]
    blind = Mutation("scope.ConnectorWatch.features", "tuple(self.acted)", "()")
    with mutated([blind], package="schedspec.monitor", module="scope"):
        stats = c.fn(monitor, tmp_path, monkeypatch)
    assert stats["divergences"] and not stats["outside_scope"], stats


@pytest.mark.parametrize("connector,prefix_caching", [
    ("OneBlockConnector", False), ("OneBlockConnector", True), ("UndecidedConnector", False),
])
def test_a_connectors_answers_are_compared(monitor, tmp_path, connector, prefix_caching):
    """A load within the step (S:1177-1257) and an undecided answer, which skips the
    request (S:1185-1190), are the spec's rules (spec/kv_connector.py): every call
    of a run to completion is compared, the admission's included, and agrees."""
    s = connector_scheduler(tmp_path, connector, prefix_caching=prefix_caching)
    outs: list = []

    def calls():
        for rid in "ab":
            s.add_request(request(rid, 40, sched=s, max_tokens=3))
        if connector == "UndecidedConnector":
            outs.append(s.schedule())
            return
        while s.requests:
            outs.append(step(s))
    stats = watch(monitor, calls)
    assert_all_checked(stats, "schedule", "add_request")
    if connector == "UndecidedConnector":
        assert outs[0].num_scheduled_tokens == {}
    else:
        assert outs[0].num_scheduled_tokens == {"a": 24, "b": 24}  # 16 of 40 loaded


@pytest.mark.parametrize("mutation", [
    Mutation("kv_connector.external_tokens", "max(0, r.kv_connector_tokens - num_local_computed_tokens)", "0"),
    Mutation("kv_connector.undecided", "r.kv_connector_tokens is None", "False"),
], ids=["no-external-tokens", "never-undecided"])
def test_a_spec_without_the_connector_rules_diverges(monitor, tmp_path, mutation):
    """The comparison above can fail: the spec without either rule disagrees with vLLM."""
    name = "OneBlockConnector" if "external" in mutation.target else "UndecidedConnector"
    s = connector_scheduler(tmp_path, name)
    s.add_request(request("a", 40, sched=s))
    with mutated([mutation], module="kv_connector"):
        stats = watch(monitor, lambda: s.schedule())
    assert stats["divergences"], stats


def test_a_spy_that_calls_through_leaves_every_call_checked(monitor):
    """A counting wrapper of _preempt_request, as vLLM's async tests install one
    (test_async_scheduler.py:566-574): the calls stay in scope and are compared."""
    s = build_scheduler(num_blocks=7)
    seen: list = []
    real = s._preempt_request

    def counting_preempt(request, timestamp, **kwargs):
        seen.append(request.request_id)
        return real(request, timestamp, **kwargs)
    s._preempt_request = counting_preempt
    assert scope.spied(s) == ("Scheduler._preempt_request",) and not scope.patched(s)

    def calls():
        for rid in "ab":
            s.add_request(request(rid, 40, max_tokens=30))
        run_to_completion(s)
    stats = watch(monitor, calls)
    assert seen, "no preemption: the case did not exercise the spy"
    assert_all_checked(stats, "schedule", "update_from_output", "add_request")


def test_a_spy_that_changes_a_step_excuses_that_call_only(monitor):
    """A spy that refuses the first allocation: that schedule() differs from the
    spec and is counted under SPY_CHANGED_STEP, never as a divergence; the calls
    after it, where the spy calls through, are checked."""
    s = build_scheduler()
    s.add_request(request("a", 20))
    answers = refuse_once(s.kv_cache_manager, "allocate_slots")
    first = watch(monitor, lambda: s.schedule())
    assert first["outside_scope"] == {scope.SPY_CHANGED_STEP: 1} and not first["divergences"]
    later = watch(monitor, lambda: (s.schedule(), step(s)))
    assert answers[0] is None and answers[-1] is not None
    seen = calls_seen(later)
    assert seen["schedule"]["checked"] == seen["schedule"]["total"] == 2, seen
    assert_clean(monitor.summary())


def test_every_feature_has_a_case():
    """A feature added to scope.py without a case here fails this test."""
    defined = {name for name, value in vars(scope).items()
               if re.fullmatch(r"[A-Z][A-Z_]*", name) and isinstance(value, str) and not name.startswith("_")}
    covered = {c.feature for c in CASES} | {comp for c in CASES for comp in c.companions}
    missing = defined - covered - set(NEVER_PRODUCED)
    assert not missing, f"scope.py features without a case in {Path(__file__).name}: {sorted(missing)}"
    # The exemptions stay honest: a constant no scope code path produces.
    source = "\n".join(p.read_text() for p in Path(scope.__file__).parent.glob("*.py"))
    for name in NEVER_PRODUCED:
        uses = len(re.findall(rf"\b{name}\b", source))
        assert uses == 1, f"scope.{name} is now used ({uses - 1} uses): give it a case"


# Constants scope.py defines but no code path in monitor/ produces, so no
# call can be classified under them (the guard above fails once one is used).
NEVER_PRODUCED: dict[str, str] = {}


def test_case_features_are_the_declared_ones():
    for c in CASES:
        assert isinstance(getattr(scope, c.feature), str), c.id


# -- in scope: checked, so the classification is not vacuous ---------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_caching", "caching"])
def test_plain_calls_are_checked(monitor, async_scheduling, prefix_caching):
    s = build_scheduler(async_scheduling=async_scheduling, prefix_caching=prefix_caching, num_blocks=9,
                        max_num_batched_tokens=32)
    assert scope.features(s) == ()
    shared = prompt(31)
    reqs = [request(f"r{i}", 31, sched=s, tokens=shared if i % 2 else None, max_tokens=6) for i in range(4)]
    for r in reqs:  # a shared prompt; decodes outgrow a pool of 8 usable blocks
        s.add_request(r)
    s.add_request(request("gone", 30, sched=s, max_tokens=50))
    step(s)
    s.finish_requests(["gone", "unknown"], RequestStatus.FINISHED_ABORTED)
    run_to_completion(s)
    assert any(r.num_preemptions for r in reqs) and not s.requests
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output", "finish_requests")


@pytest.mark.parametrize("make", [
    pytest.param(lambda s: request("a", 40, sched=s, sampling={"prompt_logprobs": 1}), id="prompt_logprobs"),
    pytest.param(lambda s: request("a", 40, sched=s, cache_salt="tenant-1"), id="cache_salt"),
    pytest.param(lambda s: request("a", None, sched=s, prompt_token_ids=None, prompt_embeds=torch.zeros(40, 8)),
                 id="prompt_embeds"),
])
def test_prefix_cache_request_features_are_in_scope_without_caching(monitor, make):
    """These only change what the prefix cache reads or hashes: without prefix
    caching the spec models the request, and the calls are checked."""
    s = build_scheduler(prefix_caching=False)
    s.add_request(make(s))
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_lora_is_in_scope(monitor):
    """0.33.0's max_loras rule is the spec's (spec/lora.py): an adapter held back
    while another runs, every call checked."""
    from vllm.config import LoRAConfig
    from vllm.lora.request import LoRARequest

    s = build_scheduler(lora_config=LoRAConfig(max_loras=1, max_lora_rank=8))
    for rid, adapter in (("a", 1), ("b", 2), ("c", 1)):
        s.add_request(request(rid, 20, max_tokens=3, lora_request=LoRARequest(f"lora{adapter}", adapter, "/none")))
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"a", "c"}
    s.update_from_output(out, runner_output(out, {"a": [100], "c": [100]}))
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_data_parallel_prefill_throttling_is_in_scope(monitor, async_scheduling):
    """0.33.0's throttle_prefills (spec/prefill_throttle.py): an off-cadence step
    defers a waiting prefill and a running prefill chunk while a decode runs
    (S:766-768, 838, 1340); a step that cannot admit everything waiting marks the
    engine capacity-bound, and the next throttled step admits (S:1685-1689).
    Every call is compared, the cadence's state included."""
    s = build_scheduler(async_scheduling=async_scheduling, max_num_batched_tokens=64)
    s.add_request(request("d", 10, max_tokens=40, sampling={"ignore_eos": True}))
    step(s)
    s.add_request(request("c", 100, max_tokens=4))
    out = s.schedule(throttle_prefills=False)  # release step: c gets a first chunk
    assert "c" in out.num_scheduled_tokens and s.requests["c"].is_prefill_chunk
    s.update_from_output(out, runner_output(out, sampled_for(s, out)))
    s.add_request(request("w", 20, max_tokens=4))
    out = s.schedule(True)  # held: d decodes alone, c's chunk and w wait
    assert set(out.num_scheduled_tokens) == {"d"}, out.num_scheduled_tokens
    s.update_from_output(out, runner_output(out, sampled_for(s, out)))
    for rid in "xyz":
        s.add_request(request(rid, 60, max_tokens=4))
    out = s.schedule()  # release: the budget runs out with requests waiting
    assert s.prefill_capacity_bound
    s.update_from_output(out, runner_output(out, sampled_for(s, out)))
    out = s.schedule(throttle_prefills=True)  # capacity-bound: throttling backs off
    assert len(out.num_scheduled_tokens) > 1
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_adaptive_long_prefill_threshold_is_in_scope(monitor):
    """0.33.0's adaptive threshold (S:780-788): the cap of 8 is floored at 64 // 2
    eligible requests, so a and b each get 32 tokens, not 8; every call compared."""
    s = build_scheduler(max_num_batched_tokens=64, scheduler={"long_prefill_token_threshold": 8,
                                                              "long_prefill_token_threshold_adaptive": True})
    s.add_request(request("a", 40))
    s.add_request(request("b", 40))
    out = step(s)
    assert dict(out.num_scheduled_tokens) == {"a": 32, "b": 32}
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_caching", "caching"])
def test_local_prefill_interval_is_in_scope(monitor, prefix_caching):
    """prefill_schedule_interval 3 on an engine without data parallelism (S:403-407,
    796-807): prefill is held until 3 executed steps have passed since the last
    step that carried one; a full prefix hit (one token left) is not held.
    Every call is compared, the cadence's state included."""
    s = build_scheduler(scheduler={"prefill_schedule_interval": 3}, prefix_caching=prefix_caching)
    tokens = list(range(500, 532))
    s.add_request(request("d", tokens=tokens, max_tokens=30, sampling={"ignore_eos": True}, sched=s))
    step(s)
    held = 0
    for k in range(6):
        s.add_request(request(f"p{k}", 20, max_tokens=3, sched=s))
        out = step(s)
        held += f"p{k}" not in out.num_scheduled_tokens
    assert held, "no step held a prefill back"
    s.add_request(request("hit", tokens=tokens, max_tokens=3, sched=s))
    step(s)
    run_to_completion(s)
    assert_all_checked(monitor.summary(), "add_request", "schedule", "update_from_output")


def test_structured_output_waits_are_in_scope(monitor):
    """0.33.0's grammar wait is the spec's (spec/structured_output.py): a request
    skipped while its grammar compiles, promoted once compiled, and one whose
    grammar failed finished with an error by the next update; every call that
    does not hand a grammar sampled tokens is checked."""
    from concurrent.futures import Future

    from vllm.sampling_params import StructuredOutputsParams

    from schedspec.reference.vllm_adapter import AcceptingGrammar

    s = build_scheduler()
    futures = {}
    for rid in ("g", "bad"):
        r = request(rid, 20, max_tokens=3, sampling={"structured_outputs": StructuredOutputsParams(regex="[ab]+")})
        futures[rid] = r.structured_output_request.grammar = Future()
        s.add_request(r)
    s.add_request(request("p", 20, max_tokens=3))
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"p"}
    futures["bad"].set_exception(RuntimeError("no grammar"))
    s.update_from_output(out, runner_output(out, {"p": [100]}))
    out = s.schedule()  # "bad" noted, "g" still compiling
    assert set(out.num_scheduled_tokens) == {"p"} and set(s.grammar_compile_error_reqs) == {"bad"}
    s.update_from_output(out, runner_output(out, {"p": [100]}))
    assert "bad" not in s.requests
    futures["g"].set_result(AcceptingGrammar())
    out = s.schedule()
    assert set(out.num_scheduled_tokens) == {"p", "g"}
    stats = monitor.summary()
    assert_all_checked(stats, "add_request", "schedule", "update_from_output")
    assert stats["calls"]["schedule"]["checked"] == 3


def test_shadow_classes_classify_as_installed_ones(shadow_monitor, monkeypatch):
    """ShadowScheduler / ShadowAsyncScheduler, vLLM's `scheduler_cls` route,
    classify the same way; plain vLLM classes are not watched without install()."""
    from vllm.config import LoRAConfig
    from vllm.lora.request import LoRARequest

    monkeypatch.setattr(scope, "newest_rules", lambda *feature: False)  # LoRA as on an earlier release

    lora = LoRAConfig(max_loras=1, max_lora_rank=8)
    for cls, async_scheduling in ((ShadowScheduler, False), (ShadowAsyncScheduler, True)):
        s = build_scheduler(cls=cls, async_scheduling=async_scheduling, lora_config=lora)
        s.add_request(request("plain", 20, max_tokens=2))
        s.add_request(request("lora", 20, max_tokens=2, lora_request=LoRARequest("adapter", 1, "/nonexistent")))
        run_to_completion(s)
    plain = build_scheduler()
    plain.add_request(request("unwatched", 20))
    stats = shadow_monitor.summary()
    assert set(stats["outside_scope"]) == {scope.LORA}
    assert stats["calls"]["add_request"]["checked"] == 2  # "plain" twice; "unwatched" not seen
    assert stats["calls"]["add_request"]["outside_scope"] == 2
    assert_clean(stats)


def holder_added(s) -> None:
    a, b, c = request("a", 4), request("b", 4), request("c", 4)
    b.status = RequestStatus.WAITING_FOR_REMOTE_KVS  # as vLLM's test_fcfs_mixed_blocked_types_* set it
    for r in (a, b, c):
        s.add_request(r)


def test_a_new_request_holding_kv_blocks_joins_the_holders_queue(monitor):
    """vLLM's add_request queues a request that holds KV blocks in kv_holding_waiting
    (S:2776-2787), ahead of those added before it; the spec among the holders at the
    front of `waiting` (kv_connector.queue_span).  Compared call by call."""
    s = build_scheduler()
    stats = watch(monitor, lambda: holder_added(s))
    assert [r.request_id for r in s.kv_holding_waiting] == ["b"] and len(s.waiting) == 2
    assert_all_checked(stats, "add_request")


def test_a_spec_queueing_a_holder_behind_the_others_diverges(monitor):
    s = build_scheduler()
    with mutated([Mutation("kv_connector.queue_span",
                           "(0, n) if holds_kv_blocks(requests[rid]) else (n, len(waiting))",
                           "(n, len(waiting))")], module="kv_connector"):
        stats = watch(monitor, lambda: holder_added(s))
    assert stats["divergences"], stats


def test_a_failed_loads_residue_is_outside_scope():
    """A failed asynchronous load recovered by recomputation leaves a request without
    blocks in the holders' queue, and its reservation counted until it is admitted
    (scope.failed_load_residue; seen in 0.34.0's
    test_cached_reservations_admit_like_on_demand_sum): a state the spec cannot hold."""
    from types import SimpleNamespace

    class Req:  # hashable, as vLLM's Request (the keys of _parked_reservations)
        def __init__(self, status: str, computed: int):
            self.num_computed_tokens, self.status = computed, SimpleNamespace(name=status)

        def is_finished(self) -> bool:
            return self.status.name.startswith("FINISHED")

    req = Req

    loading, promoted, reset = req("WAITING_FOR_REMOTE_KVS", 16), req("WAITING", 16), req("WAITING", 0)
    assert not scope.failed_load_residue(SimpleNamespace(kv_holding_waiting=[loading, promoted]))
    assert scope.failed_load_residue(SimpleNamespace(kv_holding_waiting=[reset, loading]))
    assert not scope.failed_load_residue(SimpleNamespace(_parked_reservations={loading: 3, promoted: 2}))
    assert scope.failed_load_residue(SimpleNamespace(_parked_reservations={reset: 5}))
    assert scope.failed_load_residue(SimpleNamespace(_inflight_prefills={reset}))
    assert not scope.failed_load_residue(SimpleNamespace(_inflight_prefills={req("RUNNING", 0)}))
