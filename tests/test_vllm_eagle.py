"""EAGLE-family drafters (vLLM 0.33.0).  The block drop (`use_eagle_block_drop`):
a drafter building a position's draft KV from the token after it, which a cached
block's hash does not cover, makes a prefix hit give back its last block to be
recomputed (single_type_kv_cache_manager.py:829-837; the flag, scheduler.py:330-345).
The prefill lookahead (`num_prefill_lookahead_tokens`): a multi-module MTP drafter
reads that many prompt tokens past a chunk, so a chunk never ends within them of the
prefill's end (scheduler.py:678-697), and its last lookahead - 1 computed tokens are
not cached (kv_cache_coordinator.py:118, 350-356).

- The rules on the spec: hits one block shorter, a one-block hit none at all;
  nothing without prefix caching; MTP chunks cut, a waiting request cut to nothing
  skipped in its place, fewer blocks cached.
- Side by side with vLLM (EAGLE-3 and multi-module MTP drafters, built from an
  n-gram config) on random scenarios that draw them: after every call lift(vLLM)
  equals the spec's state; and the spec without each rule is caught.
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

SEED = 38  # draws EAGLE-family drafters that tell each rule apart, for 0.33.0 and 0.34.0 alike
NUM_SCENARIOS = 240

# The spec without each rule: every hit kept whole; chunks ending anywhere; every
# computed token cached.
MUTANTS = {
    "no_drop": [Mutation("spec_decode.eagle_block_drop",
                         "hits[:-1] if config.use_eagle_block_drop and hits else hits", "hits")],
    "no_chunk_reserve": [Mutation("spec_decode.reserve_prefill_lookahead",
                                  "0 < remaining < config.num_prefill_lookahead_tokens", "False")],
    "all_cached": [Mutation("spec_decode.cacheable_tokens",
                            "max(0, num_tokens - max(0, config.num_prefill_lookahead_tokens - 1))", "num_tokens")],
}


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, block_size=4,
                                     num_gpu_blocks=40, enable_prefix_caching=True, num_speculative_tokens=2,
                                     num_prefill_lookahead_tokens=1, use_eagle_block_drop=True), **kw})


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


def test_only_final_tokens_are_cached_under_mtp():
    """A multi-module MTP drafter of 3 (lookahead 3): of the 16 tokens `a` computed,
    14 are final, so 3 blocks are cached, not 4, and `b` finds 12 tokens."""
    first = list(range(100, 116))
    second = first + list(range(500, 504))
    assert admitted_hit(config(num_speculative_tokens=3, num_prefill_lookahead_tokens=3, use_eagle_block_drop=False),
                        first, second) == 12
    assert admitted_hit(config(use_eagle_block_drop=False), first, second) == 16


def grants(c: SchedulerConfig, *prompts: int) -> tuple[dict[str, int], SchedulerState]:
    s = SchedulerState(c)
    for i, n in enumerate(prompts):
        s = S.add_request(s, make_request(c, f"r{i}", n, 3, prompt_token_ids=list(range(1000 * i, 1000 * i + n))))
    out, s = S.schedule(s)
    return dict(out.num_scheduled_tokens), s


@pytest.mark.parametrize("lookahead, budget, expected", [
    (3, 9, 7),  # 9 would leave 1 of 10: cut to leave 3
    (3, 7, 7),  # leaves 3: kept
    (3, 10, 10),  # the whole prefill
    (1, 9, 9),  # EAGLE: void
])
def test_an_mtp_chunk_ends_outside_the_lookahead(lookahead, budget, expected):
    c = config(num_speculative_tokens=3, num_prefill_lookahead_tokens=lookahead, use_eagle_block_drop=False,
               max_num_batched_tokens=budget, enable_prefix_caching=False, enable_chunked_prefill=True)
    assert grants(c, 10)[0] == {"r0": expected}


def test_a_waiting_request_cut_to_nothing_is_skipped_in_its_place():
    # r0: a chunk of 1 of 3 would leave 2 < 3: nothing, skipped; r1 behind it is admitted.
    c = config(num_speculative_tokens=3, num_prefill_lookahead_tokens=3, use_eagle_block_drop=False,
               max_num_batched_tokens=1, enable_prefix_caching=False, enable_chunked_prefill=True)
    got, s = grants(c, 3, 1)
    assert got == {"r1": 1} and tuple(s.waiting) == ("r0",)


def test_nothing_to_drop_without_prefix_caching():
    c = config(enable_prefix_caching=False)
    first = list(range(100, 116))
    assert admitted_hit(c, first, first[:12] + [7, 8]) == 0


# Three prompts sharing three blocks: the second and third find two of them.
SHARED_BLOCKS = scenario_from_json({
    "format": "schedspec.scenario/1", "name": "eagle-shared-blocks",
    "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
               "num_gpu_blocks": 40, "enable_prefix_caching": True, "num_speculative_tokens": 2,
               "num_prefill_lookahead_tokens": 1, "use_eagle_block_drop": True},
    "requests": [{"id": rid, "arrival_step": step, "prompt_len": n, "max_tokens": 6, "prefix_group": "g",
                  "prefix_len": 12} for rid, step, n in (("a", 0, 16), ("b", 2, 16), ("c", 3, 13))]})


def eagle_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [SHARED_BLOCKS] + [s for s in drawn if s.config.num_prefill_lookahead_tokens]


def test_random_scenarios_draw_eagle_family_drafters():
    drawn = eagle_scenarios()[1:]
    assert all(s.config.num_speculative_tokens for s in drawn)
    dropping = [s for s in drawn if s.config.use_eagle_block_drop]
    assert len(dropping) >= 5 and all(s.config.enable_prefix_caching for s in dropping)
    assert not any(s.config.num_hash_lookahead_tokens for s in dropping)
    mtp = [s for s in drawn if s.config.num_prefill_lookahead_tokens > 1]
    assert len(mtp) >= 5 and any(s.config.enable_prefix_caching for s in mtp)
    assert any(s.config.async_scheduling for s in drawn)


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


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_vllm_catches_a_spec_without_the_rule(vllm, mutant):
    with mutated(MUTANTS[mutant], module="spec_decode"):
        for scenario in eagle_scenarios():
            if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
                return
    pytest.fail(f"the spec with {mutant} agreed with vLLM on every scenario")


EAGLE = {"num_speculative_tokens": 2, "num_prefill_lookahead_tokens": 1}


@pytest.mark.parametrize("raw, field, why", [
    ({"use_eagle_block_drop": True, "num_speculative_tokens": 2}, "use_eagle_block_drop",
     "without num_prefill_lookahead_tokens"),
    ({"use_eagle_block_drop": True, **EAGLE, "enable_prefix_caching": True, "num_hash_lookahead_tokens": 1},
     "use_eagle_block_drop", "num_hash_lookahead_tokens 1"),
    ({"use_eagle_block_drop": True, **EAGLE, "vllm_version": "0.32.0"}, "num_speculative_tokens", "0.32.0"),
    ({"use_eagle_block_drop": "yes", **EAGLE}, "use_eagle_block_drop", "true or false"),
    ({"num_prefill_lookahead_tokens": 1}, "num_prefill_lookahead_tokens", "without speculative decoding"),
    ({"num_prefill_lookahead_tokens": 5, "num_speculative_tokens": 5, "enable_prefix_caching": True,
      "block_size": 4}, "num_prefill_lookahead_tokens", "> block_size 4"),
    ({"num_prefill_lookahead_tokens": -1, "num_speculative_tokens": 2}, "num_prefill_lookahead_tokens", "-1"),
])
def test_the_fields_are_checked(raw, field, why):
    with pytest.raises(ConfigError, match=rf"^config\.{field}") as e:
        config_from_dict(raw)
    assert why in str(e.value)


def test_the_vllm_adapter_refuses_a_lookahead_it_cannot_build(vllm):
    c = config_from_dict({**EAGLE, "num_speculative_tokens": 3, "num_prefill_lookahead_tokens": 2})
    with pytest.raises(ValueError, match=r"config\.num_prefill_lookahead_tokens: = 2: the vLLM adapter builds"):
        vllm.reset(c)


def test_torch_refuses_it():
    from schedspec.gpu.batch import prepare

    assert "the torch implementation does not model speculative decoding" in prepare(SHARED_BLOCKS)
