"""The EAGLE block drop (`use_eagle_block_drop`, vLLM 0.33.0): an EAGLE-family
drafter builds a position's draft KV from the token after it, which a cached
block's hash does not cover, so a prefix hit gives back its last block to be
recomputed (single_type_kv_cache_manager.py:829-837; the flag, scheduler.py:330-345).

- The rule on the spec: hits one block shorter, a one-block hit none at all, on
  resumption too; nothing without prefix caching.
- Side by side with vLLM (an EAGLE-3 drafter without lookahead hashes) on random
  scenarios that draw it: after every call lift(vLLM) equals the spec's state;
  and the spec without the drop is caught.
- The monitor compares a scheduler with an EAGLE-family drafter, with the drop or
  with lookahead hashes (vLLM's default with prefix caching), and the spec without
  the drop diverges there.
- The file contract for the field.
"""

from __future__ import annotations

import pytest

from schedspec.reference.campaign import random_scenario
from schedspec.reference.compare import compare_traces
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import scenario_from_json
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.input_processor import make_request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 160

# The spec without the rule: every hit kept whole.
NO_DROP = [Mutation("spec_decode.eagle_block_drop", "hits[:-1] if config.use_eagle_block_drop and hits else hits",
                    "hits")]


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, block_size=4,
                                     num_gpu_blocks=40, enable_prefix_caching=True, num_speculative_tokens=2,
                                     use_eagle_block_drop=True), **kw})


def admitted_hit(c: SchedulerConfig, first: list[int], second: list[int]) -> int:
    """The prefix hit of a request with prompt `second`, admitted after one with
    prompt `first` ran a step (its prompt blocks cached)."""
    s = S.add_request(SchedulerState(c), make_request(c, "a", len(first), 3, prompt_token_ids=first))
    out, s = S.schedule(s)
    _, s = S.update_from_output(s, out, {"a": [999]})
    s = S.add_request(s, make_request(c, "b", len(second), 3, prompt_token_ids=second))
    out, _ = S.schedule(s)
    return dict(out.prefix_hits).get("b", 0)


@pytest.mark.parametrize("drop, shared, expected", [
    (False, 12, 12), (True, 12, 8),  # three shared blocks: two hit with the drop
    (False, 4, 4), (True, 4, 0),  # a one-block hit: none
])
def test_a_hit_gives_back_its_last_block(drop, shared, expected):
    c = config(use_eagle_block_drop=drop)
    first = list(range(100, 116))
    second = first[:shared] + list(range(500, 508))
    assert admitted_hit(c, first, second) == expected


def test_nothing_to_drop_without_prefix_caching():
    c = config(enable_prefix_caching=False)
    first = list(range(100, 116))
    assert admitted_hit(c, first, first[:12] + [7, 8]) == 0


# Three prompts sharing three blocks: the second and third find two of them.
SHARED_BLOCKS = scenario_from_json({
    "format": "schedspec.scenario/1", "name": "eagle-shared-blocks",
    "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
               "num_gpu_blocks": 40, "enable_prefix_caching": True, "num_speculative_tokens": 2,
               "use_eagle_block_drop": True},
    "requests": [{"id": rid, "arrival_step": step, "prompt_len": n, "max_tokens": 6, "prefix_group": "g",
                  "prefix_len": 12} for rid, step, n in (("a", 0, 16), ("b", 2, 16), ("c", 3, 13))]})


def eagle_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [SHARED_BLOCKS] + [s for s in drawn if s.config.get("use_eagle_block_drop")]


def test_random_scenarios_draw_it_with_speculative_decoding_and_prefix_caching():
    drawn = eagle_scenarios()[1:]
    assert len(drawn) >= 5
    assert all(s.config["enable_prefix_caching"] and s.config["num_speculative_tokens"] for s in drawn)
    assert not any(s.config.get("num_hash_lookahead_tokens") for s in drawn)
    assert any(s.config.get("async_scheduling") for s in drawn)


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    hits = 0
    for scenario in eagle_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        hits += sum(sum(st.get("prefix_hits", {}).values()) for st in trace["steps"])
        if scenario is SHARED_BLOCKS:  # two blocks each for b and c, not three
            assert [st["prefix_hits"] for st in trace["steps"] if any(st.get("prefix_hits", {}).values())] == \
                [{"b": 8}, {"c": 8}]
    assert both.calls > 0 and hits > 0


def test_vllm_catches_a_spec_without_the_drop(vllm):
    with mutated(NO_DROP, module="spec_decode"):
        for scenario in eagle_scenarios():
            if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
                return
    pytest.fail("the spec without the EAGLE block drop agreed with vLLM on every scenario")


@pytest.mark.parametrize("raw, why", [
    ({"use_eagle_block_drop": True}, "without speculative decoding"),
    ({"use_eagle_block_drop": True, "num_speculative_tokens": 2, "enable_prefix_caching": True,
      "num_hash_lookahead_tokens": 1}, "num_hash_lookahead_tokens 1"),
    ({"use_eagle_block_drop": True, "num_speculative_tokens": 2, "vllm_version": "0.32.0"}, "0.32.0"),
    ({"use_eagle_block_drop": "yes", "num_speculative_tokens": 2}, "true or false"),
])
def test_the_field_is_checked(raw, why):
    with pytest.raises(ConfigError, match=r"^config\.(use_eagle_block_drop|num_speculative_tokens)") as e:
        config_from_dict(raw)
    assert why in str(e.value)


def test_torch_refuses_it():
    from schedspec.gpu.batch import prepare

    assert "the torch implementation does not model speculative decoding" in prepare(SHARED_BLOCKS)
