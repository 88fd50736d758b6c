"""LoRA (spec/lora.py) against vLLM 0.33.0's scheduler: at most max_loras distinct
adapters run at once; an admission that would bring one more is skipped and keeps
its place; with prefix caching blocks of different adapters never match.

- The rule on hand-built states, and the property max_loras_respected.
- Side by side with vLLM on random scenarios that draw LoRA (all four flag
  combinations): after every call lift(vLLM) equals the spec's state, and a spec
  mutant without the rule is caught.
- The file contract for `max_loras` and `lora_int_id`.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import ScenarioError, scenario_from_json
from schedspec.spec import lora as L
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.input_processor import make_request
from schedspec.spec.properties import PROPERTIES
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both

SEED = 31
NUM_SCENARIOS = 80


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128, block_size=4,
                                     num_gpu_blocks=40, max_loras=1), **kw})


def lora_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if s.config.max_loras is not None]


def test_an_admission_bringing_one_adapter_too_many_is_skipped_and_keeps_its_place():
    c = config()
    s = SchedulerState(c)
    for rid, adapter in (("a", 1), ("b", 2), ("c", 1), ("d", 0)):
        s = S.add_request(s, make_request(c, rid, 4, 3, arrival_time=float(ord(rid)), lora_int_id=adapter))
    out, after = S.schedule(s)
    assert out.scheduled_new_reqs == ("a", "c", "d")
    assert after.waiting == ("b",)
    assert PROPERTIES["max_loras_respected"].check(s, out, after).holds


def test_blocks_of_different_adapters_never_match():
    c = config(enable_prefix_caching=True, max_loras=2)
    tokens = list(range(300, 308))
    a, b, a2 = (make_request(c, rid, 8, 3, prompt_token_ids=tokens, lora_int_id=x)
                for rid, x in (("a", 1), ("b", 2), ("a2", 1)))
    assert a.block_hashes == a2.block_hashes and not set(a.block_hashes) & set(b.block_hashes)
    plain = make_request(config(enable_prefix_caching=True), "p", 8, 3, prompt_token_ids=tokens)
    assert not set(plain.block_hashes) & set(a.block_hashes)


def test_the_property_sees_a_broken_rule(monkeypatch):
    monkeypatch.setattr(L, "exceeds_max_loras", lambda c, loras, r: False)
    c = config()
    s = SchedulerState(c)
    for rid, adapter in (("a", 1), ("b", 2)):
        s = S.add_request(s, make_request(c, rid, 4, 3, arrival_time=float(ord(rid)), lora_int_id=adapter))
    out, after = S.schedule(s)
    assert not PROPERTIES["max_loras_respected"].check(s, out, after).holds


def test_random_scenarios_draw_lora():
    drawn = lora_scenarios()
    assert len(drawn) >= NUM_SCENARIOS // 8
    assert any(len({r.lora_int_id for r in s.requests} - {0}) > s.config.max_loras for s in drawn)
    assert not any(random_scenario(SEED, i, FLAGS_ALL, features_for("torch", "spec")).config.max_loras
                   for i in range(NUM_SCENARIOS))


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    held_back = 0
    for scenario in lora_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        for st in trace["steps"]:
            held_back += bool(st["waiting"]) and bool(st["scheduled"])
    assert both.calls > 0 and held_back > 0


def test_vllm_catches_a_spec_without_the_rule(vllm, monkeypatch):
    monkeypatch.setattr(L, "exceeds_max_loras", lambda c, loras, r: False)
    for scenario in lora_scenarios():
        if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
            return
    pytest.fail("the spec without the max_loras rule agreed with vLLM on every scenario")


def scenario(config: dict, **request) -> dict:
    return {"format": "schedspec.scenario/1", "name": "x", "config": config,
            "requests": [{"id": "a", "prompt_len": 4, **request}]}


def test_an_adapter_needs_lora_on():
    with pytest.raises(ScenarioError, match=r"^requests\[0\]\.lora_int_id: = 3, but LoRA is off"):
        scenario_from_json(scenario({}, lora_int_id=3))
    s = scenario_from_json(scenario({"max_loras": 2}, lora_int_id=3))
    assert s.requests[0].lora_int_id == 3 and scenario_from_json(s.to_json()) == s


@pytest.mark.parametrize("raw", [{"max_loras": 0}, {"max_loras": 2, "vllm_version": "0.32.0"}])
def test_max_loras_is_checked(raw):
    with pytest.raises(ConfigError, match=r"^config\.max_loras"):
        config_from_dict(raw)
