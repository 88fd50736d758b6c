"""KV connector hits (spec/kv_connector.py) against vLLM 0.33.0's scheduler: a
request's `kv_connector_tokens`, the prefix a remote store holds, is loaded beyond
the local prefix hit at an admission from zero computed tokens, within the step;
an undecided connector skips the request.

- The rules on hand-built states: tokens counted computed and given new blocks,
  only beyond the local hit, none for a request that skips the prefix cache, asked
  again on resumption; an undecided request skipped in its place.
- Side by side with vLLM on random scenarios that draw the feature (all four flag
  combinations): after every call lift(vLLM) equals the spec's state; spec mutants
  of each rule are caught.
- The file contract: the scenario field and its bounds, the state vector's request
  field (null included) and output field, the torch implementation's refusal.
"""

from __future__ import annotations

import dataclasses

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json, validate_scenario
from schedspec.reference.state_json import output_from_json, output_to_json, state_from_json, state_to_json
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.input_processor import make_request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 120


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=128, block_size=4,
                                     num_gpu_blocks=40), **kw})


def add(s: SchedulerState, rid: str, prompt_len: int, max_tokens: int = 20, tokens=None, **kw) -> SchedulerState:
    if s.config.enable_prefix_caching and tokens is None:
        tokens = [1000 * (len(s.requests) + 1) + k for k in range(prompt_len)]
    return S.add_request(s, make_request(s.config, rid, prompt_len, max_tokens, arrival_time=float(len(s.requests)),
                                         prompt_token_ids=tokens, **kw))


def test_held_tokens_are_computed_and_take_new_blocks():
    """13 of 30 tokens held: admission computes 17 (S:1255-1257), and the request holds
    the blocks of all 30 (8 of 4 tokens), none of them hits (K:580-587)."""
    s = add(SchedulerState(config()), "a", 30, kv_connector_tokens=13)
    free = s.num_free_blocks
    out, s = S.schedule(s)
    assert out.num_scheduled_tokens == (("a", 17),) and out.kv_connector_hits == (("a", 13),)
    assert s.requests["a"].num_computed_tokens == 30
    assert free - s.num_free_blocks == 8


def test_only_tokens_beyond_the_local_hit_are_loaded():
    """b shares a's first 12 tokens (3 cached blocks): of the 17 b's store holds, 5 are
    loaded; of c's 8, none (its local hit covers them)."""
    s = SchedulerState(config(enable_prefix_caching=True))
    shared = list(range(1, 13))
    s = add(s, "a", 20, tokens=shared + list(range(100, 108)))
    _, s = S.schedule(s)
    s = add(s, "b", 24, tokens=shared + list(range(200, 212)), kv_connector_tokens=17)
    s = add(s, "c", 16, tokens=shared + list(range(300, 304)), kv_connector_tokens=8)
    out, s = S.schedule(s)
    assert dict(out.prefix_hits) == {"b": 12, "c": 12}
    assert out.kv_connector_hits == (("b", 5),)
    assert dict(out.num_scheduled_tokens)["b"] == 24 - 17 and dict(out.num_scheduled_tokens)["c"] == 4


def test_a_request_that_skips_the_prefix_cache_loads_nothing():
    s = add(SchedulerState(config()), "a", 30, kv_connector_tokens=13)
    s = dataclasses.replace(s, requests={"a": s.requests["a"].evolve(skip_reading_prefix_cache=True)})
    out, _ = S.schedule(s)
    assert out.num_scheduled_tokens == (("a", 30),) and out.kv_connector_hits == ()


def test_an_undecided_connector_skips_the_request_in_its_place():
    """a's connector cannot tell: a is skipped, b behind it admitted, a kept first (S:1185-1190)."""
    s = add(SchedulerState(config()), "a", 8)
    s = add(s, "b", 8)
    s = dataclasses.replace(s, requests={**s.requests, "a": s.requests["a"].evolve(kv_connector_tokens=None)})
    out, s = S.schedule(s)
    assert out.scheduled_new_reqs == ("b",) and s.waiting == ("a",)


def test_a_resumed_request_loads_again():
    """Preempted, a request's computed tokens are 0: its admission asks the connector again."""
    s = add(SchedulerState(config(num_gpu_blocks=13, max_num_batched_tokens=32)), "b", 12, 30)
    s = add(s, "a", 12, 30, kv_connector_tokens=8)  # the later arrival: FCFS's victim
    loads = []
    for _ in range(100):
        out, s = S.schedule(s)
        loads += [rid for rid, _ in out.kv_connector_hits]
        sampled = {rid: [7] for rid, _ in out.num_scheduled_tokens if not s.requests[rid].is_prefill_chunk}
        _, s = S.update_from_output(s, out, sampled)
        if not s.requests:
            break
    assert loads == ["a", "a"] and s.requests == {}, loads


def test_the_front_end_refuses_a_whole_prompt_and_an_older_release():
    with pytest.raises(ConfigError, match="kv_connector_tokens: = 8, must be < prompt_len"):
        make_request(config(), "a", 8, 4, kv_connector_tokens=8)
    with pytest.raises(ConfigError, match="kv_connector_tokens: schedspec models KV connectors for vLLM 0.33.0 "
                                          "and later, not 0.30.0"):
        make_request(config(vllm_version="0.30.0"), "a", 8, 4, kv_connector_tokens=3)


# -- vLLM side by side ---------------------------------------------------------------------------


def connector_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if any(r.kv_connector_tokens for r in s.requests)]


def test_the_generator_draws_the_feature_with_every_flag():
    found = connector_scenarios()
    assert len(found) >= 8
    flags = {(bool(s.config.enable_prefix_caching), bool(s.config.async_scheduling)) for s in found}
    assert len(flags) == 4, flags


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    loads = 0
    for scenario in connector_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, (scenario.name, trace.get("error"))
        loads += sum(len(st.get("kv_connector_hits", {})) for st in trace["steps"])
    assert both.calls > 1000 and loads > 20, (both.calls, loads)


@pytest.mark.parametrize("mutant", [
    Mutation("kv_connector.external_tokens", "max(0, r.kv_connector_tokens - num_local_computed_tokens)",
             "max(0, r.kv_connector_tokens - num_local_computed_tokens - 1)"),
    Mutation("scheduler.allocate", "r.num_computed_tokens + len(hits) * s.config.block_size + external",
             "r.num_computed_tokens + len(hits) * s.config.block_size"),
    Mutation("scheduler.blocks_to_allocate", "external", "0"),
], ids=["one-token-short", "loaded-blocks-not-cached", "no-blocks-for-loaded-tokens"])
def test_vllm_catches_a_broken_rule(vllm, mutant):
    with mutated([mutant]):
        caught = any(compare_traces(run_scenario(s, vllm), run_scenario(s, SpecScheduler())) is not None
                     for s in connector_scenarios())
    assert caught


# -- the file contract ---------------------------------------------------------------------------


def scenario(**request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "kv",
            "config": {"max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 128, "block_size": 4,
                       "num_gpu_blocks": 40},
            "requests": [{"id": "a", "prompt_len": 10, **request}]}


def test_the_scenario_field_round_trips_and_is_bounded():
    sc = scenario_from_json(scenario(kv_connector_tokens=9))
    assert sc.requests[0].kv_connector_tokens == 9
    assert sc.to_json()["requests"][0]["kv_connector_tokens"] == 9
    assert "kv_connector_tokens" not in scenario_from_json(scenario()).to_json()["requests"][0]
    with pytest.raises(ScenarioError, match=r"requests\[0\]\.kv_connector_tokens"):
        scenario_from_json(scenario(kv_connector_tokens=-1))
    with pytest.raises(ConfigError, match=r"requests\[0\]\.kv_connector_tokens: = 10, must be < prompt_len"):
        validate_scenario(scenario_from_json(scenario(kv_connector_tokens=10)))


def test_state_vectors_carry_the_field_and_the_loads():
    s = add(SchedulerState(config()), "a", 30, kv_connector_tokens=13)
    s = add(s, "b", 8)
    s = dataclasses.replace(s, requests={**s.requests, "b": s.requests["b"].evolve(kv_connector_tokens=None)})
    j = state_to_json(s)
    held = {rid: r.get("kv_connector_tokens", 0) for rid, r in j["requests"].items()}
    assert held == {"a": 13, "b": None}
    assert state_from_json(j) == s
    out, _ = S.schedule(s)
    assert output_to_json(out)["kv_connector_hits"] == [["a", 13]]
    assert output_from_json(output_to_json(out)) == out


def test_torch_refuses_the_feature():
    torch = pytest.importorskip("torch")  # noqa: F841
    from schedspec.reference.loader import load_impl

    from schedspec.gpu.batch import prepare

    sc = scenario_from_json(scenario(kv_connector_tokens=4))
    assert "requests[0].kv_connector_tokens: = 4: the torch implementation does not model KV connector hits" \
        in prepare(sc)
    assert "does not model KV connector hits" in run_scenario(sc, load_impl("torch", device="cpu"))["error"]


def test_starvation_counts_what_the_connector_holds_for_a_head_not_admitted():
    """tests/regressions/prop-starvation-connector-new-decode.json: the head's load
    would make it a new decode too wide for the budget left, so vLLM admits nothing.
    The property holds there; counted from 0 computed tokens, as it once was, it
    is violated."""
    from pathlib import Path

    from schedspec.reference.scenario import load_scenario
    from schedspec.spec import properties

    scenario = load_scenario(Path(__file__).parent / "regressions" / "prop-starvation-connector-new-decode.json")

    def verdicts():
        seen = []
        # The module's name, looked up at each call, so that the mutant below takes effect.
        run_scenario(scenario, SpecScheduler(),
                     on_step=lambda t: seen.append(properties.starvation_condition(t.before, t.output, t.after)))
        return seen

    assert all(v.holds for v in verdicts())  # not applicable: a new decode may not fit (spec_decode.py)
    old = Mutation("properties.get_head_start",
                   "max(output.computed_on_admission(head, r.num_computed_tokens), kv_connector.external_tokens(r, 0))",
                   "output.computed_on_admission(head, r.num_computed_tokens)")
    with mutated([old], module="properties"):
        assert any(not v.holds for v in verdicts())


# -- a request finished mid-load (docs/rules.md §19.7) --------------------------------------------

ABORT_MID_LOAD = scenario_from_json({
    "format": "schedspec.scenario/1", "name": "abort-mid-load",
    "config": {"max_num_batched_tokens": 32, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
               "num_gpu_blocks": 40},
    # "a" loads 12 tokens over 5 steps and is aborted at step 2; "b" loads its 8 in one step.
    "requests": [{"id": "a", "prompt_len": 20, "max_tokens": 4, "kv_connector_tokens": 12,
                  "kv_connector_load_steps": 5},
                 {"id": "b", "prompt_len": 10, "max_tokens": 4, "kv_connector_tokens": 8,
                  "kv_connector_load_steps": 1}],
    "aborts": [{"id": "a", "step": 2}]})


def test_a_request_aborted_mid_load_keeps_its_blocks_until_the_load_ends():
    trace = run_scenario(ABORT_MID_LOAD, SpecScheduler())
    steps = {st["step"]: st for st in trace["steps"]}
    assert ["a", "aborted"] in steps[2]["finished"] and "a" not in steps[2]["waiting"]
    free = 39
    assert steps[2]["num_free_blocks"] < free - 3  # "a"'s 3 loaded blocks still held
    assert "a" in steps[2]["num_computed_tokens"]  # held, finished
    # Its load is reported at step 4 (5 steps after step 0): its blocks are freed there.
    assert "a" in steps[3]["num_computed_tokens"] and "a" not in steps[4]["num_computed_tokens"]
    assert trace["summary"]["requests"]["a"]["finish_step"] == 2


def test_vllm_agrees_on_an_abort_mid_load_and_catches_an_immediate_free(vllm):
    assert compare_traces(run_scenario(ABORT_MID_LOAD, vllm), run_scenario(ABORT_MID_LOAD, SpecScheduler())) is None
    from schedspec.reference.campaign import run_guarded
    from schedspec.reference.compare import compare_runs

    with mutated([Mutation("kv_connector.hold_loading",
                           "loading(w.requests[rid]) and not w.requests[rid].kv_load_finished", "False")]):
        # Freed at once, its blocks are back two steps early (or the load's report finds no request).
        assert compare_runs(run_guarded(ABORT_MID_LOAD, vllm), run_guarded(ABORT_MID_LOAD, SpecScheduler()))
