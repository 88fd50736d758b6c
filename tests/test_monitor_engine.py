"""The monitor under vLLM 0.33.0's own engine loop: `EngineCore.step` (sync) and
`EngineCore.step_with_batch_queue` (async scheduling, two batches in flight),
with the scheduler class vLLM's config names (`scheduler_cls` =
ShadowScheduler / ShadowAsyncScheduler) and a fake executor in place of the
model.

The EngineCore object is made with `EngineCore.__new__` and given the
attributes its scheduling loop reads (as EngineCore.__init__ sets them,
core.py:124-249); the real constructor would profile a model and freeze the
process's GC heap and environment cache.  Everything the tests run is vLLM's
own code: preprocess_add_request / add_request, abort_requests and the aborts
queue, step / step_with_batch_queue, post_step.
"""

from __future__ import annotations

import queue
from collections import deque
from concurrent.futures import Future

import pytest

from monitor_helpers import assert_clean, block_hasher, build_scheduler, prompt, require_vllm, runner_output, \
    sampled_for, shadow_monitor, vllm_config

require_vllm()

from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine import EngineCoreRequest, FinishReason  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT  # noqa: E402

import schedspec.monitor.monitor as monitor_module  # noqa: E402
from schedspec.monitor import shadow  # noqa: E402
from schedspec.monitor.monitor import Monitor, MonitorError, SpecDivergence  # noqa: E402
from schedspec.monitor.shadow import ShadowAsyncScheduler, ShadowScheduler  # noqa: E402
from mutants import Mutation, mutated  # noqa: E402

__all__ = ["shadow_monitor"]  # a fixture, imported for pytest

STOP_TOKEN = 77
MODES = [pytest.param(False, id="sync"), pytest.param(True, id="async")]
# How the monitor checks each call: the whole state lifted before and after it, as
# peer-tests runs; and what an engine runs by default, the spec's state carried and
# only what the call changed read (monitor/incremental.py), here with a full check
# every 7 calls so that a run has both kinds.
CHECKS = [pytest.param({"relift": True}, id="full"),
          pytest.param({"relift": False, "check": "incremental", "full_every": 7}, id="incremental")]


@pytest.fixture(params=CHECKS)
def engine_monitor(request, shadow_monitor):
    """The default monitor (count), checking as the parameter says."""
    mon = Monitor("count", **request.param)
    shadow.set_default_monitor(mon)
    return mon


# -- a model-less executor and an EngineCore around a scheduler ------------------------


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


class FakeExecutor:
    """The executor calls EngineCore makes in 0.33.0 (core.py:667-822):
    `execute_model(scheduler_output, non_block=True)` returns a future of None
    while a batch awaits `sample_tokens` (or of the empty output for a batch
    of no tokens); `sample_tokens(grammar_output, non_block)` returns the
    ModelRunnerOutput, or a future of it.  The "model" samples token 100 for
    every request whose chunk reaches its last known token (nothing for a
    non-final prefill chunk), and STOP_TOKEN as the `stop_after`-th output of
    the requests listed there."""

    def __init__(self, sched, stop_after: dict[str, int] | None = None):
        self.sched = sched
        self.stop_after = dict(stop_after or {})
        self.pending: deque = deque()  # outputs awaiting sample_tokens, FIFO
        self.emitted: dict[str, int] = {}
        self.executed = 0
        # What the run went through, for the tests to check it was not trivial.
        self.preempted: set[str] = set()
        self.prefix_hits: dict[str, int] = {}
        self.max_placeholders = 0  # 2 once a request is in two batches in flight

    def execute_model(self, scheduler_output, non_block: bool = False):
        self.executed += 1
        self.preempted |= set(scheduler_output.preempted_req_ids)
        self.prefix_hits.update((d.req_id, d.num_computed_tokens) for d in scheduler_output.scheduled_new_reqs
                                if d.num_computed_tokens)
        self.max_placeholders = max([self.max_placeholders] +
                                    [r.num_output_placeholders for r in self.sched.requests.values()])
        if scheduler_output.total_num_scheduled_tokens == 0:
            result = EMPTY_MODEL_RUNNER_OUTPUT
        else:
            sampled = sampled_for(self.sched, scheduler_output)
            for rid in sampled:
                self.emitted[rid] = self.emitted.get(rid, 0) + 1
                if self.emitted[rid] == self.stop_after.get(rid):
                    sampled[rid] = [STOP_TOKEN]
            self.pending.append(runner_output(scheduler_output, sampled))
            result = None
        return _done(result) if non_block else result

    def sample_tokens(self, grammar_output, non_block: bool = False):
        out = self.pending.popleft()
        return _done(out) if non_block else out

    def take_draft_token_ids(self):
        return None


def make_engine(async_scheduling: bool, *, prefix_caching: bool = False, num_blocks: int = 6,
                stop_after: dict[str, int] | None = None) -> EngineCore:
    """An EngineCore over a monitored scheduler of the class vLLM's config names."""
    cls = ShadowAsyncScheduler if async_scheduling else ShadowScheduler
    vc = vllm_config(async_scheduling=async_scheduling, prefix_caching=prefix_caching, max_num_batched_tokens=32,
                     max_num_seqs=4, scheduler={"scheduler_cls": f"{cls.__module__}.{cls.__qualname__}"})
    # The class EngineCore.__init__ builds (core.py:167), from the config's name.
    assert vc.scheduler_config.get_scheduler_cls() is cls
    sched = build_scheduler(vc, num_blocks=num_blocks)

    e = EngineCore.__new__(EngineCore)
    e.vllm_config = vc
    e.log_stats = True
    e._weight_version = "default"
    e.model_executor = FakeExecutor(sched, stop_after)
    e._pooler_config_logged = False
    e.available_gpu_memory_for_kv_cache = -1
    e.structured_output_manager = sched.structured_output_manager
    e.scheduler = sched
    e.use_spec_decode = vc.speculative_config is not None
    e.check_for_draft_tokens = e.use_spec_decode or vc.model_config.is_diffusion
    e.mm_receiver_cache = None
    e.batch_queue_size = vc.max_concurrent_batches
    e.batch_queue = deque(maxlen=e.batch_queue_size) if e.batch_queue_size > 1 else None
    e.is_mm_encoder_only = vc.is_mm_encoder_only
    e.is_pooling_model = vc.model_config.runner_type == "pooling"
    e.request_block_hasher = block_hasher(sched) if prefix_caching else None
    # 0.34.0: the front end's prompt block hashes are taken when it sends them (core.py:233-252,
    # 1287); these requests carry none, so none is configured and the engine's hasher makes them.
    e.prefix_hash_config = None
    e.step_fn = e.step if e.batch_queue is None else e.step_with_batch_queue
    e.async_scheduling = vc.scheduler_config.async_scheduling
    e.aborts_queue = queue.Queue()
    e._idle_state_callbacks = []
    assert (e.batch_queue_size == 2) == async_scheduling
    return e


def submit(engine: EngineCore, rid: str, n: int, max_tokens: int, tokens: list[int] | None = None) -> None:
    """A request as the front end sends it, through EngineCore's own add path."""
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN])
    req = EngineCoreRequest(request_id=rid, prompt_token_ids=tokens or prompt(n), mm_features=None,
                            sampling_params=params, pooling_params=None, arrival_time=float(len(rid)),
                            lora_request=None, cache_salt=None, data_parallel_rank=None)
    engine.add_request(*engine.preprocess_add_request(req))


def run(engine: EngineCore, on_step=None, limit: int = 400) -> dict[str, tuple[int, FinishReason | None]]:
    """Steps the engine as EngineCoreProc's busy loop does (core.py:1621-1696)
    until it holds no request and no batch; each request's (tokens, finish reason)."""
    seen: dict[str, tuple[int, FinishReason | None]] = {}
    n = 0
    while engine.scheduler.has_requests() or engine.batch_queue:
        assert n < limit, "the engine did not drain"
        if on_step is not None:
            on_step(n)
        outputs, executed = engine.step_fn()
        for eco in (outputs or {}).values():
            for o in eco.outputs:
                tokens, _ = seen.get(o.request_id, (0, None))
                seen[o.request_id] = (tokens + len(o.new_token_ids), o.finish_reason)
        engine.post_step(executed)
        n += 1
    return seen


def workload(engine: EngineCore) -> dict[str, tuple[int, FinishReason | None]]:
    """Six requests, a pool small enough to preempt, a stop token, an abort
    through the aborts queue (taken mid-step) and one through abort_requests."""
    shared = prompt(40)
    for i in range(6):
        submit(engine, f"r{i}", 30 + 5 * i, max_tokens=6 + i, tokens=shared if i in (1, 3) else None)

    def on_step(n):
        if n == 3:
            engine.aborts_queue.put(["r4"])
        if n == 5:
            engine.abort_requests(["r5", "not-a-request"])
    return run(engine, on_step)


def assert_served(engine: EngineCore, results) -> None:
    """Every request finished as vLLM decides, whatever the monitor did: by
    length, by the stop token, or aborted (the engine process, not
    update_from_output, reports an abort, core.py:2270), and none is left."""
    for rid in ("r0", "r2", "r3"):
        assert results[rid] == (6 + int(rid[1]), FinishReason.LENGTH), rid
    assert results["r1"] == (2, FinishReason.STOP)  # STOP_TOKEN as its 2nd output
    for rid in ("r4", "r5"):
        tokens, reason = results.get(rid, (0, None))
        assert reason is None and tokens < 6 + int(rid[1]), rid
    assert not engine.scheduler.requests and not engine.scheduler.has_requests()


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["no_caching", "caching"])
@pytest.mark.parametrize("async_scheduling", MODES)
def test_engine_run_is_checked_throughout(engine_monitor, async_scheduling, prefix_caching):
    engine = make_engine(async_scheduling, prefix_caching=prefix_caching, stop_after={"r1": 2})
    results = workload(engine)
    assert_served(engine, results)
    stats = engine_monitor.summary()
    assert_clean(stats)
    assert stats["outside_scope"] == {}
    calls = stats["calls"]
    executed = engine.model_executor.executed
    assert calls["add_request"]["total"] == calls["add_request"]["checked"] == 6
    assert calls["schedule"]["total"] == calls["schedule"]["checked"] == executed  # one batch per schedule
    assert calls["update_from_output"]["total"] == calls["update_from_output"]["checked"] == executed
    assert calls["finish_requests"]["total"] == calls["finish_requests"]["checked"] == 2
    if engine_monitor.check_mode == "incremental":  # most calls were checked by their reads alone
        checked = sum(c["checked"] for c in calls.values())
        assert stats["incremental"]["unconfirmed"] == []
        assert checked // 7 <= stats["incremental"]["full_checks"] < checked // 3, (stats["incremental"], checked)
    ex = engine.model_executor  # the run was not a trivial one
    assert ex.preempted
    assert bool(ex.prefix_hits) == prefix_caching
    assert ex.max_placeholders == (2 if async_scheduling else 0)  # async: two batches in flight


# The spec's length stop one token late: vLLM finishes a request the spec keeps.
LATE_LENGTH_STOP = Mutation("scheduler.check_stop", "request.num_output_tokens >= request.max_tokens",
                            "request.num_output_tokens > request.max_tokens")


@pytest.mark.parametrize("async_scheduling", MODES)
def test_planted_divergence_is_counted_and_the_engine_serves_on(engine_monitor, async_scheduling):
    engine = make_engine(async_scheduling, stop_after={"r1": 2})
    with mutated([LATE_LENGTH_STOP]):
        results = workload(engine)
    assert_served(engine, results)
    stats = engine_monitor.summary()
    assert stats["monitor_errors"] == []
    # One divergence per request vLLM finished by length: at that update the
    # spec finishes nothing; the calls after it are judged from vLLM's state.
    divergences = [(d["call"], d["field"], d["spec"], d["vllm"]) for d in stats["divergences"]]
    assert divergences == [("update_from_output", "result.finished", [], [[rid, "FINISHED_LENGTH_CAPPED"]])
                           for rid in ("r0", "r2", "r3")]
    assert stats["calls"]["update_from_output"]["checked"] == stats["calls"]["update_from_output"]["total"]


@pytest.mark.parametrize("async_scheduling", MODES)
def test_planted_divergence_raises_under_policy_raise(shadow_monitor, async_scheduling):
    shadow.set_default_monitor(Monitor("raise"))
    engine = make_engine(async_scheduling)
    submit(engine, "a", 20, max_tokens=3)
    with mutated([LATE_LENGTH_STOP]), pytest.raises(SpecDivergence, match="update_from_output"):
        run(engine)
    assert "a" not in engine.scheduler.requests  # vLLM's call ran (and freed it); the check came after
    # The unmutated spec agrees with the same engine from where it stands.
    submit(engine, "b", 20, max_tokens=3)
    run(engine)
    assert len(shadow.default_monitor().summary()["divergences"]) == 1 and not engine.scheduler.requests


def _planted(*args, **kwargs):
    raise RuntimeError("planted lift failure")


@pytest.mark.parametrize("async_scheduling", MODES)
def test_planted_monitor_error_is_counted_and_the_engine_serves_on(shadow_monitor, monkeypatch,
                                                                   async_scheduling):
    monkeypatch.setattr(monitor_module, "lift_state", _planted)
    engine = make_engine(async_scheduling, stop_after={"r1": 2})
    results = workload(engine)
    assert_served(engine, results)
    stats = shadow_monitor.summary()
    assert stats["divergences"] == []
    errors = stats["monitor_errors"]
    total = sum(n["total"] for n in stats["calls"].values())
    assert len(errors) == total > 0  # every call lifts its pre-state first
    assert all(n["monitor_error"] == n["total"] and n["checked"] == 0 for n in stats["calls"].values() if n["total"])
    assert all("RuntimeError: planted lift failure" in e["error"] for e in errors)


@pytest.mark.parametrize("async_scheduling", MODES)
def test_monitor_error_after_the_call_is_counted_too(shadow_monitor, monkeypatch, async_scheduling):
    """The lift of vLLM's output fails once schedule() has run: the schedule
    calls are errors, the rest still checked, the engine unaffected."""
    monkeypatch.setattr(monitor_module, "lift_output", _planted)
    engine = make_engine(async_scheduling, stop_after={"r1": 2})
    assert_served(engine, workload(engine))
    stats = shadow_monitor.summary()
    calls = stats["calls"]
    assert calls["schedule"]["monitor_error"] == calls["schedule"]["total"] > 0
    for call in ("add_request", "update_from_output", "finish_requests"):
        assert calls[call]["checked"] == calls[call]["total"] > 0, call
    assert stats["divergences"] == []


@pytest.mark.parametrize("async_scheduling", MODES)
def test_planted_monitor_error_raises_under_policy_raise(shadow_monitor, monkeypatch, async_scheduling):
    shadow.set_default_monitor(Monitor("raise"))
    engine = make_engine(async_scheduling)
    monkeypatch.setattr(monitor_module, "lift_state", _planted)
    with pytest.raises(MonitorError, match="add_request #1: RuntimeError: planted lift failure"):
        submit(engine, "a", 20, max_tokens=3)
    monkeypatch.undo()
    submit(engine, "a", 20, max_tokens=3)  # as the request's first add never reached vLLM
    monkeypatch.setattr(monitor_module, "lift_state", _planted)
    with pytest.raises(MonitorError, match="schedule #3"):
        engine.step_fn()
    stats = shadow.default_monitor().summary()
    assert [e["call"] for e in stats["monitor_errors"]] == ["add_request", "schedule"]
    assert stats["divergences"] == []


# -- the incremental check: what it reads, what the full check every K calls adds ----------

K = 7


def first_divergence(stats: dict) -> dict:
    assert stats["divergences"], "no divergence reported"
    return stats["divergences"][0]


@pytest.mark.parametrize("async_scheduling", MODES)
def test_a_rule_changed_in_vllm_is_reported_by_the_incremental_check_within_k_calls(shadow_monitor, monkeypatch,
                                                                                  async_scheduling):
    """vLLM's KV manager planted with another free order (a request's blocks freed
    head first, not tail first, T:603-604): the full check after every call reports
    it at some call; the incremental check reports it there or within K calls, after
    confirming it with a full lift, and says since when the state was carried.  In
    this small pool its reads of the free queue's ends see the change at once: with
    no periodic full check at all it is reported at the same call."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    monkeypatch.setattr(SingleTypeKVCacheManager, "free",
                        lambda self, rid: self.block_pool.free_blocks(self.pop_blocks_for_free(rid)))
    first = {}
    for name, options in (("full", {"check": "full"}), ("incremental", {"check": "incremental", "full_every": K}),
                          ("reads only", {"check": "incremental", "full_every": 10 ** 6})):
        mon = Monitor("count", relift=False, **options)
        shadow.set_default_monitor(mon)
        workload(make_engine(async_scheduling, prefix_caching=True, stop_after={"r1": 2}))
        assert mon.summary()["monitor_errors"] == []
        first[name] = first_divergence(mon.summary())
    full, inc = first["full"], first["incremental"]
    assert full["field"].startswith("post_state.kv_cache"), full
    assert full["call_number"] <= inc["call_number"] < full["call_number"] + K, (full, inc)
    assert inc["last_full_check"] is not None and inc["last_full_check"] < inc["call_number"]
    assert (first["reads only"]["call_number"], first["reads only"]["field"]) == (full["call_number"], full["field"])


def test_a_difference_the_full_lift_does_not_confirm_is_no_divergence(shadow_monitor, monkeypatch):
    """An incremental read that disagrees with the spec where the full lift agrees is
    the reader's fault: counted as unconfirmed, with what it read, and never reported
    as a divergence."""
    from schedspec.monitor import incremental
    from schedspec.monitor.check import Difference

    real = incremental.check_delta
    planted = []

    def misread(sched, pre, post, named, gone=None):
        difference, carried = real(sched, pre, post, named, gone)
        if not planted and difference is None and post.running:
            planted.append(1)
            return Difference("post_state.running", list(post.running), ["misread"]), carried
        return difference, carried
    monkeypatch.setattr(incremental, "check_delta", misread)
    mon = Monitor("count", relift=False, check="incremental", full_every=10 ** 6)
    shadow.set_default_monitor(mon)
    engine = make_engine(False)
    submit(engine, "a", 20, max_tokens=3)
    run(engine)
    stats = mon.summary()
    assert planted and stats["divergences"] == [] and stats["monitor_errors"] == []
    assert [u["field"] for u in stats["incremental"]["unconfirmed"]] == ["post_state.running"]
    assert stats["incremental"]["full_checks"] == 1


def swap_two_free_blocks_mid_queue(engine: EngineCore) -> tuple[int, int]:
    """Two neighbouring blocks in the middle of vLLM's free queue trade places (the
    queue's links rewired, kv_cache_utils.py:486-505): a change at no end of it."""
    queue = engine.scheduler.kv_cache_manager.block_pool.free_block_queue
    b = queue.fake_free_list_head.next_free_block
    for _ in range(queue.num_free_blocks // 2):
        b = b.next_free_block
    a, b = b, b.next_free_block
    before, after = a.prev_free_block, b.next_free_block
    before.next_free_block, b.prev_free_block, b.next_free_block = b, before, a
    a.prev_free_block, a.next_free_block, after.prev_free_block = b, after, a
    return a.block_id, b.block_id


@pytest.mark.parametrize("async_scheduling", MODES)
def test_what_the_reads_cannot_see_the_periodic_full_check_reports(shadow_monitor, async_scheduling):
    """Two blocks swapped mid-queue in a 64-block pool: no incremental read covers
    that part of the queue, so the monitor says nothing until its next full check,
    within K calls, which reports it; with no full check in the run, nothing is said
    (the limit the periodic check is there for)."""
    seen = {}
    for every in (K, 10 ** 6):
        mon = Monitor("count", relift=False, check="incremental", full_every=every)
        shadow.set_default_monitor(mon)
        engine = make_engine(async_scheduling, prefix_caching=True, num_blocks=64)
        for i in range(3):
            submit(engine, f"r{i}", 20, max_tokens=12)
        at = {}

        def on_step(n):
            if n == 3:
                at["call"], at["blocks"] = mon.stats.call_number, swap_two_free_blocks_mid_queue(engine)
        run(engine, on_step)
        assert mon.summary()["monitor_errors"] == [] and at
        seen[every] = (at, mon.summary())
    at, stats = seen[K]
    d = first_divergence(stats)
    assert d["field"] == "post_state.kv_cache.free_queue", d
    assert at["call"] < d["call_number"] <= at["call"] + K, (at, d)
    assert seen[10 ** 6][1]["divergences"] == []
    assert seen[10 ** 6][1]["incremental"]["full_checks"] == 0


def test_the_environment_chooses_the_check_and_a_bad_value_names_its_variable():
    """An engine's monitor comes from SCHEDSPEC_MONITOR_*: incremental by default, full
    when asked or when every pre-state is relifted; a bad value is one line naming
    the variable."""
    from schedspec.monitor.shadow import monitor_from_environment

    assert (monitor_from_environment({}).check_mode, monitor_from_environment({}).full_every) == ("incremental", 256)
    assert monitor_from_environment({"SCHEDSPEC_MONITOR_CHECK": "full"}).check_mode == "full"
    assert monitor_from_environment({"SCHEDSPEC_MONITOR_RELIFT": "1"}).check_mode == "full"
    assert monitor_from_environment({"SCHEDSPEC_MONITOR_FULL_EVERY": "9"}).full_every == 9
    for env, variable in (({"SCHEDSPEC_MONITOR_CHECK": "fast"}, "SCHEDSPEC_MONITOR_CHECK"),
                          ({"SCHEDSPEC_MONITOR_RELIFT": "1", "SCHEDSPEC_MONITOR_CHECK": "incremental"},
                           "SCHEDSPEC_MONITOR_CHECK"),
                          ({"SCHEDSPEC_MONITOR_FULL_EVERY": "0"}, "SCHEDSPEC_MONITOR_FULL_EVERY"),
                          ({"SCHEDSPEC_MONITOR_FULL_EVERY": "x"}, "SCHEDSPEC_MONITOR_FULL_EVERY"),
                          ({"SCHEDSPEC_MONITOR_POLICY": "shout"}, "SCHEDSPEC_MONITOR_POLICY"),
                          ({"SCHEDSPEC_MONITOR_RECORD": "all"}, "SCHEDSPEC_MONITOR_RECORD")):
        with pytest.raises(ValueError) as e:
            monitor_from_environment(env)
        assert str(e.value).startswith(f"{variable}: ") and "\n" not in str(e.value), (env, str(e.value))


@pytest.mark.parametrize("async_scheduling", MODES)
def test_a_prompt_that_repeats_generated_tokens_hits_them_under_the_incremental_check(shadow_monitor,
                                                                                       async_scheduling):
    """A second turn: request b's prompt is a's prompt and the tokens a generated.  The
    blocks a filled with generated tokens were hashed by the spec in the carried state
    (its hash, not vLLM's) and renamed to vLLM's after the call: b's prefix hit covers
    them on both sides, with no full check in the run to put the state right.  (Carried
    without the renaming, the spec finds no such hit: this test fails.)"""
    mon = Monitor("count", relift=False, check="incremental", full_every=10 ** 6)
    shadow.set_default_monitor(mon)
    engine = make_engine(async_scheduling, prefix_caching=True, num_blocks=40)
    first = prompt(20)
    submit(engine, "a", 20, max_tokens=30, tokens=first)
    run(engine)
    generated = [100] * 30  # FakeExecutor samples token 100
    submit(engine, "b", 50, max_tokens=2, tokens=first + generated)
    run(engine)
    stats = mon.summary()
    assert_clean(stats)
    assert stats["incremental"] == {"full_checks": 0, "unconfirmed": []}
    # b's hit reaches past a's prompt (20 tokens) into the blocks a filled with its outputs.
    assert engine.model_executor.prefix_hits["b"] >= 3 * engine.scheduler.block_size > len(first), \
        engine.model_executor.prefix_hits


@pytest.mark.parametrize("async_scheduling", MODES)
def test_incremental_divergences_and_recorded_calls_are_vectors_that_replay(shadow_monitor, tmp_path,
                                                                            async_scheduling):
    """Under the incremental check a call's pre-state is the spec's carried one: written
    as a state vector it is still one the published format accepts, whose expected
    answer the (mutated) spec gives again, and every call recorded replays on the spec."""
    from schedspec.reference.impl import SpecScheduler
    from schedspec.reference.state_json import state_from_json
    from schedspec.reference.vectors import apply_call, check_vector, read_vector

    mon = Monitor("count", tmp_path / "div", relift=False, check="incremental", full_every=K)
    shadow.set_default_monitor(mon)
    with mutated([LATE_LENGTH_STOP]):
        workload(make_engine(async_scheduling, prefix_caching=True, stop_after={"r1": 2}))
    divergences = mon.summary()["divergences"]
    assert divergences and all(d["vector"] and d["last_full_check"] is not None for d in divergences)
    with mutated([LATE_LENGTH_STOP]):
        for d in divergences:
            v = read_vector(d["vector"])
            assert apply_call(state_from_json(v["pre_state"]), v["call"])[0] == v["expected"]
    mon = Monitor("count", tmp_path / "all", relift=False, check="incremental", full_every=K, record_all=True)
    shadow.set_default_monitor(mon)
    workload(make_engine(async_scheduling, prefix_caching=True, stop_after={"r1": 2}))
    files = sorted((tmp_path / "all").glob("*.json"))
    assert len(files) == sum(c["checked"] for c in mon.summary()["calls"].values()) > 30
    spec = SpecScheduler()
    for f in files:
        assert check_vector(read_vector(f), spec) == [], f


@pytest.mark.parametrize("async_scheduling", MODES)
def test_a_preempted_request_requeued_at_the_back_is_seen_by_the_queue_reads(shadow_monitor, monkeypatch,
                                                                             async_scheduling):
    """vLLM planted with a preempted request put at the back of the waiting queue, not
    at its front (S:1896): the waiting order is what differs first.  The incremental
    check's read of the queues reports it at the call the full check does, with no
    periodic full check in the run."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue

    monkeypatch.setattr(FCFSRequestQueue, "prepend_request", FCFSRequestQueue.add_request)
    first = {}
    for name, options in (("full", {"check": "full"}), ("reads only", {"check": "incremental", "full_every": 10 ** 6})):
        mon = Monitor("count", relift=False, **options)
        shadow.set_default_monitor(mon)
        engine = make_engine(async_scheduling, stop_after={"r1": 2})
        workload(engine)
        assert engine.model_executor.preempted and mon.summary()["monitor_errors"] == []
        first[name] = first_divergence(mon.summary())
    assert first["full"]["field"] == "post_state.waiting", first["full"]
    assert (first["reads only"]["call_number"], first["reads only"]["field"]) == \
        (first["full"]["call_number"], first["full"]["field"])
