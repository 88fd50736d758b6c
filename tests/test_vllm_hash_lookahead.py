"""Lookahead block hashes (`num_hash_lookahead_tokens`, vLLM 0.33.0's
get_request_block_hasher, kv_cache_utils.py:953-1030): a block's hash also
covers the L tokens after it, so a block is hashed, cached and found only once
they exist, and two prompts sharing a block but not the token after it share
nothing there.

- The rule on hand-built requests, as vLLM's own
  test_scheduler_publishes_lookahead_blocks_at_allocation states it.
- Side by side with vLLM on random scenarios that draw it: after every call
  lift(vLLM) equals the spec's state; and spec mutants (hashing as a block
  fills, a hash of the block alone) are caught.
- The monitor compares a scheduler whose requests carry such a hasher, and
  names a hasher it cannot read.
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
from schedspec.spec import kv_cache_utils
from schedspec.spec import scheduler as S
from schedspec.spec.config import ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.input_processor import make_request
from schedspec.spec.state import SchedulerState

from monitor_helpers import Both
from mutants import Mutation, mutated

SEED = 31
NUM_SCENARIOS = 120


def config(**kw) -> SchedulerConfig:
    return SchedulerConfig(**{**dict(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=64, block_size=2,
                                     num_gpu_blocks=40, enable_prefix_caching=True, num_hash_lookahead_tokens=1),
                              **kw})


def hit(state: SchedulerState, c: SchedulerConfig, tokens: list[int]) -> int:
    """The tokens a new request with prompt `tokens` finds cached (K:288-324)."""
    probe = make_request(c, "probe", len(tokens), 1, prompt_token_ids=tokens)
    pool = state.kv_cache.work()
    return len(pool.get_computed_blocks(probe.block_hashes, probe.num_tokens, c.block_size)) * c.block_size


def test_a_block_is_published_once_its_lookahead_token_exists():
    """vLLM's test_scheduler_publishes_lookahead_blocks_at_allocation, on the spec:
    prompt blocks at their own allocation, the block ending at the first sampled
    token at the allocation after it is sampled."""
    c = config()
    s = S.add_request(SchedulerState(c), make_request(c, "first", 4, 3, prompt_token_ids=[0, 1, 2, 3]))
    assert len(s.requests["first"].block_hashes) == 1  # block [2, 4) waits for token 4
    out, s = S.schedule(s)
    assert hit(s, c, [0, 1, 2, 3, 5, 7]) == 2
    _, s = S.update_from_output(s, out, {"first": [5]})
    _, s = S.schedule(s)
    assert hit(s, c, [0, 1, 2, 3, 5, 7]) == 4
    assert hit(s, c, [0, 1, 2, 3, 6, 7]) == 2  # the same block, another token after it


def test_hashes_lag_by_the_lookahead_and_cover_it():
    for lookahead in (0, 1, 3):
        c = config(num_hash_lookahead_tokens=lookahead)
        tokens = list(range(100, 111))
        r = make_request(c, "a", 11, 5, prompt_token_ids=tokens)
        assert len(r.block_hashes) == (11 - lookahead) // 2
        r = r.copy()
        for t in (7, 8, 9):  # appended one by one, as update_from_output does
            r.append_output_token(t, c.block_size, True)
            tokens.append(t)
            assert r.block_hashes == kv_cache_utils.extend_block_hashes((), tokens, 2, 0, lookahead)
            assert len(r.partial_block_token_ids) == len(tokens) - 2 * len(r.block_hashes)
    a, b = (make_request(config(), rid, 5, 1, prompt_token_ids=[1, 2, 3, 4, x]) for rid, x in (("a", 5), ("b", 6)))
    assert a.block_hashes[0] == b.block_hashes[0] and a.block_hashes[1] != b.block_hashes[1]


# Three prompts sharing two blocks, the token after the second one not shared:
# their first block hits, their second does not (the hash covers token 8).
SHARED_BLOCKS = scenario_from_json({
    "format": "schedspec.scenario/1", "name": "lookahead-shared-blocks",
    "config": {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 64, "block_size": 4,
               "num_gpu_blocks": 40, "enable_prefix_caching": True, "num_hash_lookahead_tokens": 1},
    "requests": [{"id": rid, "arrival_step": step, "prompt_len": n, "max_tokens": 6, "prefix_group": "g",
                  "prefix_len": 8} for rid, step, n in (("a", 0, 12), ("b", 2, 12), ("c", 3, 9))]})


def lookahead_scenarios(n: int = NUM_SCENARIOS):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [SHARED_BLOCKS] + [s for s in drawn if s.config.num_hash_lookahead_tokens]


def test_random_scenarios_draw_it_with_prefix_caching_only():
    drawn = lookahead_scenarios()[1:]
    assert len(drawn) >= 8 and {s.config.num_hash_lookahead_tokens for s in drawn} >= {1, 2}
    assert all(s.config.enable_prefix_caching for s in drawn)
    assert not any(random_scenario(SEED, i, FLAGS_ALL, features_for("torch", "spec")).config
                   .num_hash_lookahead_tokens for i in range(NUM_SCENARIOS))


def test_lift_equals_the_spec_after_every_call(vllm):
    both = Both(vllm)
    hits = 0
    for scenario in lookahead_scenarios():
        trace = run_scenario(scenario, both)
        assert "error" not in trace, trace["error"]
        hits += sum(sum(st.get("prefix_hits", {}).values()) for st in trace["steps"])
        if scenario is SHARED_BLOCKS:  # one block each for b and c, not two
            assert [st["prefix_hits"] for st in trace["steps"] if any(st.get("prefix_hits", {}).values())] == \
                [{"b": 4}, {"c": 4}]
    assert both.calls > 0 and hits > 0


# Spec mutants (tests/mutants.py): the lookahead ignored (a block hashed as it
# fills, of its own tokens); the hash lagging as it should but covering the
# block's tokens alone.
MUTANTS = {
    "hash_as_it_fills": [
        Mutation("input_processor.prompt_hashes",
                 "extend_block_hashes((), tokens, config.block_size, lora_int_id, config.num_hash_lookahead_tokens, "
                 "mm_features)", "extend_block_hashes((), tokens, config.block_size, lora_int_id, 0, mm_features)"),
        Mutation("request.Request.append_output_token", "block_size + self.num_hash_lookahead_tokens", "block_size"),
        Mutation("request.Request.append_output_token", "hash_block(parent, partial, keys)",
                 "hash_block(parent, partial[:block_size], keys)")],
    "block_alone": [
        Mutation("request.Request.append_output_token", "hash_block(parent, partial, keys)",
                 "hash_block(parent, partial[:block_size], keys)"),
        Mutation("kv_cache_utils.extend_block_hashes", "token_ids[i * block_size:(i + 1) * block_size + lookahead]",
                 "token_ids[i * block_size:(i + 1) * block_size]")],
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_vllm_catches_a_spec_without_the_rule(vllm, monkeypatch, mutant):
    from schedspec.reference import engine
    from schedspec.spec import input_processor

    with mutated(MUTANTS[mutant], module="request"):
        # The engine builds the scenario's requests with the spec's front end, imported by name.
        monkeypatch.setattr(engine, "make_request", input_processor.make_request)
        for scenario in lookahead_scenarios():
            if compare_traces(run_scenario(scenario, vllm), run_scenario(scenario, SpecScheduler())) is not None:
                return
    pytest.fail(f"the spec with {mutant} agreed with vLLM on every scenario")


@pytest.mark.parametrize("raw, why", [
    ({"num_hash_lookahead_tokens": 1}, "prefix caching"),
    ({"num_hash_lookahead_tokens": 1, "enable_prefix_caching": True, "vllm_version": "0.32.0"}, "0.32.0"),
    ({"num_hash_lookahead_tokens": -1, "enable_prefix_caching": True}, "-1"),
])
def test_the_field_is_checked(raw, why):
    with pytest.raises(ConfigError, match=r"^config\.num_hash_lookahead_tokens") as e:
        config_from_dict(raw)
    assert why in str(e.value)


def test_torch_refuses_it():
    from schedspec.reference.loader import load_impl
    from schedspec.gpu.batch import prepare

    assert "config.num_hash_lookahead_tokens: = 1: the torch implementation does not model lookahead block hashes" \
        in prepare(SHARED_BLOCKS)
    assert "does not model lookahead block hashes" in run_scenario(SHARED_BLOCKS, load_impl("torch", device="cpu"))["error"]
