"""Structured output (spec/structured_output.py) against vLLM 0.33.0's scheduler: a
request waits for its grammar to compile, skipped and kept in its place; a grammar
that fails finishes its request with an error in the next update_from_output.

- The rules on hand-built states, the property grammar_wait_respected and the
  state invariant with waiting grammars.
- Side by side with vLLM on random scenarios that draw structured output (all
  four flag combinations): after every call lift(vLLM) equals the spec's state,
  and spec mutants are caught.
- The file contract for `grammar_compile_steps` and `grammar_error`.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json
from schedspec.reference.state_json import state_from_json, state_to_json
from schedspec.spec import scheduler as S
from schedspec.spec import structured_output as SO
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.input_processor import make_request
from schedspec.spec.invariants import check_state
from schedspec.spec.properties import PROPERTIES
from schedspec.spec.request import RequestStatus
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both

SEED = 31
NUM_SCENARIOS = 80


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128, block_size=4,
                                     num_gpu_blocks=40), **kw})


def grammar_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if any(r.grammar_compile_steps is not None for r in s.requests)]


def waiting_state(c: SchedulerConfig) -> SchedulerState:
    s = SchedulerState(c)
    for rid, grammar in (("a", True), ("b", False), ("c", True), ("d", False)):
        s = S.add_request(s, make_request(c, rid, 8, 3, arrival_time=float(ord(rid)), structured_output=grammar))
    return s


def test_a_request_waits_for_its_grammar_in_its_place():
    c = config()
    s = waiting_state(c)
    assert s.requests["a"].status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    out, after = S.schedule(s)
    assert out.scheduled_new_reqs == ("b", "d") and after.waiting == ("a", "c")
    assert PROPERTIES["grammar_wait_respected"].check(s, out, after).holds
    _, after = S.update_from_output(after, out, {"b": [100], "d": [100]})
    assert not [n for n, v in check_state(after).items() if not v.holds]
    # Compiled: promoted to WAITING and admitted as a new request, in queue order.
    s2 = S.grammar_compiled(after, ["c"])
    out2, after2 = S.schedule(s2)
    assert out2.scheduled_new_reqs == ("c",) and after2.waiting == ("a",)
    assert after2.requests["c"].status == RequestStatus.RUNNING and after2.requests["c"].grammar == "compiled"


def test_a_failed_grammar_is_noted_once_and_finished_with_an_error():
    c = config()
    s = S.grammar_compiled(waiting_state(c), ["a"], failed=True)
    out, after = S.schedule(s)
    assert after.grammar_compile_error_reqs == ("a",) and "a" in after.waiting
    out2, again = S.schedule(after)  # reached again before the update: noted once (a dict key, S:3691)
    assert again.grammar_compile_error_reqs == ("a",)
    finished, done = S.update_from_output(again, out, {"b": [100], "d": [100]})
    assert ("a", RequestStatus.FINISHED_ERROR) == finished[-1]
    assert "a" not in done.requests and "a" in done.finished_req_ids and not done.grammar_compile_error_reqs
    # State JSON keeps both the grammar and the errors noted.
    for st in (after, s):
        assert state_from_json(state_to_json(st)) == st


def test_the_property_sees_a_broken_rule(monkeypatch):
    real = SO.waits_for_grammar
    monkeypatch.setattr(SO, "waits_for_grammar", lambda w, rid: False if w.requests[rid].grammar else real(w, rid))
    s = waiting_state(config())
    out, after = S.schedule(s)
    assert not PROPERTIES["grammar_wait_respected"].check(s, out, after).holds


def test_structured_output_is_modelled_for_the_newest_release_only():
    with pytest.raises(ConfigError, match="grammar_compile_steps"):
        make_request(config(vllm_version="0.30.0"), "a", 8, 3, structured_output=True)


def test_random_scenarios_draw_structured_output():
    drawn = grammar_scenarios()
    assert len(drawn) >= NUM_SCENARIOS // 8
    assert any(r.grammar_error for s in drawn for r in s.requests)
    assert not any(r.grammar_compile_steps is not None for i in range(NUM_SCENARIOS)
                   for r in random_scenario(SEED, i, FLAGS_ALL, features_for("torch", "spec")).requests)


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    errors = waits = 0
    for scenario in grammar_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        errors += sum(1 for s in trace["summary"]["requests"].values() if s["finish_reason"] == "error")
        waits += sum(1 for st in trace["steps"] if st["waiting"] and st["scheduled"])
    assert both.calls > 0 and waits > 0 and errors > 0


@pytest.mark.parametrize("mutant", ["no_wait", "no_error_finish"])
def test_vllm_catches_a_broken_spec(vllm, monkeypatch, mutant):
    if mutant == "no_wait":
        real = SO.waits_for_grammar
        monkeypatch.setattr(SO, "waits_for_grammar",
                            lambda w, rid: False if w.requests[rid].grammar == "compiling" else real(w, rid))
    else:
        monkeypatch.setattr(SO, "take_grammar_errors", lambda w: ())
    for scenario in grammar_scenarios():
        if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
            return
    pytest.fail(f"the spec mutant {mutant} agreed with vLLM on every scenario")


def scenario(config: dict, **request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "x", "config": config,
            "requests": [{"id": "a", "prompt_len": 4, **request}], "max_steps": 20}


def test_the_file_contract():
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.grammar_error: true without a grammar"):
        scenario_from_json(scenario({}, grammar_error=True))
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.grammar_compile_steps"):
        scenario_from_json(scenario({}, grammar_compile_steps=-1))
    s = scenario_from_json(scenario({}, grammar_compile_steps=3, grammar_error=True))
    assert s.requests[0].grammar_compile_steps == 3 and scenario_from_json(s.to_json()) == s
    trace = run_scenario(s, SpecScheduler())
    assert trace["summary"]["requests"]["a"]["finish_reason"] == "error"
    assert trace["summary"]["requests"]["a"]["finish_step"] == 3


def test_torch_refuses_structured_output():
    from schedspec.gpu.batch import prepare
    from schedspec.reference.loader import load_impl

    s = scenario_from_json(scenario({}, grammar_compile_steps=1))
    assert "does not model structured output" in prepare(s)
    trace = run_scenario(s, load_impl("torch", device="cpu"))
    assert "does not model structured output" in trace["error"]
