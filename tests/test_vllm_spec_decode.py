"""Speculative decoding (spec/spec_decode.py) against vLLM 0.33.0's scheduler.

- The spec's rules on hand-built states: drafts scheduled and spent, the padding
  of a new decode, rejected drafts rolled back, drafts dropped on preemption
  and for a prefill chunk, the lookahead in allocate_slots.
- Side by side with vLLM on random scenarios that draw speculative decoding
  (all four flag combinations): after every call, drafter's included, lift(vLLM)
  equals the spec's state, and the traces agree.
- The finding: a padded admission cut by long_prefill_token_threshold crashes
  vLLM 0.33.0 (S:1643); the spec raises at the same step.
- The scenario file's rules for the new fields.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json
from schedspec.spec import scheduler as S
from schedspec.spec import spec_decode as SD
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.request import RUNNING, Request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both

SEED = 31
NUM_SCENARIOS = 60


def config(**kw) -> SchedulerConfig:
    base = dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128, block_size=4, num_gpu_blocks=40,
                num_speculative_tokens=3)
    return SchedulerConfig(**{**base, **kw})


def decoding(c: SchedulerConfig, rid: str = "a", prompt: int = 8, out: int = 2, drafts=(100, 100, 100)):
    """A state with one running request between synchronous decode steps."""
    r = Request(rid, prompt, 50, status=RUNNING, num_computed_tokens=prompt + out - 1, num_output_tokens=out,
                spec_token_ids=tuple(drafts))
    s = SchedulerState(c, {rid: r}, running=(rid,))
    kv = s.kv_cache.work()
    kv.allocate(rid, (), -(-(prompt + out - 1) // c.block_size))
    return replace(s, kv_cache=kv.freeze())


def spec_scenario(index: int):
    return random_scenario(SEED, index, FLAGS_ALL, features_for("vllm", "spec"))


# -- the rules on hand-built states ---------------------------------------------------


def test_drafts_are_scheduled_and_spent():
    out, after = S.schedule(decoding(config()))
    assert out.num_scheduled_tokens == (("a", 4),)
    assert out.scheduled_spec_decode_tokens == (("a", (100, 100, 100)),)
    assert after.requests["a"].spec_token_ids == ()
    assert after.requests["a"].num_computed_tokens == 9 + 4


def test_a_budget_cut_sends_only_the_drafts_that_fit():
    out, after = S.schedule(decoding(config(max_num_scheduled_tokens=2)))
    assert out.scheduled_spec_decode_tokens == (("a", (100,)),)
    assert after.requests["a"].spec_token_ids == ()


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_rejected_drafts_roll_back(accepted):
    out, mid = S.schedule(decoding(config()))
    tokens = [100] * (1 + accepted)
    _, after = S.update_from_output(mid, out, {"a": tokens})
    r = after.requests["a"]
    assert r.num_output_tokens == 2 + 1 + accepted
    assert r.num_computed_tokens == r.num_tokens - 1  # one token to compute next: the last sampled
    assert after.num_blocks("a") == mid.num_blocks("a")  # blocks stay: vLLM frees none on rejection


def test_a_stop_inside_the_accepted_tokens_discards_the_rest():
    out, mid = S.schedule(decoding(config()))
    finished, after = S.update_from_output(mid, out, {"a": [100, 2, 100, 100]})
    assert finished == (("a", S.RequestStatus.FINISHED_STOPPED),)


def test_preemption_drops_the_drafts():
    c = config(num_gpu_blocks=33, max_model_len=128)
    s = decoding(c, "a", prompt=8)
    b = Request("b", 8, 50, status=RUNNING, num_computed_tokens=9, num_output_tokens=2, spec_token_ids=(100,) * 3,
                arrival_time=1.0)
    kv = s.kv_cache.work()
    kv.allocate("b", (), kv.num_free_blocks)  # b holds the rest of the pool: a's drafts need a block
    s = replace(s, requests={**s.requests, "b": b}, running=("a", "b"), kv_cache=kv.freeze())
    out, after = S.schedule(s)
    assert out.preempted_req_ids == ("b",)
    assert after.requests["b"].spec_token_ids == ()
    assert "b" not in dict(out.scheduled_spec_decode_tokens)


def test_a_one_token_admission_next_to_a_decode_is_padded():
    s = S.add_request(decoding(config()), Request("b", 1, 5, arrival_time=1.0))
    out, after = S.schedule(s)
    assert out.scheduled == {"a": 4, "b": 4}
    assert dict(out.scheduled_spec_decode_tokens)["b"] == (-1, -1, -1)


def test_no_padding_alone_or_when_it_does_not_fit_the_budget():
    alone = S.add_request(SchedulerState(config()), Request("b", 1, 5))
    out, _ = S.schedule(alone)
    assert out.scheduled == {"b": 1} and out.scheduled_spec_decode_tokens == ()
    tight = S.add_request(decoding(config(max_num_scheduled_tokens=6)), Request("b", 1, 5, arrival_time=1.0))
    out, _ = S.schedule(tight)
    assert out.scheduled == {"a": 4}  # 1 + 3 rows do not fit in the 2 left: admission stops (S:1376-1378)


def test_the_drafter_skips_a_prefill_chunk():
    c = config()
    s = SchedulerState(c, {"a": Request("a", 8, 5, status=RUNNING, num_computed_tokens=4, is_prefill_chunk=True,
                                        spec_token_ids=(100,))}, running=("a",))
    after = S.update_draft_token_ids(s, {"a": [100, 100], "gone": [100]})
    assert after.requests["a"].spec_token_ids == ()


def test_the_lookahead_reserves_blocks():
    out, after = S.schedule(decoding(config(num_lookahead_tokens=4)))
    assert after.num_blocks("a") == -(-(9 + 4 + 4) // 4)


def test_async_decodes_get_placeholder_drafts():
    c = config(async_scheduling=True)
    s = S.add_request(SchedulerState(c), Request("a", 4, 8))
    out, mid = S.schedule(s)
    r = mid.requests["a"]
    assert r.spec_token_ids == (-1, -1, -1) and r.num_output_placeholders == 1
    out2, mid2 = S.schedule(mid)
    assert out2.scheduled == {"a": 4} and mid2.requests["a"].num_output_placeholders == 1 + 4


# -- the finding ----------------------------------------------------------------------

PADDING_CUT = {
    "format": "schedspec.scenario/1", "name": "padding-cut-by-threshold",
    "config": {"num_speculative_tokens": 3, "long_prefill_token_threshold": 2, "max_num_batched_tokens": 64,
               "max_num_seqs": 4, "max_model_len": 128, "block_size": 4, "num_gpu_blocks": 40},
    "requests": [{"id": "a", "prompt_len": 4, "max_tokens": 8},
                 {"id": "b", "prompt_len": 1, "arrival_step": 2, "max_tokens": 3}],
    "max_steps": 100}


def test_a_padded_admission_cut_by_the_threshold_crashes_the_spec():
    steps = []
    with pytest.raises(AssertionError, match="S:1643"):
        run_scenario(scenario_from_json(PADDING_CUT), SpecScheduler(), on_step=lambda t: steps.append(t.step))
    assert steps == [0, 1]  # step 2 admits b next to a's decode


def test_vllm_crashes_on_the_same_step(vllm):
    steps = []
    with pytest.raises(AssertionError):
        run_scenario(scenario_from_json(PADDING_CUT), vllm, on_step=lambda t: steps.append(t.step))
    assert steps == [0, 1]


def waiting(c: SchedulerConfig, *prompts: int) -> SchedulerState:
    s = SchedulerState(c)
    for i, n in enumerate(prompts):
        s = S.add_request(s, Request(str(i), n, 50))
    return s


@pytest.mark.parametrize("slots, expected", [(0, (("0", 10), ("1", 10))), (3, (("0", 10), ("1", 4)))])
def test_a_drafters_rows_are_charged_to_the_input_budget(slots, expected):
    """A parallel drafter's K - 1 rows per scheduled request (S:1345, 1635): of 20
    input tokens, the first admission leaves 20 - 13 = 7, the second gets 7 - 3.
    vLLM's own test_draft_slots_budgeted_per_scheduled_request, on the spec."""
    c = config(max_num_batched_tokens=20, num_speculative_tokens=4, max_num_new_slots_for_drafting=slots)
    out, _ = S.schedule(waiting(c, 10, 10))
    assert out.num_scheduled_tokens == expected


def test_no_admission_when_only_the_drafters_rows_are_left():
    """The waiting loop stops once the input budget is down to the drafter's rows
    (S:1110): 13 + 3 of 16 leave nothing for a second request."""
    c = config(max_num_batched_tokens=16, num_speculative_tokens=4, max_num_new_slots_for_drafting=3)
    out, _ = S.schedule(waiting(c, 10, 10))
    assert out.num_scheduled_tokens == (("0", 10),)


@pytest.mark.parametrize("slots", [5])
def test_more_rows_than_drafts_are_refused(slots):
    with pytest.raises(ConfigError, match="max_num_new_slots_for_drafting"):
        config_from_dict({"num_speculative_tokens": 4, "max_num_new_slots_for_drafting": slots})


# -- against vLLM ------------------------------------------------------------------------


def test_random_scenarios_draw_speculative_decoding():
    drawn = [spec_scenario(i) for i in range(NUM_SCENARIOS)]
    with_sd = [s for s in drawn if s.config.num_speculative_tokens]
    assert len(with_sd) >= NUM_SCENARIOS // 5
    assert any(s.config.async_scheduling for s in with_sd)
    assert any(r.num_accepted_tokens for s in with_sd for r in s.requests)
    assert any(s.config.max_num_new_slots_for_drafting for s in with_sd)
    assert not any(random_scenario(SEED, i, FLAGS_ALL, features_for("torch", "spec")).config
                   .num_speculative_tokens for i in range(NUM_SCENARIOS))


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    checked = drafted = 0
    for i in range(NUM_SCENARIOS):
        scenario = spec_scenario(i)
        if not scenario.config.num_speculative_tokens:
            continue
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        checked += 1
        drafted += sum(sum(st.get("scheduled_spec_decode_tokens", {}).values()) for st in trace["steps"])
    assert checked >= NUM_SCENARIOS // 5 and drafted > 0 and both.calls > 0


def test_traces_agree(vllm):
    for i in range(NUM_SCENARIOS):
        scenario = spec_scenario(i)
        if scenario.config.num_speculative_tokens:
            d = compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler()))
            assert d is None, f"{scenario.name}: {d.describe()}"


# -- the file contract ------------------------------------------------------------------


def scenario(config: dict, **request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "x", "config": config,
            "requests": [{"id": "a", "prompt_len": 4, **request}]}


@pytest.mark.parametrize("data, field", [
    (scenario({}, num_accepted_tokens=[1]), "requests[0].num_accepted_tokens"),
    (scenario({"num_speculative_tokens": 2}, num_draft_tokens=[3]), "requests[0].num_draft_tokens[0]"),
    (scenario({"num_speculative_tokens": 2}, num_draft_tokens=[]), "requests[0].num_draft_tokens"),
    (scenario({"num_speculative_tokens": 2}, num_accepted_tokens=[-1]), "requests[0].num_accepted_tokens[0]"),
])
def test_patterns_are_checked(data, field):
    with pytest.raises(ScenarioError, match=rf"^{field.replace('[', '.').replace(']', '.')}"):
        scenario_from_json(data)


@pytest.mark.parametrize("raw, field", [
    ({"num_lookahead_tokens": 2}, "config.num_lookahead_tokens"),
    ({"num_speculative_tokens": 2, "vllm_version": "0.32.0"}, "config.num_speculative_tokens"),
    ({"num_speculative_tokens": -1}, "config.num_speculative_tokens"),
])
def test_config_fields_are_checked(raw, field):
    with pytest.raises(ConfigError, match=rf"^{field}"):
        config_from_dict(raw)


def test_a_file_round_trips_its_patterns():
    data = scenario({"num_speculative_tokens": 2}, num_accepted_tokens=[2, 0], num_draft_tokens=[1])
    s = scenario_from_json(data)
    assert s.requests[0].num_accepted_tokens == (2, 0) and scenario_from_json(s.to_json()) == s


# -- the properties, and mutants they and vLLM catch -------------------------------------


def spec_decode_scenarios(n: int = NUM_SCENARIOS):
    return [s for s in (spec_scenario(i) for i in range(n)) if s.config.num_speculative_tokens]


def test_every_property_and_invariant_holds_with_speculative_decoding():
    from schedspec.spec.invariants import check_state
    from schedspec.spec.properties import check_step

    held: dict[str, int] = {}

    def check(t):
        for name, v in {**check_step(t.before, t.output, t.after), **check_state(t.after)}.items():
            assert v.holds, f"{name} at step {t.step}: {v.detail} {dict(v.values)}"
            held[name] = held.get(name, 0) + v.applicable

    for scenario in spec_decode_scenarios():
        run_scenario(scenario, SpecScheduler(), on_step=check)
    assert held.get("drafts_sent_are_known")


def sends_padding_for_running(s, rid, n):
    r = s.requests[rid]
    if r.spec_token_ids:
        s.drafts_sent[rid] = (-1,) * len(r.spec_token_ids)
        s.request(rid).spec_token_ids = ()


def test_drafts_sent_are_known_catches_a_mutant(monkeypatch):
    from schedspec.spec.properties import check_step

    monkeypatch.setattr(SD, "schedule_drafts", sends_padding_for_running)
    bad = 0
    for scenario in spec_decode_scenarios(30):
        def check(t):
            nonlocal bad
            bad += not check_step(t.before, t.output, t.after)["drafts_sent_are_known"].holds
        run_scenario(scenario, SpecScheduler(), on_step=check)
    assert bad


@pytest.mark.parametrize("name, mutant", [
    ("reject_drafts", lambda r, n: None),  # rejected drafts stay computed
    ("pads_new_decode", lambda s, r, n: False),  # no padding
    ("schedule_drafts", lambda s, rid, n: None),  # drafts neither sent nor spent
])
def test_vllm_catches_spec_decode_mutants(vllm, monkeypatch, name, mutant):
    monkeypatch.setattr(SD, name, mutant)
    for scenario in spec_decode_scenarios():
        if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
            return
    pytest.fail(f"mutant {name} agreed with vLLM on every scenario")
