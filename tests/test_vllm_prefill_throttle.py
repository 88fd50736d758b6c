"""Prefill throttling (spec/prefill_throttle.py) against vLLM 0.33.0's scheduler:
`prefill_schedule_interval` holds prefill until that many executed steps have
passed since the last step that carried one, `schedule(throttle_prefills=True)`
holds it on a data-parallel engine's off-cadence step; either only while
something decodes, and not while the engine is capacity-bound.

- The rules on hand-built states: the interval, the data-parallel gate, the
  capacity-bound escape, a running prefill chunk held, a full prefix hit not held,
  the deferred requests' accounting.
- Side by side with vLLM on random scenarios that draw an interval (all four flag
  combinations): after every call lift(vLLM) equals the spec's state, the cadence
  included; spec mutants of each gate are caught.
- The file contract for `prefill_schedule_interval`, the state vector's
  `prefill_cadence` and the schedule call's `throttle_prefills`.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.state_json import StateJsonError, state_from_json, state_to_json
from schedspec.reference.vectors import call_from_json, call_to_json, schedule_call
from schedspec.spec import prefill_throttle as P
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.input_processor import make_request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 80


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, block_size=4,
                                     num_gpu_blocks=80, prefill_schedule_interval=3), **kw})


def add(s: SchedulerState, rid: str, prompt_len: int, max_tokens: int = 20, **kw) -> SchedulerState:
    return S.add_request(s, make_request(s.config, rid, prompt_len, max_tokens, arrival_time=float(len(s.requests)),
                                         **kw))


def step(s: SchedulerState, throttle_prefills: bool = False):
    """schedule, then a model that samples token 7 for every request past its prompt."""
    out, s = S.schedule(s, throttle_prefills)
    sampled = {rid: [7] for rid, _ in out.num_scheduled_tokens if not s.requests[rid].is_prefill_chunk}
    _, s = S.update_from_output(s, out, sampled)
    return out, s


def throttle_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if s.config.prefill_schedule_interval > 1]


def test_the_interval_holds_prefill_until_it_has_passed():
    """Interval 3: d's prefill is executed step 1; p arrives and waits through steps
    2 and 3, which only decode, and is admitted on step 4 = 1 + 3 (S:796-807)."""
    s = add(SchedulerState(config()), "d", 8)
    _, s = step(s)
    assert s.prefill_cadence.num_executed_steps == 1 and s.prefill_cadence.last_prefill_step == 1
    s = add(s, "p", 8)
    admitted = []
    for _ in range(3):
        out, s = step(s)
        admitted.append("p" in out.scheduled_new_reqs)
    assert admitted == [False, False, True]
    assert s.prefill_cadence.last_prefill_step == 4 == s.prefill_cadence.num_executed_steps


def test_nothing_is_held_without_a_decode_or_at_interval_one():
    s = add(SchedulerState(config()), "a", 8)
    _, s = step(s)
    s = add(add(s, "b", 200 // 4), "c", 8)  # b's chunks keep running; a decodes
    out, s = step(s)
    assert "b" not in out.scheduled  # held: a decodes
    one = SchedulerState(config(prefill_schedule_interval=1))
    one = add(one, "a", 8)
    _, one = step(one)
    one = add(one, "b", 8)
    out, one = step(one)
    assert "b" in out.scheduled and one.prefill_cadence == P.PrefillCadence()
    # Only prefill chunks running: the step is never held (S:766-768, 805).
    s = add(SchedulerState(config(max_num_batched_tokens=8)), "long", 40)
    for _ in range(3):
        out, s = step(s)
        assert "long" in out.scheduled


def test_a_throttled_step_holds_a_running_chunk_and_admissions():
    """throttle_prefills (S:766-768): the decode runs alone; c's next chunk and w wait."""
    s = add(SchedulerState(config(prefill_schedule_interval=1)), "d", 8)
    _, s = step(s)
    s = add(s, "c", 100)
    out, s = step(s)
    assert "c" in out.scheduled and s.requests["c"].is_prefill_chunk
    s = add(s, "w", 8)
    out, s = step(s, throttle_prefills=True)
    assert dict(out.num_scheduled_tokens) == {"d": 1}
    out, s = step(s)
    assert {"c", "w"} <= set(out.scheduled)


def test_a_capacity_bound_engine_is_not_throttled():
    """#44558 (S:1685-1689): a step that ran out of budget with requests waiting
    marks the engine capacity-bound; the next throttled step admits anyway."""
    s = add(SchedulerState(config(prefill_schedule_interval=1, max_num_batched_tokens=32)), "d", 4)
    _, s = step(s)
    for rid in "xyz":
        s = add(s, rid, 30)
    out, s = step(s)
    assert s.prefill_cadence.capacity_bound and s.waiting
    out, s = step(s, throttle_prefills=True)
    assert set(out.scheduled) - {"d"}, "a capacity-bound engine held its prefill"


def test_requests_skipped_count_as_deferred_and_not_as_capacity():
    """A request skipped by the waiting loop (here: its grammar compiling) is
    deferred (S:1078, 2778) and does not make the engine capacity-bound."""
    s = add(SchedulerState(config(prefill_schedule_interval=1)), "g", 8, structured_output=True)
    assert s.prefill_cadence.deferred_waiting == ("g",)
    s = add(s, "a", 8)
    out, s = step(s)
    assert "a" in out.scheduled and not s.prefill_cadence.capacity_bound
    assert s.prefill_cadence.deferred_waiting == ("g",)
    _, s = S.finish_requests(s, ["g"], S.RequestStatus.FINISHED_ABORTED)
    assert s.prefill_cadence.deferred_waiting == ()


def test_a_full_prefix_hit_is_not_held():
    """With only its last token left after a hit, an admission is a decode: a held
    step admits it (S:1340) and is not stamped as carrying prefill (S:1654)."""
    c = config(enable_prefix_caching=True)
    tokens = list(range(300, 317))  # 4 full blocks and one token
    s = S.add_request(SchedulerState(c), make_request(c, "d", 17, 20, prompt_token_ids=tokens))
    _, s = step(s)
    s = S.add_request(s, make_request(c, "hit", 17, 3, prompt_token_ids=tokens, arrival_time=1.0))
    s = S.add_request(s, make_request(c, "new", 17, 3, prompt_token_ids=list(range(900, 917)), arrival_time=2.0))
    out, s = step(s)
    assert "hit" in out.scheduled and "new" not in out.scheduled
    assert dict(out.prefix_hits)["hit"] == 16  # its 4 full blocks: one token left, no prefill
    assert s.prefill_cadence.last_prefill_step == 1


def test_an_older_release_is_never_throttled():
    c = config(prefill_schedule_interval=1, vllm_version="0.30.0")
    s = add(SchedulerState(c), "d", 8)
    _, s = step(s)
    s = add(s, "w", 8)
    out, s = step(s, throttle_prefills=True)
    assert "w" in out.scheduled and s.prefill_cadence == P.PrefillCadence()


def test_random_scenarios_draw_an_interval():
    drawn = throttle_scenarios()
    assert len(drawn) >= NUM_SCENARIOS // 8
    assert not any(random_scenario(SEED, i, FLAGS_ALL, features_for("torch", "spec")).config
                   .prefill_schedule_interval > 1 for i in range(NUM_SCENARIOS))


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    held = 0
    for scenario in throttle_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        held += sum(bool(st["waiting"]) and not any(a in st["scheduled"] for a in st["waiting"])
                    for st in trace["steps"])
    assert both.calls > 0 and held > 0


# One-line spec mutants (tests/mutants.py), each a gate vLLM must show broken.
GATE_MUTANTS = {
    "never_defer": Mutation("scheduler.ScheduleWork.__init__",
                            "prefill_throttle.defers_prefills(self, throttle_prefills)", "False"),
    "interval_off_by_one": Mutation("prefill_throttle.gate", "cadence.num_executed_steps + 1 - last < interval",
                                    "cadence.num_executed_steps + 1 - last <= interval"),
    "no_capacity_escape": Mutation("prefill_throttle.after_waiting_loop", "len(w.waiting) > len(deferred)", "False"),
    "chunks_not_held": Mutation("scheduler.num_new_tokens_running",
                                "last_token_in_flight(r) or (s.defer_prefills and r.is_prefill_chunk)",
                                "last_token_in_flight(r)"),
}


@pytest.mark.parametrize("mutant", sorted(GATE_MUTANTS))
def test_vllm_catches_a_broken_gate(vllm, mutant):
    scenarios = throttle_scenarios()
    with mutated([GATE_MUTANTS[mutant]]):
        for scenario in scenarios:
            if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
                return
    pytest.fail(f"the spec with {mutant} agreed with vLLM on every scenario")


def test_the_file_contract():
    assert config_from_dict({"prefill_schedule_interval": 4}).prefill_schedule_interval == 4
    with pytest.raises(ConfigError, match=r"^config\.prefill_schedule_interval"):
        config_from_dict({"prefill_schedule_interval": 0})
    with pytest.raises(ConfigError, match=r"^config\.prefill_schedule_interval: = 2: schedspec models prefill "
                                          r"throttling for vLLM 0\.33\.0 and later, not 0\.30\.0"):
        config_from_dict({"prefill_schedule_interval": 2, "vllm_version": "0.30.0"})


def test_the_state_vector_carries_the_cadence():
    s = add(SchedulerState(config()), "d", 8)
    _, s = step(s)
    s = add(add(s, "g", 8, structured_output=True), "p", 8)
    _, s = step(s)
    text = state_to_json(s)
    assert text["prefill_cadence"] == {"num_executed_steps": 2, "last_prefill_step": 1, "deferred_waiting": ["g"]}
    assert state_from_json(text) == s
    assert "prefill_cadence" not in state_to_json(SchedulerState(config()))
    bad = {**text, "prefill_cadence": {**text["prefill_cadence"], "deferred_waiting": ["d"]}}
    with pytest.raises(StateJsonError, match=r"^state\.prefill_cadence\.deferred_waiting\[0\]: = 'd' is not in "
                                             r"waiting"):
        state_from_json(bad)
    bad = {**text, "prefill_cadence": {**text["prefill_cadence"], "last_prefill_step": 3}}
    with pytest.raises(StateJsonError, match=r"^state\.prefill_cadence\.last_prefill_step: = 3 is after"):
        state_from_json(bad)
    call = schedule_call(throttle_prefills=True)
    assert call == {"name": "schedule", "throttle_prefills": True}
    assert call_from_json(call).throttle_prefills and call_to_json(call_from_json(call)) == call
    assert schedule_call() == {"name": "schedule"} and not call_from_json({"name": "schedule"}).throttle_prefills


def test_torch_refuses_an_interval():
    from schedspec.reference.loader import load_impl
    from schedspec.gpu.batch import prepare
    from schedspec.reference.scenario import scenario_from_json

    s = scenario_from_json({"format": "schedspec.scenario/1", "name": "throttled",
                            "config": {"prefill_schedule_interval": 2}, "requests": [{"id": "a", "prompt_len": 4}]})
    assert "config.prefill_schedule_interval: = 2: the torch implementation does not model prefill throttling" \
        in prepare(s)
    assert "does not model prefill throttling" in run_scenario(s, load_impl("torch", device="cpu"))["error"]


# -- the adaptive long-prefill threshold (spec/config.py long_prefill_threshold, S:780-788) --


def test_the_adaptive_threshold_is_a_fair_share_of_the_input_budget():
    from schedspec.spec.config import long_prefill_threshold

    c = config(prefill_schedule_interval=1, long_prefill_token_threshold=8, long_prefill_token_threshold_adaptive=True)
    assert [long_prefill_threshold(c, n) for n in (1, 2, 4, 8, 16)] == [0, 32, 16, 8, 8]
    plain = config(prefill_schedule_interval=1, long_prefill_token_threshold=8)
    assert [long_prefill_threshold(plain, n) for n in (1, 2, 16)] == [0, 8, 8]
    s = add(add(SchedulerState(c), "a", 40), "b", 40)
    out, _ = step(s)
    assert dict(out.num_scheduled_tokens) == {"a": 32, "b": 32}
    with pytest.raises(ConfigError, match=r"^config\.long_prefill_token_threshold_adaptive: = true: schedspec "
                                          r"models the adaptive long-prefill threshold for vLLM 0\.33\.0 and later, not 0\.31\.0"):
        config_from_dict({"long_prefill_token_threshold": 8, "long_prefill_token_threshold_adaptive": True,
                          "vllm_version": "0.31.0"})


def adaptive_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if s.config.long_prefill_token_threshold_adaptive]


def test_vllm_agrees_on_the_adaptive_threshold_and_catches_its_absence(vllm):
    drawn = adaptive_scenarios()
    assert len(drawn) >= 3
    both = Both(vllm)
    for scenario in drawn:
        assert "error" not in run_scenario(scenario, both)
    without_floor = Mutation("config.long_prefill_threshold",
                             "max(threshold, c.max_num_batched_tokens // num_eligible)", "threshold")
    with mutated([without_floor]):
        caught = any(compare_traces(run_scenario(s, vllm), run_scenario(s, SpecScheduler())) is not None
                     for s in drawn)
    assert caught, "the spec without the adaptive floor agreed with vLLM on every scenario"
