"""The configs the proofs quantify over are the configs the spec accepts.

Every obligation assumes the encoding's config constraints
(proofs/symbolic.py `SymConfig.constraints`); spec/config.py `validate_config`
says which configs exist.  If the constraints admitted a config the spec
rejects, a proof could rest on a config vLLM never runs; if they left out one
the spec accepts, a proof would say nothing about it.  The step agreement tests
only ever see valid configs, so neither would show there.

Here both are evaluated on configs at the boundary of every comparison either
makes (each field at its minimum, one below and one above; every relation
between two fields equal, off by one each way), in every modelled release:
- a config the constraints admit is one the spec accepts, always;
- a config the spec accepts is one the constraints admit, except where the
  release's stated restriction leaves it out (proofs/release.py `restriction`:
  `max_num_scheduled_tokens` <= 0 and a negative `long_prefill_token_threshold`
  in the releases that accept them).
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest
import z3

from schedspec.proofs import loop_config
from schedspec.proofs.release import Release
from schedspec.proofs.symbolic import BLOCK_SIZES, WATERMARKS, Evaluator, SymConfig, config_substitution, const_val
from mutants import Mutation, mutated
from schedspec.spec import config as spec_config
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.versions import ADAPTIVE_THRESHOLD, DEFAULT_RELEASE, RELEASES, fields_lacking, models

# A base where every relation the two sides make is tight: B = L = seqs = active
# = threshold, and the pool holds exactly one max_model_len sequence.
TIGHT = dict(max_num_batched_tokens=4, max_num_scheduled_tokens=1, max_num_seqs=4, max_num_active_seqs=4,
             long_prefill_token_threshold=4, max_model_len=4, block_size=2, num_gpu_blocks=3)
INTS = tuple(TIGHT)
NULLABLE = ("max_num_scheduled_tokens", "max_num_active_seqs")
# Bases for block sizes that do not divide max_model_len, and an unset budget.
BASES = [TIGHT,
         {**TIGHT, "block_size": 3, "num_gpu_blocks": 3},  # cdiv(4, 3) = 2 usable blocks
         {**TIGHT, "block_size": 1, "num_gpu_blocks": 5, "max_num_scheduled_tokens": None,
          "max_num_active_seqs": None, "long_prefill_token_threshold": 0},
         {**TIGHT, "max_num_batched_tokens": 1, "max_num_seqs": 1, "max_num_active_seqs": 1,
          "max_model_len": 1, "long_prefill_token_threshold": 1, "num_gpu_blocks": 2}]


def boundary_configs():
    """Each base with one or two integer fields moved by -1, 0 or +1 (or to
    null where the field may be null), with chunked prefill on and off."""
    seen = set()
    for base in BASES:
        for f, g in itertools.combinations_with_replacement(INTS, 2):
            for df, dg in itertools.product((-1, 0, 1, None), repeat=2):
                values = dict(base)
                ok = True
                for field, d in ((f, df), (g, dg)):
                    if d is None:
                        if field not in NULLABLE:
                            ok = False
                            break
                        values[field] = None
                    elif values[field] is not None:
                        values[field] += d
                if not ok:
                    continue
                for chunked in (True, False):
                    key = (tuple(values.items()), chunked)
                    if key in seen:
                        continue
                    seen.add(key)
                    yield dict(values, enable_chunked_prefill=chunked)


def spec_accepts(config: SchedulerConfig) -> bool:
    try:
        spec_config.validate_config(config)  # through the module: the mutants below replace it
    except ConfigError:
        return False
    return True


def encoding_admits(config: SchedulerConfig, c: SymConfig, constraints) -> bool:
    verdict = z3.simplify(z3.substitute(constraints, *config_substitution(c, config)))
    assert z3.is_true(verdict) or z3.is_false(verdict), verdict
    return z3.is_true(verdict)


def restricted(config: SchedulerConfig) -> bool:
    """Inside the release's stated restriction (Release.restriction())."""
    return (config.max_num_scheduled_tokens is not None and config.max_num_scheduled_tokens <= 0) \
        or config.long_prefill_token_threshold < 0


@pytest.mark.parametrize("version", RELEASES)
def test_constraints_admit_exactly_the_configs_the_spec_accepts(version):
    lacking = fields_lacking(version)
    c = SymConfig.fresh(release=Release(version))
    constraints = c.constraints()
    counts = {"accepted": 0, "rejected": 0, "restricted": 0}
    for i, values in enumerate(boundary_configs()):
        # the watermarks in turn: the two sides' checks of it do not depend on the others
        watermark = list(WATERMARKS)[i % len(WATERMARKS)]
        config = SchedulerConfig(**values, watermark=watermark, vllm_version=version)
        if "max_num_active_seqs" in lacking:  # the field's absent value
            config = dataclasses.replace(config, max_num_active_seqs=None)
        if "watermark" in lacking:
            config = dataclasses.replace(config, watermark=0.0)
        if config.block_size not in BLOCK_SIZES:
            continue  # outside the encoding's block-size set (its bound says so)
        accepts, admits = spec_accepts(config), encoding_admits(config, c, constraints)
        assert not admits or accepts, ("the encoding admits a config the spec rejects", config)
        if accepts and not admits:
            assert restricted(config), ("the spec accepts a config the encoding leaves out", config)
            counts["restricted"] += 1
        counts["accepted" if accepts else "rejected"] += 1
    # both verdicts at the boundaries, many times over
    assert counts["accepted"] >= 200 and counts["rejected"] >= 200, counts


def test_the_comparison_sees_a_constraint_off_by_one(monkeypatch):
    """A constraint moved by one (the pool may hold one block less than a full
    sequence) makes the comparison fail: the boundary configs reach it."""
    original = SymConfig.constraints

    def looser(self):
        return z3.substitute(original(self), (self.num_gpu_blocks, self.num_gpu_blocks + 1))

    monkeypatch.setattr(SymConfig, "constraints", looser)
    with pytest.raises(AssertionError, match="admits a config the spec rejects"):
        test_constraints_admit_exactly_the_configs_the_spec_accepts("0.33.0")


SPEC_MUTANTS = {
    "pool_one_block_short": Mutation("config.validate_config", "c.num_gpu_blocks - 1 < need",
                                     "c.num_gpu_blocks < need"),
    "batched_equal_seqs_rejected": Mutation("config.validate_config", "c.max_num_batched_tokens < c.max_num_seqs",
                                            "c.max_num_batched_tokens <= c.max_num_seqs"),
    "active_equal_seqs_rejected": Mutation("config.validate_config", "c.max_num_active_seqs > c.max_num_seqs",
                                           "c.max_num_active_seqs >= c.max_num_seqs"),
    "threshold_equal_len_rejected": Mutation("config.validate_config",
                                             "c.long_prefill_token_threshold > c.max_model_len",
                                             "c.long_prefill_token_threshold >= c.max_model_len"),
    "chunked_off_len_unchecked": Mutation("config.validate_config",
                                          "c.max_num_batched_tokens < c.max_model_len and not c.enable_chunked_prefill",
                                          "False"),
}


@pytest.mark.parametrize("name", sorted(SPEC_MUTANTS))
def test_the_comparison_sees_a_spec_check_off_by_one(name):
    with mutated([SPEC_MUTANTS[name]]):
        with pytest.raises(AssertionError):
            test_constraints_admit_exactly_the_configs_the_spec_accepts("0.33.0")


# --- the loop encoding's configs (proofs/loop_config.py LoopConfig) --------------------------------
#
# The `loop:` claims quantify over LoopConfig.constraints: every config field the
# two loops read, speculative decoding's and LoRA's among them, per release.  The
# comparison is the one above, on configs whose fields outside LoopConfig are at a
# base the spec accepts (max_num_seqs moves with max_num_active_seqs, so that the
# run-slot limit M is the one the spec compares with max_num_batched_tokens).
# Restricted: as above, and a multi-module MTP drafter's prefill lookahead (> 1,
# outside the loop claims, loop_claims.py's docstring).

NO_DRAFTER = dict(TIGHT, num_speculative_tokens=0, num_lookahead_tokens=0, max_num_new_slots_for_drafting=0,
                  num_prefill_lookahead_tokens=0, max_loras=None, num_hash_lookahead_tokens=0)
LOOP_BASES = [
    NO_DRAFTER,
    {**NO_DRAFTER, "block_size": 3, "num_gpu_blocks": 3},
    # an EAGLE-family drafter: one draft, a lookahead slot, a parallel drafter's row
    {**NO_DRAFTER, "num_speculative_tokens": 1, "num_lookahead_tokens": 1, "max_num_new_slots_for_drafting": 1,
     "num_prefill_lookahead_tokens": 1},
    {**NO_DRAFTER, "max_loras": 1},
    # prefix caching on (the bases above: off): block hashes that cover a token past
    # the block (num_hash_lookahead_tokens, LoopConfig.LH) only with it on
    {**NO_DRAFTER, "enable_prefix_caching": True},
]
LOOP_SIZES = ("max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs", "long_prefill_token_threshold",
              "max_model_len", "num_gpu_blocks")
LOOP_DRAFTER = ("num_speculative_tokens", "num_lookahead_tokens", "max_num_new_slots_for_drafting",
                "num_prefill_lookahead_tokens", "max_loras", "num_hash_lookahead_tokens")
LOOP_NULLABLE = ("max_num_scheduled_tokens", "max_loras")
# LoopConfig reads the watermark as blocks (wm, any integer the spec can make of it),
# so watermarks outside the bounded encoding's set are compared too: just below 1
# (wm = U on these pools) and 1 itself, which the spec rejects.
LOOP_WATERMARKS = (0.0, 0.1, 0.3, 0.999, 1.0)


def loop_boundary_configs(pairs: bool):
    """Each base with one field moved by -1, +1 or to null (where nullable), and with
    `pairs` two fields of the same group (sizes, or drafter and LoRA), chunked prefill
    on and off."""
    moves = [((f, d),) for f in LOOP_SIZES + LOOP_DRAFTER for d in (-1, 1, None)]
    if pairs:
        for group in (LOOP_SIZES, LOOP_DRAFTER):
            for f, g in itertools.combinations(group, 2):
                moves += [((f, df), (g, dg)) for df, dg in itertools.product((-1, 1, None), repeat=2)]
    seen = set()
    for base in LOOP_BASES:
        for move in [()] + moves:
            values = dict(base)
            if any(d is None and f not in LOOP_NULLABLE for f, d in move):
                continue
            for f, d in move:
                if d is None:
                    values[f] = None
                elif values[f] is None:
                    values[f] = 1 if f == "max_loras" else 4  # a null field set: to its base's value
                else:
                    values[f] += d
            values["max_num_active_seqs"] = values["max_num_seqs"]
            for chunked in (True, False):
                key = (tuple(values.items()), chunked)
                if key not in seen:
                    seen.add(key)
                    yield dict(values, enable_chunked_prefill=chunked)


def loop_restricted(config: SchedulerConfig) -> bool:
    return restricted(config) or config.num_prefill_lookahead_tokens > 1


class LoopAdmits:
    """LoopConfig.constraints of `release`, per block size, evaluated on a config."""

    def __init__(self, release: Release):
        self.sym = {bs: loop_config.LoopConfig.fresh(f"cfg{bs}", bs, release) for bs in BLOCK_SIZES}
        self.ev = {bs: Evaluator([c.constraints()]) for bs, c in self.sym.items()}

    def __call__(self, config: SchedulerConfig) -> bool:
        c = self.sym[config.block_size]
        values = loop_config.config_values(config, config.long_prefill_token_threshold)
        pairs = [(getattr(c, f), const_val(v)) for f, v in values.items()]
        return self.ev[config.block_size](pairs)[0]


@pytest.mark.parametrize("version", RELEASES)
def test_loop_constraints_admit_exactly_the_configs_the_spec_accepts(version):
    admits = LoopAdmits(Release(version))
    counts = {"accepted": 0, "rejected": 0, "restricted": 0, "drafter accepted": 0, "drafter rejected": 0}
    # the whole family in the release that models every field, single moves in the others
    for i, values in enumerate(loop_boundary_configs(pairs=version == DEFAULT_RELEASE)):
        config = SchedulerConfig(**values, watermark=LOOP_WATERMARKS[i % len(LOOP_WATERMARKS)],
                                 vllm_version=version)
        if "max_num_active_seqs" in fields_lacking(version):
            config = dataclasses.replace(config, max_num_active_seqs=None)
        if "watermark" in fields_lacking(version):
            config = dataclasses.replace(config, watermark=0.0)
        accepts, admitted = spec_accepts(config), admits(config)
        assert not admitted or accepts, ("the loop encoding admits a config the spec rejects", config)
        if accepts and not admitted:
            assert loop_restricted(config), ("the spec accepts a config the loop encoding leaves out", config)
            counts["restricted"] += 1
        counts["accepted" if accepts else "rejected"] += 1
        if config.num_speculative_tokens or config.num_prefill_lookahead_tokens:
            counts["drafter accepted" if accepts else "drafter rejected"] += 1
    least = 200 if version == DEFAULT_RELEASE else 20
    assert counts["accepted"] >= least and counts["rejected"] >= least, counts
    # a drafter's configs reach both verdicts (in the older releases, only rejections)
    assert counts["drafter rejected"] >= 10, counts
    # (0.34.0 accepts fewer drafters than 0.33.0 did: 0 or 1 rows, the one row a draft
    # model's; 47 of the family, against 50+ under 0.33.0)
    assert version != DEFAULT_RELEASE or counts["drafter accepted"] >= 40, counts


LOOP_SPEC_MUTANTS = {
    "hash_lookahead_without_prefix_caching": Mutation(
        "config.validate_spec_decode", "c.num_hash_lookahead_tokens > 0 and not c.enable_prefix_caching",
        "c.num_hash_lookahead_tokens > 1 and not c.enable_prefix_caching"),
    "hash_lookahead_in_every_release": Mutation(
        "config.validate_spec_decode", "c.num_hash_lookahead_tokens > 0 and not models(c, HASH_LOOKAHEAD)",
        "c.num_hash_lookahead_tokens > 1 and not models(c, HASH_LOOKAHEAD)"),
    "drafts_in_every_release": Mutation("config.validate_spec_decode",
                                        "c.num_speculative_tokens > 0 and not models(c, SPEC_DECODE)",
                                        "c.num_speculative_tokens > 1 and not models(c, SPEC_DECODE)"),
    "prefill_lookahead_without_drafts": Mutation("config.validate_drafter",
                                                 "c.num_prefill_lookahead_tokens > 0 and c.num_speculative_tokens == 0",
                                                 "c.num_prefill_lookahead_tokens > 1 and c.num_speculative_tokens == 0"),
    "lookahead_without_drafts": Mutation("config.validate_spec_decode",
                                         "c.num_lookahead_tokens > 0 and c.num_speculative_tokens == 0", "False"),
    "watermark_of_one": Mutation("config.validate_field_bounds", "not (0.0 <= c.watermark < 1.0)",
                                 "not (0.0 <= c.watermark <= 1.0)"),
    "drafter_rows_above_drafts": Mutation("config.validate_spec_decode",
                                          "c.max_num_new_slots_for_drafting > c.num_speculative_tokens",
                                          "c.max_num_new_slots_for_drafting > c.num_speculative_tokens + 1"),
}


@pytest.mark.parametrize("name", sorted(LOOP_SPEC_MUTANTS))
def test_the_loop_comparison_sees_a_spec_check_off_by_one(name):
    versions = ("0.32.0",) if name in ("drafts_in_every_release", "hash_lookahead_in_every_release") else ("0.33.0",)
    with mutated([LOOP_SPEC_MUTANTS[name]]):
        with pytest.raises(AssertionError, match="leaves out"):
            for version in versions:
                test_loop_constraints_admit_exactly_the_configs_the_spec_accepts(version)


@pytest.mark.parametrize("field", ["PL", "wm", "LH"])
def test_the_loop_comparison_sees_a_constraint_dropped(monkeypatch, field):
    """LoopConfig without its bounds on the prefill lookahead (0 or 1, only beside
    drafts), on the watermark's blocks (at most U) or on the hash lookahead (only
    with prefix caching) admits configs the spec rejects: a lookahead without
    drafts, a watermark of 1, a hash lookahead without prefix caching."""
    original = loop_config.LoopConfig.constraints

    def looser(self):
        return z3.substitute(original(self), (getattr(self, field), z3.IntVal(0)))

    monkeypatch.setattr(loop_config.LoopConfig, "constraints", looser)
    with pytest.raises(AssertionError, match="admits a config the spec rejects"):
        test_loop_constraints_admit_exactly_the_configs_the_spec_accepts("0.33.0")


# --- the long-prefill threshold in force (loop_config.threshold_in_force) ----------------------
#
# running_never_starved's lemma on a grown adaptive threshold reads the threshold in
# force of two steps as loop_config.threshold_in_force; here it is compared with
# the spec's config.long_prefill_threshold at the boundaries of its comparisons:
# the threshold 0 and 1, eligible requests 0, 1 and 2, max_num_batched_tokens //
# eligible equal to the threshold and off by one each way.

THRESHOLD_T = (0, 1, 2, 3, 4, 5)
THRESHOLD_B = (1, 2, 7, 8, 9, 16, 64)
THRESHOLD_NE = (0, 1, 2, 3, 4, 8)


def threshold_cases(version):
    for T, B, NE, chunked in itertools.product(THRESHOLD_T, THRESHOLD_B, THRESHOLD_NE, (True, False)):
        for adaptive in (False, True) if models(version, ADAPTIVE_THRESHOLD) else (False,):
            yield T, B, NE, adaptive, chunked


@pytest.mark.parametrize("version", RELEASES)
def test_threshold_in_force_agrees_with_the_spec(version):
    T, adaptive, B, NE, chunked = z3.Int("T"), z3.Bool("adaptive"), z3.Int("B"), z3.Int("NE"), z3.Bool("chunked")
    ev = Evaluator([loop_config.threshold_in_force(T, adaptive, B, NE, chunked, Release(version))])
    base = SchedulerConfig(**TIGHT, vllm_version=version)
    grown = 0
    for t, b, ne, ad, ch in threshold_cases(version):
        config = dataclasses.replace(base, long_prefill_token_threshold=t, max_num_batched_tokens=b,
                                     long_prefill_token_threshold_adaptive=ad, enable_chunked_prefill=ch)
        (mine,) = ev([(T, const_val(t)), (adaptive, const_val(ad)), (B, const_val(b)), (NE, const_val(ne)),
                      (chunked, z3.BoolVal(ch))])
        assert mine == spec_config.long_prefill_threshold(config, ne), (version, t, b, ne, ad, ch, mine)
        grown += ad and ne >= 2 and mine > t
    # the adaptive branch is reached where the release has it
    assert not models(version, ADAPTIVE_THRESHOLD) or grown >= 20, grown


THRESHOLD_SPEC_MUTANTS = {
    "adaptive_from_zero": Mutation("config.long_prefill_threshold",
                                   "threshold > 0 and c.long_prefill_token_threshold_adaptive",
                                   "threshold >= 0 and c.long_prefill_token_threshold_adaptive"),
    "alone_at_zero_only": Mutation("config.long_prefill_threshold", "num_eligible <= 1", "num_eligible < 1"),
    "adaptive_share_of_one_more": Mutation("config.long_prefill_threshold",
                                           "c.max_num_batched_tokens // num_eligible",
                                           "c.max_num_batched_tokens // (num_eligible + 1)"),
}


@pytest.mark.parametrize("name", sorted(THRESHOLD_SPEC_MUTANTS))
def test_the_threshold_comparison_sees_a_spec_change(name):
    with mutated([THRESHOLD_SPEC_MUTANTS[name]]):
        with pytest.raises(AssertionError, match=r"^\('" + re.escape(DEFAULT_RELEASE) + "', "):
            test_threshold_in_force_agrees_with_the_spec(DEFAULT_RELEASE)
