"""What follows `schedule()`'s loops, encoded for the loop claims:
`update_after_schedule` (placeholders and tokens in flight, S:1899-1931,
async_scheduler.py:24-56), the delivery of a batch by `update_from_output`
(S:2301-2618: placeholders, stale output, computed tokens and cached blocks) and
its removal of finished requests, a third loop (S:2607-2618, `remove_finished`),
as one iteration from an arbitrary state.

tests/test_proofs_loop_invariants.py compares each with the spec's
`update_after_schedule`, `update_from_output` and `remove_finished` on concrete
states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from .encoding import z3_min
from .loop_config import LoopConfig, cached_after
from .loop_rules import LoopRules


# --- update_after_schedule ------------------------------------------------------------------


def placeholders_after(c: LoopConfig, nc2, nt, ph, granted, rules: LoopRules, ds=0):
    """update_after_schedule (S:1899-1931, async_scheduler.py:24-56): with async
    scheduling a granted request that is not mid-prefill (computed tokens, advanced
    by the grant, reach num_tokens + placeholders) gets one output placeholder, and
    one per draft `ds` it sent the model this step (async_scheduler.py:40-45)."""
    prefill_chunk = nc2 < nt + ph
    add = {"not_prefill": z3.Not(prefill_chunk), "never": z3.BoolVal(False),
           "always": z3.BoolVal(True)}[rules.placeholder_added]
    return ph + z3.If(z3.And(c.asy, granted, add), 1 + (ds if rules.placeholders_per_draft else 0), 0)


def padded_drafts(c: LoopConfig, wx):
    """The drafts an admitted request sends: num_speculative_tokens -1 rows when its
    admission is a padded new decode (S:1358-1380, 1643), else none."""
    return z3.If(z3.And(wx.adm, wx.pd), c.K, 0)


def inflight_after(inf, granted, n, rules: LoopRules):
    """update_after_schedule (S:1899-1931): the grant goes in flight."""
    return inf + (z3.If(granted, n, 0) if rules.inflight_added else 0)


# --- update_from_output: the delivery of a batch -------------------------------------------


def deliver(ph, inf, stl, bt, k, rules: LoopRules):
    """update_from_output for one request of the batch it applies, `bt` tokens
    scheduled, k <= 1 sampled: a stale batch (stale > 0, S:2362-2384) lowers in
    flight and stale and keeps the placeholders; otherwise (deliver_output,
    S:2898-2905) in flight falls by bt and a sampled token replaces a placeholder
    if it has one."""
    stale = stl > 0
    inf2 = inf - bt
    stl2 = z3.If(stale, stl - (bt if rules.stale_decremented else 0), stl)
    ph2 = z3.If(stale, ph, ph - z3.If(z3.And(ph > 0, k > 0), k, 0))
    return ph2, inf2, stl2


def deliver_tokens(c: LoopConfig, nc, nt, lim, cb, d, m, stop_at, inf, bt, ph, rules: LoopRules):
    """deliver_output (S:2392-2471, 2891-2905) to a running request of the batch it
    applies: m >= 1 tokens sampled, d drafts sent with the batch.  The rejected drafts
    roll computed tokens back (S:2417-2426); the tokens after the first that stops it
    are discarded and roll them back too (S:2891-2897): an EOS or stop token at
    position `stop_at` (1-based; m or more for none), or num_tokens reaching
    max_model_len or `lim` (num_prompt_tokens + max_tokens, U:98-140).  Then, with
    placeholders or drafts configured, it caches the full blocks of its computed
    tokens out of flight (S:2450-2471).  Returns (computed, num_tokens, cached)."""
    rejected = z3.If(z3.And(d > 0, nc > 0), d - (m - 1), 0)
    kept = z3_min(m, stop_at, z3_min(c.L, lim) - nt)
    nc2 = nc - rejected - (m - kept)
    nt2 = nt + kept
    done = nc2 - (inf - bt) if rules.delivery_caches_computed else nt2
    cb2 = z3.If(z3.Or(ph > 0, c.K > 0), cached_after(c, cb, done, nt2), cb)
    return nc2, nt2, cb2


# --- update_from_output: the removal of finished requests -----------------------------------


@dataclass(frozen=True)
class FinishState:
    """The finish loop's state: free and held blocks."""

    F: Any
    H: Any


def finish_iteration(c: LoopConfig, s: FinishState, b, fr, H_oth, rules: LoopRules = LoopRules()):
    """One finished request, holding `b` blocks, leaves; those of them nobody else
    holds (`fr`: all without prefix caching) return to the pool (S:3170-3201)."""
    frame = [b >= 0, 0 <= fr, fr <= b, H_oth >= 0, s.H == fr + H_oth]
    freed = fr if rules.finish_frees_blocks else z3.IntVal(0)
    return frame, FinishState(s.F + freed, s.H - fr)


def finish_I(c: LoopConfig, s: FinishState):
    return z3.And(s.F + s.H == c.U, s.F >= 0, s.H >= 0)
