"""The runtime monitor (monitor/) on vLLM's own scheduler.

- `lift` is exact: a vLLM scheduler and the spec run side by side on the
  adapter's random campaigns, and after every call lift(vLLM's state) equals the
  spec's state (block hashes up to the one-to-one renaming check.py explains).
- Under the monitor, every call of those campaigns is checked (none outside
  scope), with no divergence and no monitor error.
- The monitor is not vacuous: spec mutants, one per call, are each reported as
  a divergence; the policies raise, log and count; a monitor error never
  reaches vLLM's caller unless the policy is raise.
"""

from __future__ import annotations

import logging

import pytest

from schedspec.monitor.check import Difference, compare_states, jsonable, renamed
from schedspec.reference.campaign import random_scenarios
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL
from schedspec.reference.impl import SpecScheduler
from schedspec.spec.block_pool import BlockPool
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.request import Request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

NUM_SCENARIOS = 40
SEED = 5


@pytest.fixture()
def shadow(vllm):
    """The monitor installed on vLLM's classes for one test."""
    from schedspec.monitor import shadow as module

    yield module
    module.uninstall()
    module.set_default_monitor(None)


def campaign(impl, n: int = NUM_SCENARIOS, seed: int = SEED):
    for scenario, _ in random_scenarios(n, seed, FLAGS_ALL):
        trace = run_scenario(scenario, impl)
        assert "error" not in trace, trace["error"]


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    campaign(both)
    assert both.calls > 3000 and both.rename, "the campaign must make calls and hash blocks"


def test_every_call_of_the_campaigns_is_checked(shadow, vllm):
    monitor = shadow.install("count")
    campaign(vllm)
    s = monitor.summary()
    for call, counts in s["calls"].items():
        assert counts["total"] > 0, call
        assert counts["checked"] == counts["total"], (call, counts)
    assert s["outside_scope"] == {}
    assert s["divergences"] == [] and s["monitor_errors"] == []


# One mutant per call: each changes the spec's answer on states the campaign reaches.
MUTANTS = {
    "schedule": Mutation("scheduler.schedule", "not s.preempted and s.pause_state != PAUSED_ALL", "True"),
    "update_from_output": Mutation("scheduler.check_stop", "request.num_output_tokens >= request.max_tokens",
                                   "request.num_output_tokens > request.max_tokens"),
    "add_request": Mutation("scheduler.add_request",
                            "enqueue(state.config.policy, waiting, requests, request.request_id, front=False)",
                            "enqueue(state.config.policy, waiting, requests, request.request_id, front=True)"),
    # an abort of a waiting request ignored
    "finish_requests": Mutation("scheduler.finish_requests", "x in state.requests", "x in state.running"),
}


@pytest.mark.parametrize("call", sorted(MUTANTS))
def test_a_spec_mutant_is_reported_on_its_call(shadow, vllm, call):
    monitor = shadow.install("count")
    with mutated([MUTANTS[call]]):
        campaign(vllm, n=20)
    s = monitor.summary()
    found = [d for d in s["divergences"] if d["call"] == call]
    assert found, f"the {call} mutant went unnoticed: {s['calls']}"
    d = found[0]
    assert d["field"] and "spec" in d and "vllm" in d and d["spec"] != d["vllm"]
    assert s["monitor_errors"] == []


def test_each_divergence_is_written_as_a_state_vector(shadow, vllm, tmp_path):
    from schedspec.reference.vectors import apply_call, read_vector
    from schedspec.reference.state_json import state_from_json

    monitor = shadow.install("count", vectors_dir=str(tmp_path))
    with mutated([MUTANTS["update_from_output"], MUTANTS["add_request"]]):
        campaign(vllm, n=3)
        divergences = monitor.summary()["divergences"]
        assert divergences and all(d["vector"] for d in divergences)
        for d in divergences:
            v = read_vector(d["vector"])  # the published format, schema and rules
            assert v["call"]["name"] == d["call"] and v["observed"]["post_state"] != v["post_state"] \
                or v["observed"]["result"] != v["expected"]
            # `expected` is the (mutated) spec's answer on the pre-state: replaying it agrees
            result, post = apply_call(state_from_json(v["pre_state"]), v["call"])
            assert result == v["expected"]
    # vLLM's side, replayed on the unmutated spec, is what the spec says
    for d in divergences[:5]:
        v = read_vector(d["vector"])
        result, post = apply_call(state_from_json(v["pre_state"]), v["call"])
        assert result == v["observed"]["result"] or d["field"].startswith("post_state")


def test_a_monitored_run_recorded_as_vectors_replays_on_the_spec(shadow, vllm, tmp_path):
    from schedspec.reference.vectors import check_vector, read_vector

    monitor = shadow.install("count", vectors_dir=str(tmp_path), record_all=True)
    campaign(vllm, n=2)
    s = monitor.summary()
    checked = sum(c["checked"] for c in s["calls"].values())
    files = sorted(tmp_path.glob("*.json"))
    assert checked > 50 and len(files) == checked and s["monitor_errors"] == []
    spec = SpecScheduler()
    for f in files[::7]:
        assert check_vector(read_vector(f), spec) == [], f


def test_policy_raise_stops_at_the_divergence(shadow, vllm):
    shadow.install("raise")
    with mutated([MUTANTS["update_from_output"]]), pytest.raises(AssertionError, match="diverges from the spec"):
        campaign(vllm, n=20)


def test_policy_log_warns_and_counts(shadow, vllm, caplog):
    monitor = shadow.install("log")
    with mutated([MUTANTS["add_request"]]), caplog.at_level(logging.WARNING, logger="schedspec.monitor"):
        campaign(vllm, n=3)
    n = len(monitor.summary()["divergences"])
    assert n > 0 and sum("diverges from the spec" in r.getMessage() for r in caplog.records) == n


def test_a_monitor_error_never_reaches_vllm_unless_policy_raise(shadow, vllm, monkeypatch):
    import schedspec.monitor.monitor as monitor_module
    from schedspec.monitor.monitor import MonitorError

    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(monitor_module, "lift_state", broken)
    monitor = shadow.install("count")
    plain = SpecScheduler()
    for scenario, _ in random_scenarios(3, SEED, FLAGS_ALL):  # vLLM still serves, and serves the same
        assert run_scenario(scenario, vllm)["summary"] == run_scenario(scenario, plain)["summary"]
    s = monitor.summary()
    assert s["divergences"] == [] and s["monitor_errors"]
    assert all("planted" in e["error"] for e in s["monitor_errors"])
    assert sum(c["monitor_error"] for c in s["calls"].values()) == len(s["monitor_errors"])
    shadow.install("raise")
    with pytest.raises(MonitorError, match="planted"):
        campaign(vllm, n=1)


def test_labels_split_the_figures(shadow, vllm):
    monitor = shadow.install("count")
    monitor.begin("first")
    campaign(vllm, n=2)
    first = monitor.end()
    monitor.begin("second")
    second = monitor.end()
    assert first["calls"]["schedule"]["checked"] > 0
    assert all(c["total"] == 0 for c in second["calls"].values())
    assert monitor.summary()["calls"]["schedule"]["total"] >= first["calls"]["schedule"]["total"]


# -- the comparison itself, on spec values -------------------------------------


def pool_state(hashes: tuple, front=(), back=(), next_fresh=4) -> SchedulerState:
    c = SchedulerConfig(num_gpu_blocks=4, block_size=2, max_model_len=6, max_num_batched_tokens=6,
                        enable_prefix_caching=True)
    r = Request("a", num_prompt_tokens=2, max_tokens=3, prompt_token_ids=(5, 6), block_hashes=hashes)
    pool = BlockPool(4, free_front=front, next_fresh=next_fresh, free_back=back, ref_cnt={1: 1},
                     req_to_blocks={"a": (1,)})
    return SchedulerState(c, {"a": r}, ("a",), (), pool)


def test_free_queue_compared_as_one_sequence():
    a = pool_state((), front=(2, 3), next_fresh=4)
    b = pool_state((), front=(2,), next_fresh=3)  # the same queue: 2, then fresh 3
    assert compare_states(a, a, b) is None
    c = pool_state((), front=(3, 2), next_fresh=4)
    d = compare_states(a, a, c)
    assert isinstance(d, Difference) and d.field == "post_state.kv_cache.free_queue"


def test_new_hashes_compare_up_to_renaming_old_ones_exactly():
    pre = pool_state(())
    spec, vllm = pool_state((b"s1",)), pool_state((b"v1",))
    assert compare_states(pre, spec, vllm) is None  # made in the call: renamed
    d = compare_states(spec, spec, vllm)  # existed before the call: must be equal
    assert d is not None and d.field == "post_state.requests.a.block_hashes"
    assert d.spec == [b"s1".hex()] and d.vllm == [b"v1".hex()]


def test_jsonable():
    from schedspec.spec.request import RequestStatus

    assert jsonable({"x": (b"\x01", RequestStatus.RUNNING)}) == {"x": ["01", "RUNNING"]}


@pytest.mark.parametrize("token,status", [(7, "FINISHED_STOPPED"), (9, "FINISHED_STOPPED"), (100, None)])
def test_stop_tokens_and_eos_as_vllm_reads_them(shadow, vllm, token, status):
    """check_stop: the request's own EOS id and stop token ids (U:101-112), lifted
    from vLLM's SamplingParams; vLLM and the spec agree under the monitor."""
    monitor = shadow.install("count")
    both = Both(vllm)
    both.reset(SchedulerConfig(max_model_len=64, num_gpu_blocks=20, max_num_batched_tokens=64, max_num_seqs=8))
    both.add_request(Request("a", num_prompt_tokens=4, max_tokens=5, eos_token_id=9, stop_token_ids=(7,)))
    out = both.schedule()
    finished = both.update_from_output(out, {"a": [token]})
    assert [(rid, st.name) for rid, st in finished] == ([("a", status)] if status else [])
    s = monitor.summary()
    assert s["divergences"] == [] and s["calls"]["update_from_output"]["checked"] == 1


@pytest.mark.parametrize("call", ["schedule", "update_from_output"])
def test_a_divergence_comes_with_a_scenario_that_replays_it(shadow, vllm, tmp_path, call):
    """Watched from its start, a run is rebuilt as a scenario file; it is written
    only because vLLM and the (here mutated) spec diverge on it too."""
    from schedspec.reference.compare import compare_runs
    from schedspec.reference.scenario import load_scenario

    monitor = shadow.install("count", vectors_dir=str(tmp_path))
    with mutated([MUTANTS[call]]):
        campaign(vllm, n=20)
        found = [d for d in monitor.summary()["divergences"] if d["scenario"]]
        assert found, [d.get("scenario_note") for d in monitor.summary()["divergences"]][:3]
        scenario = load_scenario(found[0]["scenario"])
        assert compare_runs(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None
    # the unmutated spec agrees with vLLM on it: the file shows the mutant's mistake
    assert compare_runs(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is None


def test_no_scenario_for_a_scheduler_not_watched_from_its_start(shadow, vllm, tmp_path):
    from schedspec.spec.input_processor import make_request

    vllm.reset(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64, num_gpu_blocks=20))

    vllm.add_request(make_request(vllm.config, "early", 8, 4))  # before the monitor
    monitor = shadow.install("count", vectors_dir=str(tmp_path))
    with mutated([MUTANTS["add_request"]]):
        vllm.add_request(make_request(vllm.config, "late", 8, 4))
    (d,) = monitor.summary()["divergences"]
    assert d["scenario"] is None and "start" in d["scenario_note"]


def test_the_lift_check_catches_a_broken_lift(vllm, monkeypatch):
    """The side-by-side lift test is not vacuous: a lift that miscounts the free
    blocks by one fails it at the first call that allocates."""
    from schedspec.reference import vllm_lift
    from schedspec.spec.kv_cache import BlockCounts

    real = vllm_lift.lift_block_counts
    monkeypatch.setattr(vllm_lift, "lift_block_counts",
                        lambda sched: (lambda c: BlockCounts(c.num_free_blocks - 1, c.req_to_num_blocks))(real(sched)))
    with pytest.raises(AssertionError, match="lift\\(vLLM\\) differs from the spec"):
        campaign(Both(vllm), n=5)


def test_free_queues_compare_by_pop_order_whatever_the_split():
    """A lifted pool keeps the longest never-used range it can; the spec's keeps a
    freed block in front of its range: the same queue either way, and a queue that
    differs anywhere, in the front, the range or the back, is not the same."""
    from schedspec.monitor.check import same_free_queue

    spec = BlockPool(10, free_front=(3, 4), next_fresh=5, free_back=(1,))
    lifted = BlockPool(10, free_front=(3,), next_fresh=4, free_back=(1,))
    assert spec.free_queue() == lifted.free_queue() and same_free_queue(spec, lifted) and same_free_queue(lifted, spec)
    for other in (BlockPool(10, free_front=(2,), next_fresh=4, free_back=(1,)),
                  BlockPool(10, free_front=(3,), next_fresh=5, free_back=(1,)),
                  BlockPool(10, free_front=(3,), next_fresh=4, free_back=(2,)),
                  BlockPool(10, free_front=(4, 3), next_fresh=5, free_back=(1,))):
        assert spec.free_queue() != other.free_queue() and not same_free_queue(spec, other), other


def test_the_incremental_check_reads_the_named_changed_added_and_removed_requests():
    """What a call touched, as the incremental check reads it: the ids vLLM's answer
    names, the requests whose spec value is a new object, those added, those removed;
    an unchanged request (the same object) is not read."""
    from types import SimpleNamespace

    from schedspec.monitor.incremental import touched_ids

    a, b, b2, c, d = (object() for _ in range(5))
    pre = SimpleNamespace(requests={"a": a, "b": b, "c": c})
    post = SimpleNamespace(requests={"a": a, "b": b2, "d": d})
    assert touched_ids(pre, post, ["x", "b"]) == ["x", "b", "d", "c"]
    assert touched_ids(pre, SimpleNamespace(requests=dict(pre.requests)), []) == []
    assert touched_ids(pre, SimpleNamespace(requests={"a": a, "b": b}), []) == ["c"]


def test_a_text_only_engine_lifts_its_encoder_budget_as_the_default():
    """vLLM builds a text-only model's scheduler with an encoder budget and cache of 0
    (S:282-285), which the spec's config does not admit: lifted as None, the default,
    so a state vector the monitor writes from such an engine reads back.  A multimodal
    model's values are kept as they are, 0 included."""
    from types import SimpleNamespace

    from schedspec.reference.vllm_lift import encoder_budget

    def sched(budget, capacity, multimodal):
        return SimpleNamespace(max_num_encoder_input_tokens=budget,
                               encoder_cache_manager=SimpleNamespace(cache_size=capacity),
                               vllm_config=SimpleNamespace(model_config=SimpleNamespace(is_multimodal_model=multimodal)))
    assert encoder_budget(sched(0, 0, False)) == {"max_num_encoder_input_tokens": None, "encoder_cache_size": None}
    assert encoder_budget(sched(0, 0, True)) == {"max_num_encoder_input_tokens": 0, "encoder_cache_size": 0}
    assert encoder_budget(sched(64, 128, True)) == {"max_num_encoder_input_tokens": 64, "encoder_cache_size": 128}
