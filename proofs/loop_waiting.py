"""The waiting loop of `schedule()` as one admission attempt from an arbitrary
iteration state (S:1066-1687, spec/scheduler.py `schedule_waiting` / `admit`):
its state, invariants (`wait_I`, `wait_J`) and iteration, for the claims of
loop_claims.py.  As in the running loop (loop_running.py), a claim about every
waiting request is proved for one arbitrary request, the ghost `x`, with the
head of the queue `h` an instance of the same invariant.

`wait_iteration` is the encoding tests/test_proofs_loop_invariants.py compares
with the spec's `num_new_tokens_waiting` and `admit`, one iteration at a time on
concrete states.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import z3

from schedspec.spec import versions

from .encoding import z3_max0, z3_min
from .loop_config import LoopConfig, bool_field, cached_after
from .loop_rules import LoopRules


@dataclass(frozen=True)
class WaitReq:
    """A request of `before.waiting`: nt its num_tokens (it has no computed tokens
    and no blocks: spec/invariants.py waiting_requests_hold_nothing), q its queue
    position; adm: admitted this step, n its grant, b its blocks.  With prefix
    caching its admission starts from a hit: hb cached blocks (whole blocks, capped
    at nt - 1 tokens, K:251-292), he of them held by nobody (in the free queue); 0
    without.  Like ln and pd, they are inputs of the iteration that visits it (an
    earlier admission of the step can cache blocks it then hits)."""

    nt: Any
    q: Any
    n: Any
    b: Any
    hb: Any
    he: Any
    cb: Any  # num_cached_block: 0 before admission, its hit blocks and those its grant computes after
    adm: Any = bool_field()
    st: Any = bool_field()  # async: num_stale_output_tokens > 0 (its output from before a preemption in flight)
    gw: Any = bool_field()  # waits for its grammar: WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, compiling or failed
    ls: Any = bool_field()  # LoRA: skipped this step, its adapter one too many (S:1128-1140)
    ln: Any = bool_field()  # LoRA: its adapter is not in the batch yet (an input of the iteration that visits it)
    # Speculative decoding: admitted now it would be a new decode padded with drafts
    # (spec_decode.pads_new_decode): for the head, wait_iteration's frame defines it;
    # for the ghost it is read by the iteration that visits it.
    pd: Any = bool_field()

    def static_facts(self, c: LoopConfig, W0):
        # No grammar where schedspec does not model structured output (release.py).
        grammar = z3.BoolVal(True) if c.release.models(versions.STRUCTURED_OUTPUT) else z3.Not(self.gw)
        # pads_new_decode's conditions on the request and config (S:1358-1380): one
        # token left to compute after its hit, and the padded rows and a sampled token
        # within max_model_len; the batch's (no prefill chunk scheduled, some running
        # request granted or a hit) are in wait_iteration's frame.
        padded = z3.Implies(self.pd, z3.And(c.sd, self.nt - self.hit(c) == 1, self.hit(c) + c.K + 2 <= c.L))
        hits = z3.And(0 <= self.he, self.he <= self.hb, self.hit(c) < self.nt)
        return z3.And(1 <= self.nt, self.nt < c.L, 0 <= self.q, self.q < W0, z3.Implies(z3.Not(c.asy), z3.Not(self.st)),
                      z3.Implies(z3.Not(c.lora), z3.Not(self.ln)), grammar, padded, hits)

    def hit(self, c: LoopConfig):
        """The tokens its prefix hit computes: num_computed_tokens at admission (S:1149-1166)."""
        return self.hb * c.bs

    def computed(self, c: LoopConfig):
        """num_computed_tokens after the step: the hit and the grant if admitted (S:1899-1931)."""
        return z3.If(self.adm, self.hit(c) + self.n, 0)

    def n_max(self, c: LoopConfig):
        """The most an admission grants: the tokens left after the hit, or 1 + K for a padded new decode."""
        return self.nt - self.hit(c) + z3.If(self.pd, c.K, 0)


@dataclass(frozen=True)
class WaitState:
    """tbE / ibE: the budgets at the loop's entry; Tr: tokens the running loop
    granted; A: admissions so far; K (async): requests skipped for stale output
    in flight (S:1123), for a grammar still compiling (S:1118-1121) or for
    LoRA (S:1128-1140), so the head is before.waiting[A + K]; Lc: the distinct
    adapters of the running requests (S:1054-1063), one more per admission
    that brings a new one (S:1627-1629)."""

    tb: Any
    ib: Any
    T: Any
    Tr: Any
    tbE: Any
    ibE: Any
    Rn: Any
    A: Any
    K: Any
    F: Any
    H: Any
    Lc: Any
    Dc: Any  # the drafter's rows charged to the input budget so far, both loops (RunState.Dc)
    stopped: Any = bool_field()
    PS: Any = bool_field()  # the running loop's prefill_scheduled (RunState.PS); admissions leave it


def wait_guard(c: LoopConfig, s: WaitState, W0, rules: LoopRules = LoopRules()):
    """S:1066-1096: budget, a request waiting, a run slot; no earlier stop."""
    slot = (s.Rn < c.M) if rules.run_slot_check_strict else (s.Rn <= c.M)
    # PAUSED_NEW admits only a head holding KV blocks (S:1100-1107): none without the KV connector
    paused = c.pn if rules.paused_new_admits_none else z3.BoolVal(False)
    return z3.And(z3.Not(s.stopped), s.A + s.K < W0, s.tb > 0, s.ib > 0, slot, z3.Not(paused))


def wait_J(c: LoopConfig, s: WaitState, r: WaitReq):
    return z3.And(
        # visited (before the head) and not skipped for stale output, its grammar or LoRA: admitted
        r.adm == z3.And(r.q < s.A + s.K, z3.Not(r.st), z3.Not(r.gw), z3.Not(r.ls)),
        z3.Implies(r.ls, r.q < s.A + s.K),
        z3.Implies(r.adm, z3.And(1 <= r.n, r.n <= r.n_max(c), r.b == c.cdiv(z3_min(r.hit(c) + r.n + c.LA, c.L)))),
        z3.Implies(z3.Not(r.adm), z3.And(r.n == 0, r.b == 0, r.cb == 0)),
    )


def wait_I(c: LoopConfig, s: WaitState, W0):
    return z3.And(
        s.tb == c.TBs - s.T, s.ib == c.IB - c.D - s.T - s.Dc, s.tb >= 0, s.ib >= -c.D, s.Dc >= 0,
        z3.Implies(c.D == 0, s.Dc == 0), s.T >= s.Tr, s.Tr >= 0,
        s.tb <= s.tbE, s.ib <= s.ibE, z3.Implies(s.A > 0, z3.And(s.tbE > 0, s.ibE > 0)),
        s.Rn >= 0, s.Rn <= c.M, s.F + s.H == c.U, s.F >= 0, s.H >= 0, 0 <= s.A, 0 <= s.K, s.A + s.K <= W0,
        s.Lc >= 0, z3.Implies(c.lora, s.Lc <= c.ML),
    )


def wait_iteration(c: LoopConfig, s: WaitState, W0, x: WaitReq, h: WaitReq, rules: LoopRules = LoopRules()):
    """One admission attempt of the head `h` (S:1345-1523): admitted with its
    chunk, or admission stops (a `break`: the chunked-off rule, the full-ISL gate,
    the pool with the watermark).  Returns (frame, state, ghost, facts)."""
    # The admission starts from the head's prefix hit, c0 computed tokens (S:1149-1166; 0
    # without prefix caching).  pads_new_decode (S:1358-1380): one token left after it, no
    # prefill chunk granted by the running loop, some running request granted (Tr > 0:
    # scheduled_running, which admissions do not join) or a hit, the padded rows within
    # max_model_len.
    c0 = h.hit(c)
    pads = z3.And(c.sd, h.nt - c0 == 1, z3.Not(s.PS) if rules.padding_checks_prefill else True,
                  z3.Or(s.Tr > 0, c0 > 0) if rules.padding_after_hit else s.Tr > 0, c0 + c.K + 2 <= c.L)
    frame = [h.q == s.A + s.K, h.static_facts(c, W0), wait_J(c, s, h), h.pd == pads,
             z3.Implies(x.q == h.q, z3.And(x.nt == h.nt, x.adm == h.adm, x.n == h.n, x.b == h.b, x.st == h.st,
                                           x.gw == h.gw, x.ls == h.ls, x.pd == h.pd, x.hb == h.hb, x.he == h.he,
                                           x.cb == h.cb))]
    guard = wait_guard(c, s, W0, rules)
    # Async (S:1123): a head whose output from before its preemption is still in
    # flight is skipped and keeps its place; it takes no budget and no run slot.
    stale = h.st if rules.stale_head != "admit" else z3.BoolVal(False)
    # Structured output (S:1118-1121): a head whose grammar is compiling, or failed,
    # is skipped the same way (a compiled one was promoted to WAITING: gw false).
    grammar = h.gw if rules.grammar_skip else z3.BoolVal(False)
    skip_grammar = z3.And(guard, grammar)
    # LoRA (S:1128-1140): a head whose adapter is new to a batch that has max_loras
    # adapters already is skipped the same way.
    lora = z3.And(c.lora, h.ln, s.Lc == c.ML + rules.lora_cap_extra)
    skip_lora = z3.And(guard, lora)
    blocked = z3.Or(stale, grammar, lora)
    skip = z3.Or(z3.And(guard, stale) if rules.stale_head == "skip" else z3.BoolVal(False), skip_grammar, skip_lora)
    stale_stop = z3.And(guard, stale, z3.Not(grammar), z3.Not(lora)) if rules.stale_head == "stop" else z3.BoolVal(False)
    budget = z3_min(s.tb, s.ib)  # S:1345
    # S:1356 (the tokens left after the hit); a padded new decode asks 1 + K and stops admission
    # rather than be cut by the budget (S:1358-1380); then the threshold (S:1382).
    ask = z3.If(h.pd, 1 + c.K, h.nt - c0)
    pad_stop = z3.And(h.pd, ask > budget) if rules.padded_budget_checked else z3.BoolVal(False)
    n0 = z3.If(z3.And(0 < c.th, c.th < ask), c.th, ask)
    no_fit = z3.Or(pad_stop, z3.And(z3.Not(c.chunked),
                                    (n0 >= budget) if rules.chunked_off_fit_strict else (n0 > budget)))  # S:1387-1394
    n = z3_min(n0, budget + rules.admission_budget_extra)  # S:1396
    # allocate_slots for an admission (K:539-609): the watermark unless nothing runs, the gate;
    # the hit blocks are held already (K:552-587), those nobody holds count against the pool.
    wm = c.wm if rules.watermark_on_first_admission else z3.If(s.Rn > 0, c.wm, 0)
    he = h.he if rules.evictable_hits_checked else z3.IntVal(0)
    full = z3_max0(c.cdiv(z3_min(h.nt, c.L)) - h.hb - h.b)
    gate_fail = z3.And(c.full_isl, (full + he if rules.gate_without_watermark else full + he + wm) > s.F)
    need = z3_max0(c.cdiv(z3_min(c0 + n + c.LA, c.L)) - h.hb - h.b)  # the lookahead too (K:571-574)
    # A step that holds prefill stops at a request with more than its last token to
    # compute (S:1340), a padded new decode never (it has one token left).
    held_stop = z3.And(c.hold, h.nt - c0 > 1) if rules.held_admission_stops else z3.BoolVal(False)
    admit = z3.And(guard, z3.Not(blocked), z3.Not(held_stop), z3.Not(no_fit), z3.Not(gate_fail),
                   need + he + wm <= s.F)
    stop = z3.Or(stale_stop, z3.And(guard, z3.Not(blocked), z3.Not(admit)))
    rows = c.D if rules.drafter_rows_charged else z3.IntVal(0)  # S:1019
    s2 = WaitState(s.tb - z3.If(admit, n, 0), s.ib - z3.If(admit, n + rows, 0), s.T + z3.If(admit, n, 0), s.Tr,
                   s.tbE, s.ibE, s.Rn + z3.If(admit, 1, 0), s.A + z3.If(admit, 1, 0), s.K + z3.If(skip, 1, 0),
                   s.F - z3.If(admit, need + h.he, 0), s.H + z3.If(admit, need + h.he, 0),
                   s.Lc + z3.If(z3.And(admit, h.ln), 1, 0), s.Dc + z3.If(admit, c.D, 0), z3.Or(s.stopped, stop),
                   s.PS)
    xa = z3.And(admit, x.q == h.q)
    # the hit blocks are cached already (T:273-329), then the grant caches the full blocks it
    # computes (K:642-646)
    done = c0 + n if rules.grant_caches_computed else h.nt
    x2 = replace(x, adm=z3.Or(x.adm, xa), n=z3.If(xa, n, x.n), b=z3.If(xa, x.b + h.hb + need, x.b),
                 ls=z3.Or(x.ls, z3.And(skip_lora, x.q == h.q)),
                 cb=z3.If(xa, cached_after(c, h.hb, done, h.nt), x.cb))
    return frame, s2, x2, {"guard": guard, "admit": admit, "n": n, "need": need, "head_admitted_before": h.adm,
                           "skip_stale": z3.And(skip, z3.Not(skip_grammar), z3.Not(skip_lora)),
                           "skip_grammar": skip_grammar, "skip_lora": skip_lora, "padded": z3.And(admit, h.pd),
                           "held_stop": z3.And(guard, z3.Not(blocked), held_stop)}
