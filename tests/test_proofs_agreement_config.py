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

import pytest
import z3

from schedspec.proofs import release
from schedspec.proofs.symbolic import BLOCK_SIZES, WATERMARKS, SymConfig, config_substitution
from mutants import Mutation, mutated
from schedspec.spec import config as spec_config
from schedspec.spec.config import ConfigError, SchedulerConfig
from schedspec.spec.versions import RELEASES, fields_lacking

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
    """Inside the release's stated restriction (release.restriction())."""
    return (config.max_num_scheduled_tokens is not None and config.max_num_scheduled_tokens <= 0) \
        or config.long_prefill_token_threshold < 0


@pytest.mark.parametrize("version", RELEASES)
def test_constraints_admit_exactly_the_configs_the_spec_accepts(version):
    release.set_release(version)
    try:
        lacking = fields_lacking(version)
        c = SymConfig.fresh()
        constraints = c.constraints()  # for the release set above
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
    finally:
        release.set_release(release.DEFAULT_RELEASE)


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
