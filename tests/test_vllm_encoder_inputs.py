"""Encoder inputs (spec/encoder_inputs.py, spec/encoder_cache.py; docs/rules.md §20)
against vLLM 0.33.0's scheduler: a request's multimodal items are encoded whole, in
the step whose chunk first reaches them, within the step's encoder budget and the
encoder cache's room, shared by identifier; a chunk stops before an item it cannot
encode (S:2064-2258, E = v1/core/encoder_cache_manager.py).

- The rules on hand-built states.
- Side by side with vLLM on random scenarios that draw the feature (all four flag
  combinations): after every call lift(vLLM) equals the spec's state; spec mutants of
  each rule are caught by vLLM, and those the properties judge by the properties.
- The file contract, the front end's refusals, torch's refusal.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.input_processor import make_request
from schedspec.spec.properties import check_step
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 120


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, block_size=4,
                                     num_gpu_blocks=80, max_num_encoder_input_tokens=12, encoder_cache_size=20), **kw})


def add(s: SchedulerState, rid: str, prompt_len: int, items, **kw) -> SchedulerState:
    r = make_request(s.config, rid, prompt_len, kw.pop("max_tokens", 2), arrival_time=float(len(s.requests)),
                     mm_features=items, **kw)
    return S.add_request(s, r)


def test_an_item_is_encoded_once_and_shared_by_identifier():
    s = add(add(SchedulerState(config()), "a", 20, [(2, 8, "x")]), "b", 20, [(0, 8, "x")])
    out, s = S.schedule(s)
    assert dict(out.scheduled_encoder_inputs) == {"a": (0,)}  # "b" finds it, allocated by "a" this step
    assert s.encoder_cache.cached == {"x": frozenset({"a", "b"})} and s.encoder_cache.num_embeds == {"x": 8}
    # Both computed past it: the references go, the entry stays, freeable.
    _, s = S.update_from_output(s, out, {})
    assert s.encoder_cache.refs == {} and s.encoder_cache.freeable == ("x",)


def test_a_chunk_stops_before_an_item_the_budget_cannot_take():
    # Budget 12: "a"'s first item (8) fits, its second (6) does not; the chunk stops before it.
    s = add(SchedulerState(config()), "a", 40, [(0, 8, "x"), (20, 6, "y")])
    out, s = S.schedule(s)
    assert dict(out.num_scheduled_tokens) == {"a": 20} and dict(out.scheduled_encoder_inputs) == {"a": (0,)}
    _, s = S.update_from_output(s, out, {})
    out, s = S.schedule(s)  # a new step, a new budget
    assert dict(out.num_scheduled_tokens) == {"a": 20} and dict(out.scheduled_encoder_inputs) == {"a": (1,)}


def test_a_chunk_starting_inside_an_item_it_cannot_encode_schedules_nothing():
    # Prefix caching: "b"'s hit ends inside item "z", which nobody encoded: "b" gets no
    # tokens this step (S:2220-2225), and the loop goes on to the next request.
    c = config(enable_prefix_caching=True, max_num_encoder_input_tokens=16, encoder_cache_size=16)
    tokens = list(range(100, 124))
    s = SchedulerState(c)
    s = S.add_request(s, make_request(c, "a", 24, 1, prompt_token_ids=tokens, arrival_time=0.0))
    out, s = S.schedule(s)
    _, s = S.update_from_output(s, out, {"a": [7]})
    s = S.add_request(s, make_request(c, "b", 24, 2, prompt_token_ids=tokens, arrival_time=1.0,
                                      mm_features=[(10, 12, "z")]))
    s = S.add_request(s, make_request(c, "x", 5, 2, prompt_token_ids=[9] * 5, arrival_time=2.0,
                                      mm_features=[(0, 5, "w")]))
    out, s = S.schedule(s)
    # "b"'s blocks hash with its item, so it hits only the blocks before the item: 8 tokens.
    assert dict(out.prefix_hits)["b"] == 8
    assert dict(out.num_scheduled_tokens)["b"] == 16 and dict(out.scheduled_encoder_inputs)["b"] == (0,)


def test_block_hashes_carry_the_items():
    c = config(enable_prefix_caching=True)
    tokens = list(range(100, 120))

    def hashes(items):
        return make_request(c, "a", 20, 2, prompt_token_ids=tokens, mm_features=items).block_hashes

    plain, x, y, moved = hashes([]), hashes([(5, 4, "x")]), hashes([(5, 4, "y")]), hashes([(6, 4, "x")])
    assert plain[0] == x[0]  # block 0 ([0, 4)) holds no item
    assert len({plain[1], x[1], y[1], moved[1]}) == 4  # item, identifier and place all count
    assert x[2:] != plain[2:]  # a block's hash chains its parent's


def test_disable_chunked_mm_input_keeps_a_chunk_out_of_an_item():
    c = config(max_num_batched_tokens=64, max_num_scheduled_tokens=10, disable_chunked_mm_input=True)
    s = add(SchedulerState(c), "a", 30, [(6, 8, "x")])
    out, s = S.schedule(s)
    assert dict(out.num_scheduled_tokens) == {"a": 6} and not out.scheduled_encoder_inputs


def test_the_oldest_freeable_entry_is_evicted_first():
    c = config(encoder_cache_size=12)
    s = SchedulerState(c)
    for rid, ident in (("a", "x"), ("b", "y")):
        s = add(s, rid, 8, [(0, 6, ident)], max_tokens=1)
        out, s = S.schedule(s)
        _, s = S.update_from_output(s, out, {rid: [7]})
    assert s.encoder_cache.freeable == ("x", "y") and "a" not in s.requests
    s = add(s, "c", 8, [(0, 5, "z")], max_tokens=1)
    out, s = S.schedule(s)
    assert out.free_encoder_mm_hashes == ("x",) and set(s.encoder_cache.num_embeds) == {"y", "z"}


def test_the_front_end_refuses_what_vllm_would_never_hand_on():
    c = config()
    for items, field in (([(18, 4, "x")], r"mm_features\[0\]"), ([(0, 4, "x"), (2, 4, "y")], r"mm_features\[1\]"),
                         ([(0, 13, "x")], r"mm_features\[0\]\.length"), ([(0, 2, "")], r"identifier"),
                         ([(i, 1, f"i{i}") for i in range(9)], "mm_features")):
        with pytest.raises(ConfigError, match=field):
            make_request(c, "a", 20, 2, mm_features=items)
    with pytest.raises(ConfigError, match="mm_features: schedspec models encoder inputs for vLLM 0.33.0 and later, "
                                          "not 0.30.0"):
        make_request(SchedulerConfig(vllm_version="0.30.0"), "a", 20, 2, mm_features=[(0, 2, "x")])
    with pytest.raises(ConfigError, match="num_hash_lookahead_tokens"):
        make_request(config(enable_prefix_caching=True, num_hash_lookahead_tokens=1), "a", 20, 2,
                     prompt_token_ids=list(range(20)), mm_features=[(0, 2, "x")])


def scenario(**request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "encoder",
            "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
                       "num_gpu_blocks": 40, "max_num_encoder_input_tokens": 10, "encoder_cache_size": 16},
            "requests": [{"id": "a", "prompt_len": 30, "max_tokens": 3, **request},
                         {"id": "b", "prompt_len": 20, "max_tokens": 2, "arrival_step": 1,
                          "mm_features": [{"offset": 4, "length": 6, "identifier": "x"}]}]}


def test_the_scenario_field_round_trips_and_one_identifier_names_one_item():
    items = [{"offset": 0, "length": 6, "identifier": "x"}, {"offset": 10, "length": 8, "identifier": "y"}]
    sc = scenario_from_json(scenario(mm_features=items))
    assert sc.requests[0].mm_features == ((0, 6, "x"), (10, 8, "y"))
    assert sc.to_json()["requests"][0]["mm_features"] == items
    with pytest.raises(ScenarioError, match=r"requests\[1\]\.mm_features\[0\]\.length: = 6, but identifier 'x' has "
                                            r"length 5"):
        scenario_from_json(scenario(mm_features=[{"offset": 0, "length": 5, "identifier": "x"}]))
    with pytest.raises(ScenarioError, match=r"requests\[0\]\.mm_features\[0\]"):
        scenario_from_json(scenario(mm_features=[{"offset": 0, "length": 0, "identifier": "x"}]))


def test_the_trace_records_the_encoder_decisions_on_every_step():
    trace = run_scenario(scenario_from_json(scenario(mm_features=[{"offset": 12, "length": 6, "identifier": "y"}])),
                         SpecScheduler())
    assert all("scheduled_encoder_inputs" in st and "free_encoder_mm_hashes" in st for st in trace["steps"])
    assert trace["steps"][0]["scheduled_encoder_inputs"] == {"a": [0]}
    plain = run_scenario(scenario_from_json(scenario()), SpecScheduler())
    assert plain["steps"][0]["scheduled_encoder_inputs"] == {}
    assert "scheduled_encoder_inputs" not in run_scenario(scenario_from_json(
        {**scenario(), "requests": scenario()["requests"][:1]}), SpecScheduler())["steps"][0]


def test_torch_refuses_the_feature():
    pytest.importorskip("torch")
    from schedspec.reference.loader import load_impl
    from schedspec.gpu.batch import prepare

    sc = scenario_from_json(scenario())
    assert "requests[1].mm_features: 1 item(s): the torch implementation does not model encoder inputs" in prepare(sc)
    assert "requests[1].mm_features: torch does not model encoder inputs" in \
        run_scenario(sc, load_impl("torch", device="cpu"))["error"]


# -- side by side with vLLM ----------------------------------------------------------------------


def encoder_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if any(r.mm_features for r in s.requests)]


def test_the_generator_draws_the_feature_with_every_flag():
    found = encoder_scenarios()
    assert len(found) >= 15
    flags = {(bool(s.config.enable_prefix_caching), bool(s.config.async_scheduling)) for s in found}
    assert len(flags) == 4, flags
    assert any(s.config.disable_chunked_mm_input for s in found)


@pytest.mark.parametrize("items", [[{"offset": 12, "length": 6, "identifier": "y"}],
                                   [{"offset": 0, "length": 6, "identifier": "x"},
                                    {"offset": 8, "length": 10, "identifier": "y"}]])
def test_vllm_agrees_on_hand_written_cases(vllm, items):
    sc = scenario_from_json(scenario(mm_features=items))
    assert compare_traces(run_scenario(sc, vllm), run_scenario(sc, SpecScheduler())) is None


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    for sc in encoder_scenarios():
        trace = run_scenario(sc, both)
        assert "error" not in trace, (sc.name, trace.get("error"))
    assert both.calls > 1000, both.calls


MUTANTS = {
    "newest-evicted-first": Mutation("encoder_cache.EncoderCacheWork.can_allocate", "next(iter(self.freeable))",
                                     "next(reversed(self.freeable))"),
    "planned-items-not-counted": Mutation("encoder_cache.EncoderCacheWork.can_allocate",
                                          "num_embeds + num_embeds_to_schedule", "num_embeds"),
    "budget-unchecked": Mutation("encoder_cache.EncoderCacheWork.can_allocate", "num_embeds > encoder_compute_budget",
                                 "False"),
    "chunk-kept-inside-an-item": Mutation(
        "encoder_inputs.plan", "min(n, f.offset - num_computed_tokens) if num_computed_tokens < f.offset else 0",
        "min(n, f.offset - num_computed_tokens) if num_computed_tokens < f.offset else n"),
    "freed-before-computed": Mutation("encoder_inputs.free_computed", "f.offset + f.length <= done", "f.offset < done"),
    "items-not-in-block-hashes": Mutation(
        "kv_cache_utils.extend_block_hashes",
        "mm_block_keys(mm_features, i * block_size, block_size) if mm_features else ()", "()"),
    "kept-at-finish": Mutation("scheduler.remove_finished", "w.encoder.free(rid)", "pass"),
}


# Bookkeeping a trace shows only under cache pressure: the state comparison catches them.
STATE_MUTANTS = ("freed-before-computed", "kept-at-finish")


@pytest.mark.parametrize("name", [m for m in MUTANTS if m not in STATE_MUTANTS])
def test_vllm_catches_a_broken_rule(vllm, name):
    from schedspec.reference.campaign import run_guarded
    from schedspec.reference.compare import compare_runs

    with mutated([MUTANTS[name]]):
        caught = any(compare_runs(run_guarded(s, vllm), run_guarded(s, SpecScheduler())) is not None
                     for s in encoder_scenarios())
    assert caught


def aborted_mid_item() -> dict:
    """"a" computes 4 tokens a step into its 10-token item and is aborted at step 1,
    holding its reference."""
    sc = scenario(mm_features=[{"offset": 0, "length": 10, "identifier": "z"}])
    sc["config"].update(max_num_scheduled_tokens=4, max_num_encoder_input_tokens=16)
    return {**sc, "aborts": [{"id": "a", "step": 1}]}


@pytest.mark.parametrize("name", STATE_MUTANTS)
def test_the_lift_catches_a_broken_rule(vllm, name):
    both = Both(vllm)
    assert "error" not in run_scenario(scenario_from_json(aborted_mid_item()), both)
    with mutated([MUTANTS[name]]):
        with pytest.raises(AssertionError, match="encoder_cache"):
            run_scenario(scenario_from_json(aborted_mid_item()), both)
            for sc in encoder_scenarios():
                run_scenario(sc, both)


@pytest.mark.parametrize("name, prop", [("budget-unchecked", "encoder_budget_respected"),
                                        ("planned-items-not-counted", "encoder_cache_within_capacity"),
                                        ("chunk-kept-inside-an-item", "encoder_inputs_available")])
def test_a_property_catches_a_broken_rule(name, prop):
    seen = {"judged": 0, "violated": 0}

    def on_step(t):
        v = check_step(t.before, t.output, t.after)[prop]
        seen["judged"] += v.applicable
        seen["violated"] += v.applicable and not v.holds

    for sc in encoder_scenarios():
        run_scenario(sc, SpecScheduler(), on_step=on_step)
    assert seen["judged"] > 50 and seen["violated"] == 0, seen
    with mutated([MUTANTS[name]]):
        for sc in encoder_scenarios():
            run_scenario(sc, SpecScheduler(), on_step=on_step)
    assert seen["violated"] > 0, seen


# -- state vectors -------------------------------------------------------------------------------


def test_state_vectors_carry_the_items_the_cache_and_the_decisions():
    """A vector of a schedule() that encodes items and finds one cached (a freeable
    entry) validates against the schema, round-trips exactly and replays on the spec."""
    from schedspec.reference.state_json import output_from_json, output_to_json, state_from_json, state_to_json
    from schedspec.reference.vectors import check_vector, make_vector, schedule_call, validate_vector

    c = config(encoder_cache_size=12, enable_prefix_caching=True)
    s = SchedulerState(c)
    s = S.add_request(s, make_request(c, "a", 8, 1, prompt_token_ids=list(range(8)), mm_features=[(0, 6, "x")]))
    out, s = S.schedule(s)
    _, s = S.update_from_output(s, out, {"a": [7]})
    for rid, items in (("b", [(0, 6, "x"), (6, 2, "y")]), ("c", [(1, 4, "z")])):
        s = S.add_request(s, make_request(c, rid, 8, 1, prompt_token_ids=[50 + len(s.requests)] * 8,
                                          mm_features=items, arrival_time=float(len(s.requests) + 1)))
    assert s.encoder_cache.freeable == ("x",) and state_from_json(state_to_json(s)) == s
    vector = make_vector(s, schedule_call(), source={"test": "encoder inputs"})
    validate_vector(vector)
    assert check_vector(vector, SpecScheduler()) == []
    out, after = S.schedule(s)
    assert dict(out.scheduled_encoder_inputs) == {"b": (1,), "c": (0,)} and out.free_encoder_mm_hashes == ()
    assert state_from_json(state_to_json(after)) == after and output_from_json(output_to_json(out)) == out
    assert state_to_json(after)["encoder_cache"]["cached"] == {"x": ["b"], "y": ["b"], "z": ["c"]}


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["mm_features"][0].update(length=0), r"state\.requests\.a\.mm_features\[0\]\.length: must be an integer >= 1, got 0"),
    (lambda r: r["mm_features"][0].update(identifier=7), r"state\.requests\.a\.mm_features\[0\]\.identifier"),
    (lambda r: r["mm_features"][0].pop("offset"), r"state\.requests\.a\.mm_features\[0\]\.offset: missing"),
])
def test_a_bad_item_in_a_state_is_refused_in_one_line(edit, message):
    from schedspec.reference.state_json import StateJsonError, state_from_json, state_to_json

    c = config()
    s = S.add_request(SchedulerState(c), make_request(c, "a", 20, 2, mm_features=[(2, 8, "x")]))
    raw = state_to_json(s)
    edit(raw["requests"]["a"])
    with pytest.raises(StateJsonError, match=message):
        state_from_json(raw)
