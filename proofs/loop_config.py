"""What the loop encodings read of the config (`LoopConfig`), as z3 symbols for one
block size, with vLLM's acceptance conditions on them; the long-prefill threshold
in force; and the cached-block count of a request (prefix caching).

`config_values` gives the symbols' values for a concrete config, which
tests/test_proofs_agreement_config.py compares with the spec's validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import z3

from schedspec.spec import versions
from schedspec.spec.config import PRIORITY, SchedulerConfig
from schedspec.spec.versions import (INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL,
                                     LONG_PREFILL_THRESHOLD_NEEDS_TWO)

from .encoding import z3_max0, z3_min
from .release import DEFAULT, Release
from .symbolic import cdiv_const


def fresh_record(cls, prefix: str):
    """A record of dataclass `cls` whose every field is a fresh z3 symbol named
    `prefix.field`: Bool for the fields declared with `bool_field()`, Int otherwise."""
    out = {}
    for f in fields(cls):
        kind = f.metadata.get("kind", "int")
        out[f.name] = z3.Bool(f"{prefix}.{f.name}") if kind == "bool" else z3.Int(f"{prefix}.{f.name}")
    return cls(**out)


def bool_field():
    """A record field that `fresh_record` makes a z3 Bool."""
    return field(metadata={"kind": "bool"})


@dataclass(frozen=True)
class LoopConfig:
    """What the loops read of the config, for one block size.  `th` is the
    long-prefill threshold in force this step (0 with one eligible request,
    S:773-779); `hold` this step's `defer_prefills` (prefill throttling, either
    gate, spec/prefill_throttle.py; free, so every claim covers held steps and
    others); `pa` / `pn` the engine's pause_state PAUSED_ALL / PAUSED_NEW (free too);
    `wm` the watermark's blocks; `U` the usable blocks; `ML`
    max_loras, which binds when `lora` (a LoRA config) is on; `K`, `LA`, `D` and `PL`
    num_speculative_tokens, num_lookahead_tokens, max_num_new_slots_for_drafting and
    num_prefill_lookahead_tokens, all 0 unless `sd` (speculative decoding) is on.
    No rule here reads `PL`: it is in the constraints so that the drafters the
    claims cover (those that read at most one prompt token ahead, which changes no
    chunk, spec_decode.reserve_prefill_lookahead) are a stated part of the domain
    that tests/test_proofs_agreement_config.py compares with the spec's validation.
    `pc` (prefix caching) and `LH` (num_hash_lookahead_tokens) are read by the
    cached-block counts (cache_extent); the hits are inputs (WaitReq)."""

    TB0: Any  # max_num_scheduled_tokens (S:735)
    IB0: Any  # max_num_batched_tokens (S:738)
    M: Any  # max_num_active_reqs (S:1093-1096)
    L: Any  # max_model_len
    th: Any
    wm: Any
    U: Any
    ML: Any
    K: Any
    LA: Any
    D: Any  # a drafter's rows per scheduled request, charged to the input budget (S:737)
    PL: Any  # a drafter's prefill lookahead: 0 (n-gram) or 1 (EAGLE family); MTP's > 1 is outside
    LH: Any  # num_hash_lookahead_tokens: a block is hashed once this many tokens after it are known
    chunked: Any = bool_field()
    full_isl: Any = bool_field()
    prio: Any = bool_field()
    asy: Any = bool_field()  # async scheduling (the AsyncScheduler): placeholders, in-flight and stale tokens
    lora: Any = bool_field()  # a LoRA config: max_loras set (spec/config.py)
    sd: Any = bool_field()  # speculative decoding: num_speculative_tokens >= 1 (spec/spec_decode.py)
    hold: Any = bool_field()  # the step holds prefill (ScheduleWork.defer_prefills, S:766-768, 796-807)
    pa: Any = bool_field()  # pause_state PAUSED_ALL: the step starts with no token budget
    pn: Any = bool_field()  # pause_state PAUSED_NEW: admission only of requests holding KV blocks
    pc: Any = bool_field()  # enable_prefix_caching: full blocks are hashed and cached (spec/block_pool.py)
    bs: int = 1
    release: Release = DEFAULT  # the vLLM release whose rules the loops apply

    @staticmethod
    def fresh(prefix: str, bs: int, release: Release) -> "LoopConfig":
        return replace(_fresh_config(prefix), bs=bs, release=release)

    def cdiv(self, x):
        return cdiv_const(x, self.bs)

    def constraints(self):
        # vLLM's acceptance conditions that the loops rely on (spec/config.py validate_config).
        # The threshold check exists from 0.28.0 (proofs/release.py).
        th_check = self.release.checks_config("long_prefill_token_threshold_at_most_max_model_len")
        # max_loras >= 1 (spec/config.py FIELD_MINIMA); LoRA is modelled for 0.33.0 only.
        lora = z3.Implies(self.lora, self.ML >= 1) if self.release.models(versions.LORA) else z3.Not(self.lora)
        # Speculative decoding (0.33.0 only, spec/config.py validate_spec_decode and
        # validate_drafter): a lookahead and a prefill lookahead only beside drafts, at
        # most one drafter row per draft.
        # From 0.34.0 at most one row (no parallel drafting: versions.CHECKS_SINCE).
        off = z3.And(self.K == 0, self.LA == 0, self.D == 0, self.PL == 0)
        # One row is a draft model's: no prefill lookahead, a batch above its K lookahead.
        rows = z3.And(self.D <= 1, z3.Implies(self.D == 1, z3.And(self.PL == 0, self.IB0 > self.K))) \
            if self.release.checks_config("drafter_rows_at_most_one") else z3.BoolVal(True)
        sd = z3.If(self.sd, z3.And(self.K >= 1, self.LA >= 0, 0 <= self.D, self.D <= self.K, rows,
                                   0 <= self.PL, self.PL <= 1), off) \
            if self.release.models(versions.SPEC_DECODE) \
            else z3.And(z3.Not(self.sd), off)
        # wm <= U: a watermark below 1 (spec/config.py) leaves int(watermark * num_gpu_blocks)
        # at most num_gpu_blocks - 1 blocks.
        # A step holds prefill only where schedspec models prefill throttling (from 0.33.0).
        hold = z3.BoolVal(True) if self.release.models(versions.PREFILL_THROTTLE) else z3.Not(self.hold)
        # Block hashes that cover tokens past the block: only with prefix caching, and
        # modelled from 0.33.0 on (spec/config.py validate_spec_decode).
        hashes = z3.And(self.LH >= 0, z3.Implies(self.LH > 0, z3.And(
            self.pc, z3.BoolVal(self.release.models(versions.HASH_LOOKAHEAD)))))
        return z3.And(lora, sd, hold, hashes, z3.Not(z3.And(self.pa, self.pn)),
                      self.TB0 >= 1, self.IB0 >= 1, self.M >= 1, self.L >= 2, self.th >= 0,
                      self.th <= self.L if th_check else True, self.wm >= 0, self.wm <= self.U,
                      self.U >= self.cdiv(self.L), self.IB0 >= self.M,
                      z3.Or(self.chunked, self.IB0 >= self.L))

    @property
    def B(self):
        """Tokens one step may grant in all (spec/properties.py get_step_budget)."""
        return z3_min(self.TB0, self.IB) if self.release.applies(INPUT_BUDGET) else self.TB0

    @property
    def IB(self):
        """The input budget a step starts with: max_num_batched_tokens, or before 0.28.0
        (versions.INPUT_BUDGET) one that starts equal to the token budget and moves
        with it, so it caps nothing more."""
        return self.IB0 if self.release.applies(INPUT_BUDGET) else self.TBs

    @property
    def TBs(self):
        """The token budget the step starts with: max_num_scheduled_tokens, or 0 while
        the engine is PAUSED_ALL (S:735, 739-741)."""
        return z3.If(self.pa, 0, self.TB0)


def threshold_in_force(T, adaptive, IB0, NE, chunked, release: Release):
    """config.long_prefill_threshold (S:770-788) as a term: the configured threshold
    `T`, none (0) with chunked prefill off (from 0.34.0) or while at most one request is
    eligible (from 0.31.0), and with the adaptive flag at least max_num_batched_tokens //
    eligible.  Compared with the spec's on concrete configs by
    tests/test_proofs_agreement_config.py."""
    adapted = z3.If(z3.And(T > 0, adaptive), z3.If(T >= IB0 / NE, T, IB0 / NE), T)
    if release.applies(LONG_PREFILL_THRESHOLD_NEEDS_TWO):
        adapted = z3.If(NE <= 1, 0, adapted)
    if release.applies(LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL):
        adapted = z3.If(chunked, adapted, 0)
    return adapted


def threshold_constraints(c: LoopConfig, T, adaptive):
    """What validate_config allows of a configured threshold and its adaptive flag."""
    th_check = c.release.checks_config("long_prefill_token_threshold_at_most_max_model_len")
    flag = z3.BoolVal(True) if c.release.models(versions.ADAPTIVE_THRESHOLD) else z3.Not(adaptive)
    return z3.And(T >= 0, T <= c.L if th_check else True, flag)


def _fresh_config(prefix: str) -> LoopConfig:
    I, Bo = z3.Int, z3.Bool
    return LoopConfig(I(f"{prefix}.TB0"), I(f"{prefix}.IB0"), I(f"{prefix}.M"), I(f"{prefix}.L"),
                      I(f"{prefix}.th"), I(f"{prefix}.wm"), I(f"{prefix}.U"), I(f"{prefix}.ML"),
                      I(f"{prefix}.K"), I(f"{prefix}.LA"), I(f"{prefix}.D"), I(f"{prefix}.PL"), I(f"{prefix}.LH"),
                      Bo(f"{prefix}.chunked"), Bo(f"{prefix}.full_isl"), Bo(f"{prefix}.prio"), Bo(f"{prefix}.asy"),
                      Bo(f"{prefix}.lora"), Bo(f"{prefix}.sd"), Bo(f"{prefix}.hold"), Bo(f"{prefix}.pa"),
                      Bo(f"{prefix}.pn"), Bo(f"{prefix}.pc"))


def config_values(config: SchedulerConfig, threshold: int, hold: bool = False,
                  pause_state: str = "UNPAUSED") -> dict[str, int | bool]:
    """The values of LoopConfig's symbols (but `bs`) for `config`, with `threshold`
    the long-prefill threshold in force in the step (spec/properties.py
    get_long_prefill_threshold; the configured one where no step is meant) and
    `hold` whether the step holds prefill (spec/prefill_throttle.py holds_prefill), in
    an engine whose `pause_state` is this."""
    c = config
    return dict(TB0=c.token_budget, IB0=c.max_num_batched_tokens, M=c.max_num_active_reqs, L=c.max_model_len,
                th=threshold, wm=c.watermark_blocks, U=c.num_gpu_blocks - 1,
                chunked=c.enable_chunked_prefill, full_isl=c.scheduler_reserve_full_isl,
                prio=c.policy == PRIORITY, asy=c.async_scheduling,
                lora=c.max_loras is not None, ML=c.max_loras or 0,
                sd=c.num_speculative_tokens > 0, K=c.num_speculative_tokens, LA=c.num_lookahead_tokens,
                D=c.max_num_new_slots_for_drafting, PL=c.num_prefill_lookahead_tokens, hold=hold,
                pa=pause_state == "PAUSED_ALL", pn=pause_state == "PAUSED_NEW",
                pc=c.enable_prefix_caching, LH=c.num_hash_lookahead_tokens)


def cache_extent(c: LoopConfig, done, nt):
    """How many of a request's blocks are cached once `done` of its num_tokens `nt`
    are computed: cache_blocks hashes its full blocks up to min(done, nt) (K:642-646)
    that have a hash, and a block has one once LH tokens after it are known
    (E:242-252, P:203-273); none without prefix caching.  A multi-module drafter's
    re-prefilled tail (spec_decode.cacheable_tokens) is 0 here: PL <= 1."""
    return z3.If(c.pc, z3_max0(z3_min(done, nt - c.LH)) / c.bs, 0)


def cached_after(c: LoopConfig, cb, done, nt):
    """num_cached_block after cache_blocks(done): it only grows (T:482-546)."""
    ext = cache_extent(c, done, nt)
    return z3.If(ext > cb, ext, cb)
