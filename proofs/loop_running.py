"""The running loop of `schedule()` as one iteration from an arbitrary iteration
state (S:809-1052, spec/scheduler.py `schedule_running` with
`allocate_or_preempt`): its state, invariants (`run_I`, `run_J`), entry and
iteration, for the claims of loop_claims.py.

**Iteration state.**  Aggregates of the whole list (never one variable per
request): budgets left (`tb`, `ib`, S:735/738; `ib` is the input budget a grant
may still take, the spec's `input_budget` less a drafter's rows `D`, which is
what both loops test and cap by, S:813, 862-864, 1345), tokens granted (`T`), the
drafter's rows charged for them (`Dc`, `D` per grant, S:737, 1019),
preemptions so far (`P`), `len(running)` (`Rn`), the cursor (`cur`), free and
held blocks (`F`, `H`), the FCFS break flag (`stopped`), blocks allocated
(`AL`) and the block demand of the requests visited / not yet visited (`DV`,
`Drest`), the capped needs of the granted requests (`CG`), and, relative to
the ghost request below, the capped needs of the ungranted and of the
preempted requests ahead of it (`UA`, `PA`).

**Requests: one ghost and two instances.**  A claim about every request is
proved for one arbitrary request `x` (the ghost): since nothing constrains
which one, it holds for all.  The per-request invariant `J` is assumed for
`x`, for the request at the cursor (`c`) and for the victim (`v`), which are
instances of the same universally quantified fact, and proved for `x` after
the iteration.  Two of them are the same request exactly when both are running
at the same position; then their fields are equal.

**Sums.**  Where an iteration takes one request's share out of a sum (a
refund out of `T`, a victim's blocks out of `H`, the current request's demand
out of `Drest`), the sum is split as `share + rest` with `rest >= 0`: true of
any list whose elements are non-negative, so sound for every N.

**The victim** (S:948-986): FCFS the tail of `running`, PRIORITY the largest
(priority, arrival_time), first in running order.  Within one step this order
of the requests of `before.running` never changes, so it is a fixed ranking
`rank` (0 = the first victim): FCFS `rank = R0 - 1 - position`, PRIORITY by
(priority, arrival_time) descending, then position.  The invariant says a
request is preempted iff its rank is below `P`; so the next victim, the live
request of least rank, is the one of rank `P`, which the iteration assumes of
`v` (the agreement test checks on concrete runs that the spec's own
`choose_victim` returns exactly it).


`run_iteration` is the encoding tests/test_proofs_loop_invariants.py compares
with the spec's own rule functions (`num_new_tokens_running`,
`blocks_to_allocate`, `choose_victim`, `preempt`, `allocate`, `grant`), one
iteration at a time on concrete states.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import z3

from schedspec.spec.versions import PRIORITY_SELF_PREEMPTION_CONTINUES

from .encoding import z3_max0, z3_min
from .loop_config import LoopConfig, bool_field, cached_after
from .loop_rules import LoopRules


@dataclass(frozen=True)
class RunReq:
    """A request of `before.running`: what the step read of it (nc, nt, b0 = its
    computed tokens, num_tokens and blocks before the step; pos0 its position;
    rank its victim rank; d its drafts), and where the running loop has got it
    (in: still in running; pos; g: granted; n: the grant; b: blocks held; seq:
    its preemption index, -1 if none; ds: drafts sent to the model, 0 for none;
    pf: is_prefill_chunk before the step, which a step holding prefill skips;
    free, as the last update left it)."""

    nc: Any
    nt: Any
    b0: Any
    pos0: Any
    rank: Any
    pos: Any
    n: Any
    b: Any
    seq: Any
    ph: Any  # num_output_placeholders before the step (async; 0 in the synchronous engine)
    lim: Any  # num_prompt_tokens + max_tokens: the length at which max_tokens stops it
    d: Any  # len(spec_token_ids): its drafts (speculative decoding; 0 without)
    ds: Any  # len(scheduled_spec_decode_tokens[it]) so far this step (0: no entry)
    cb: Any  # num_cached_block: its blocks that are cached (prefix caching; 0 without)
    inr: Any = bool_field()
    g: Any = bool_field()
    pf: Any = bool_field()

    def held(self, c: LoopConfig):
        """S:838: a step that holds prefill skips this request (0 tokens)."""
        return z3.And(c.hold, self.pf)

    def thcap(self, c: LoopConfig, n):
        return z3.If(z3.And(0 < c.th, c.th < n), c.th, n)

    def lif(self):
        """spec/request.py last_token_in_flight (S:816-830): the last token max_tokens
        allows is already in a batch in flight."""
        return z3.And(self.ph > 0, self.nc + 2 - self.ph >= self.lim)

    def need(self):
        """get_need (spec/properties.py): drafts and placeholders count as tokens to
        compute (S:855); 0 under the async max_tokens guard."""
        return z3.If(self.lif(), 0, self.nt + self.d + self.ph - self.nc)

    def cap(self, c: LoopConfig):
        """get_capped_need (spec/properties.py): the need after the threshold and
        model-length caps (S:855-872), no budget cap."""
        return z3_max0(z3_min(self.thcap(c, self.need()), c.L - self.nc - 1))

    def dem(self, c: LoopConfig):
        """get_block_demand(before, rid, capped need): new blocks for the whole capped
        need and the drafter's lookahead (K:571-574)."""
        return z3_max0(c.cdiv(z3_min(self.nc + self.cap(c) + c.LA, c.L)) - self.b0)

    def b_after(self, c: LoopConfig, n):
        """Blocks held after a grant of n: those of computed + n tokens; with
        speculative decoding those of the lookahead too, and never fewer than it
        held (the slots of rejected drafts stay, S:2417-2426)."""
        return z3.If(c.sd, z3.If(self.b0 > c.cdiv(z3_min(self.nc + n + c.LA, c.L)), self.b0,
                                 c.cdiv(z3_min(self.nc + n + c.LA, c.L))),
                     c.cdiv(z3_min(self.nc + n, c.L)))

    def drafts_sent(self, n):
        """spec_decode.schedule_drafts (S:1025-1041): the drafts past the tokens it
        has that fit in grant n."""
        return z3.If(self.d > 0, z3_max0(n + self.nc - self.nt - self.ph), 0)

    def static_facts(self, c: LoopConfig, R0):
        """The state invariant's facts about a running request (spec/invariants.py:
        computed_tokens_below_num_tokens, request_lengths_valid, blocks_match_computed_tokens)."""
        fcfs_rank = self.rank == R0 - 1 - self.pos0
        # Async: computed < num_tokens + placeholders (the state invariant
        # computed_tokens_below_num_tokens), and computed < max_model_len, which every
        # grant keeps (cap 3, S:868) and loop:computed_tokens_bounded proves kept; the
        # synchronous engine has no placeholders.
        counts = z3.If(c.asy, z3.And(self.ph >= 0, self.nc < self.nt + self.ph, self.nc < c.L),
                       z3.And(self.ph == 0, self.nc < self.nt))
        # blocks_match_computed_tokens: with speculative decoding up to the slots of
        # num_speculative_tokens drafts and the lookahead (properties.get_block_span).
        blocks = z3.If(c.sd, z3.And(self.d >= 0, c.cdiv(self.nc) <= self.b0,
                                    self.b0 <= c.cdiv(z3_min(self.nc + c.K + c.LA, c.L))),
                       z3.And(self.d == 0, self.b0 == c.cdiv(self.nc)))
        # Its cached blocks (now: cb, like b, changes within the step) are blocks it
        # holds, of tokens it knows (what loop:prefix_hit_within_shared_prefix proves
        # grants and deliveries keep).
        cached = z3.And(0 <= self.cb, self.cb <= self.b, self.cb * c.bs <= self.nt,
                        z3.Implies(z3.Not(c.pc), self.cb == 0))
        return z3.And(0 <= self.nc, counts, 1 <= self.nt, self.nt < c.L, self.nt < self.lim, blocks, cached,
                      0 <= self.pos0, self.pos0 < R0, 0 <= self.rank, self.rank < R0,
                      z3.Or(c.prio, fcfs_rank))


@dataclass(frozen=True)
class RunState:
    """The running loop's iteration state (module docstring)."""

    tb: Any
    ib: Any
    T: Any
    P: Any
    Rn: Any
    cur: Any
    F: Any
    H: Any
    AL: Any
    DV: Any
    Drest: Any
    CG: Any
    UA: Any
    PA: Any
    pend: Any  # the grant being allocated for the request at the cursor after a failure, else -1
    Dc: Any  # the drafter's rows charged to the input budget: D per grant
    stopped: Any = bool_field()
    # prefill_scheduled: a grant went to a prefill chunk (S:1016; a refund keeps it), which
    # rules out padding a new decode (spec_decode.pads_new_decode)
    PS: Any = bool_field()


@dataclass(frozen=True)
class RunConsts:
    """The values of the step's start the invariant refers to: R0 = len(running),
    F0 / H0 free and held blocks, D0 the running requests' whole block demand
    (the premise of preemption_only_on_allocation_failure), CAx the capped needs
    of the requests ahead of the ghost x."""

    R0: Any
    F0: Any
    H0: Any
    D0: Any
    CAx: Any


@dataclass(frozen=True)
class RunSplit:
    """Fresh non-negative rests of the sums an iteration takes one share out of."""

    T_oth: Any  # T of the granted requests other than the victim
    T_slack: Any  # (CG - T) of the granted requests other than the victim
    H_oth: Any  # blocks in use but the victim's freed ones
    D_oth: Any
    UA_oth: Any
    Dc_oth: Any  # Dc of the granted requests other than the victim
    # the victim's blocks nobody else holds, which its preemption frees: all of them
    # without prefix caching; with it, a block shared through a hit stays (T:298-310)
    Fv: Any


def same_request(a: RunReq, b: RunReq):
    return z3.And(a.inr, b.inr, a.pos == b.pos)


def _equal(a: RunReq, b: RunReq):
    return z3.And([getattr(a, f.name) == getattr(b, f.name) for f in fields(RunReq)])


def moves_on(c: LoopConfig):
    """Does the running loop go on after a self-preemption?  Under PRIORITY from
    0.33.0 (S:998-1008, versions.PRIORITY_SELF_PREEMPTION_CONTINUES); never before."""
    return c.prio if c.release.applies(PRIORITY_SELF_PREEMPTION_CONTINUES) else z3.BoolVal(False)


def run_guard(s: RunState):
    """S:811-813: a request left under the cursor, budget left; and no FCFS break."""
    return z3.And(z3.Not(s.stopped), s.cur < s.Rn, s.tb > 0, s.ib > 0)


def run_J(c: LoopConfig, k: RunConsts, s: RunState, r: RunReq):
    """The per-request invariant of the running loop, for a request of before.running."""
    cap = r.cap(c)
    return z3.And(
        z3.Implies(r.inr, z3.And(0 <= r.pos, r.pos < s.Rn, r.rank >= s.P, r.seq == -1,
                                 z3.Or(c.prio, r.pos == r.pos0))),  # FCFS removes only the tail
        z3.Implies(z3.Not(r.inr), z3.And(r.rank < s.P, r.seq == r.rank, z3.Not(r.g), r.b == 0, r.n == 0)),
        z3.Implies(r.g, z3.And(r.inr, r.pos < s.cur, 1 <= r.n, r.n <= cap, r.b == r.b_after(c, r.n))),
        z3.Implies(z3.And(r.inr, z3.Not(r.g)), z3.And(r.b == r.b0, r.n == 0)),
        # visited and not granted: skipped, its capped need was 0 (S:907-925) or the
        # step holds prefill and it is a prefill chunk (S:838)
        z3.Implies(z3.And(r.inr, r.pos < s.cur, z3.Not(r.g)), z3.Or(cap == 0, r.held(c))),
        # a grant short of the capped need used the last of a budget (no refund since: P == 0)
        # (with a drafter's rows ib is then -D, S:1019)
        z3.Implies(z3.And(r.g, r.n < cap), z3.Or(s.P > 0, s.tb <= 0, s.ib <= 0)),
        # the grant pending for the request at the cursor is within its capped need
        z3.Implies(z3.And(s.pend >= 1, r.inr, r.pos == s.cur), s.pend <= cap),
    )


def run_I(c: LoopConfig, k: RunConsts, s: RunState, x: RunReq):
    """The global invariant of the running loop, with the ghost-relative sums of x."""
    return z3.And(
        s.tb == c.TBs - s.T, s.ib == c.IB - c.D - s.T - s.Dc, s.tb >= 0, s.ib >= -c.D, s.T >= 0, s.Dc >= 0,
        z3.Implies(c.D == 0, s.Dc == 0),
        s.P >= 0, s.Rn == k.R0 - s.P, 0 <= s.cur, s.cur <= s.Rn,
        s.F + s.H == k.F0 + k.H0, s.F >= 0, s.H >= 0,
        z3.Implies(s.P == 0, z3.And(s.F == k.F0 - s.AL, s.AL <= s.DV, s.DV + s.Drest == k.D0, s.Drest >= 0)),
        z3.Implies(s.P > 0, k.D0 > k.F0),
        # Stopped after a self-preemption: under FCFS the victim was the tail, so no
        # request is left behind the cursor; under PRIORITY (before 0.33.0) there may be.
        z3.Implies(s.stopped, z3.And(s.P > 0, z3.Not(moves_on(c)), z3.Or(c.prio, s.cur >= s.Rn))),
        s.T <= s.CG,
        z3.Or(s.pend == -1, z3.And(s.pend >= 1, s.P >= 1, s.cur < s.Rn, s.pend <= s.tb, s.pend <= s.ib)),
        z3.Implies(z3.And(x.inr, x.pos >= s.cur),
                   z3.And(s.CG + s.UA + s.PA == k.CAx, s.UA >= 0, s.PA >= 0)),
        # x's grant (or the grant pending for it) is at least what the budget left
        # after the capped needs ahead of it: min(cap, budget - CAx); stated without a
        # drafter's rows (the claims that use it have speculative decoding off)
        z3.Implies(z3.And(c.D == 0, x.g), x.n >= z3_min(x.cap(c), c.TBs - k.CAx, c.IB - k.CAx)),
        z3.Implies(z3.And(c.D == 0, s.pend >= 1, x.inr, x.pos == s.cur),
                   s.pend >= z3_min(x.cap(c), c.TBs - k.CAx, c.IB - k.CAx)),
    )


def run_entry(c: LoopConfig, k: RunConsts, x: RunReq, rules: LoopRules = LoopRules()):
    """(premises, the state and ghost at S:809) from a before-state satisfying the state invariant."""
    tb0 = c.TBs if rules.paused_all_budget_zero else c.TB0
    s = RunState(tb0, c.IB - c.D, z3.IntVal(0), z3.IntVal(0), k.R0, z3.IntVal(0), k.F0, k.H0, z3.IntVal(0),
                 z3.IntVal(0), k.D0, z3.IntVal(0), k.CAx, z3.IntVal(0), z3.IntVal(-1), z3.IntVal(0),
                 z3.BoolVal(False), z3.BoolVal(False))
    x0 = replace(x, inr=z3.BoolVal(True), pos=x.pos0, g=z3.BoolVal(False), n=z3.IntVal(0), b=x.b0,
                 seq=z3.IntVal(-1), ds=z3.IntVal(0))
    premises = [c.constraints(), x.static_facts(c, k.R0), k.R0 >= 1, k.R0 <= c.M, k.F0 >= 0, k.H0 >= 0,
                k.F0 + k.H0 == c.U, k.D0 >= 0, k.CAx >= 0]
    return premises, s, x0


def run_iteration(c: LoopConfig, k: RunConsts, s: RunState, x: RunReq, cr: RunReq, v: RunReq, sp: RunSplit,
                  rules: LoopRules = LoopRules()):
    """One round of the running loop from `s`: the request at the cursor `cr` is
    skipped, granted, or its allocation fails and victim `v` is preempted
    (S:855-1008).  Returns (frame assumptions, new state, new ghost x, facts about
    the round for the claims)."""
    frame = _iteration_frame(c, k, s, x, cr, v, sp, rules)
    x_unvisited = z3.And(x.inr, x.pos >= s.cur)
    ahead_c = z3.And(x_unvisited, z3.Not(same_request(x, cr)))  # cr is at the cursor, x behind it
    ahead_v = z3.And(x_unvisited, z3.Not(same_request(x, v)), v.pos < x.pos)

    guard = run_guard(s)
    n, lif = _running_grant(c, s, cr, rules)
    skip = (n == 0) if rules.skip_zero_grant else z3.BoolVal(False)
    # allocate_slots for a running request (K:571-609): no watermark, no gate; the
    # drafter's lookahead slots too (K:571-574).
    need = z3_max0(c.cdiv(z3_min(z3_min(cr.nc, c.L) + n + c.LA, c.L)) - cr.b)
    fits = (need < s.F) if rules.fail_when_exact_fit else (need <= s.F)
    # the bad variant: the guard ends the loop (a `break`) instead of skipping the request
    guard_stop = z3.And(guard, lif, s.pend < 1) if rules.last_token_guard_stops else z3.BoolVal(False)
    skipping = z3.And(guard, skip, z3.Not(guard_stop))
    success = z3.And(guard, z3.Not(skip), fits)
    fail = z3.And(guard, z3.Not(skip), z3.Not(fits))
    self_pre = z3.And(fail, same_request(cr, v))
    # UA (ahead of x, alive, ungranted) gives up the share the round moves out of it.
    frame += [z3.Implies(z3.And(success, ahead_c), s.UA == cr.cap(c) + sp.UA_oth),
              z3.Implies(z3.And(fail, ahead_v, z3.Not(v.g)), s.UA == v.cap(c) + sp.UA_oth)]
    round_ = _Round(n, need, guard, skipping, success, fail, self_pre, guard_stop, ahead_c, ahead_v)
    s2 = _state_after(c, s, cr, v, sp, round_, rules)
    x2 = _ghost_after(c, s, x, cr, v, round_, rules)
    facts = {"guard": guard, "n": n, "need": need, "skip": skipping, "success": success, "fail": fail,
             "self_preempt": self_pre, "cr_granted_before": cr.g, "guarded": lif,
             "held": z3.And(skipping, cr.held(c), z3.Not(lif))}
    return frame, s2, x2, facts


def _iteration_frame(c: LoopConfig, k: RunConsts, s: RunState, x: RunReq, cr: RunReq, v: RunReq, sp: RunSplit,
                     rules: LoopRules) -> list:
    """What a round assumes of `cr`, `v` and the ghost `x`: the victim's rank, the
    invariants of both instances, equal fields for the same request, and the splits
    of the sums it takes a share out of."""
    # choose_victim (S:948-986): the live request of least rank, which run_J makes rank P.
    victim = z3.If(c.prio, v.rank == s.P, v.pos == 0) if rules.fcfs_victim_head else (v.rank == s.P)
    frame = [cr.inr, cr.pos == s.cur, v.inr, victim,
             cr.static_facts(c, k.R0), v.static_facts(c, k.R0),
             run_J(c, k, s, cr), run_J(c, k, s, v)]
    for a, b in ((x, cr), (x, v), (cr, v)):
        frame.append(z3.Implies(same_request(a, b), _equal(a, b)))
        # one request per rank and per position (rank is a bijection onto [0, R0))
        frame.append(z3.Implies(z3.And(a.inr, b.inr, a.rank == b.rank), same_request(a, b)))
        frame.append(z3.Implies(z3.And(a.inr, b.inr, a.pos0 == b.pos0), same_request(a, b)))
    frame += [sp.T_oth >= 0, sp.T_slack >= 0, sp.H_oth >= 0, sp.D_oth >= 0, sp.UA_oth >= 0, sp.Dc_oth >= 0,
              z3.Implies(v.g, z3.And(s.T == v.n + sp.T_oth, s.CG - s.T == (v.cap(c) - v.n) + sp.T_slack,
                                     s.Dc == c.D + sp.Dc_oth)),
              0 <= sp.Fv, sp.Fv <= v.b, s.H == sp.Fv + sp.H_oth,
              # Drest means something only before the first preemption (run_I)
              z3.Implies(s.P == 0, s.Drest == cr.dem(c) + sp.D_oth)]
    return frame


def _running_grant(c: LoopConfig, s: RunState, cr: RunReq, rules: LoopRules):
    """(n, the async guard): num_new_tokens_running (S:855-872) for the request at
    the cursor: the need, threshold, both budgets, model length.  Async:
    placeholders count as tokens to compute (S:855); a request whose last allowed
    token is in flight gets 0 before any cap (S:816-830), so it is skipped."""
    ph = cr.ph if rules.placeholders_in_need else z3.IntVal(0)
    need_tokens = cr.nt + rules.drafts_in_need * cr.d + ph - cr.nc + rules.running_need_extra
    budgets = [s.tb] if rules.grant_ignores_input_budget else [s.tb, s.ib]
    n = z3_min(cr.thcap(c, need_tokens), *budgets, c.L - cr.nc - rules.model_len_margin)
    if rules.running_cap is not None:
        n = z3_min(n, z3.IntVal(rules.running_cap))
    lif = cr.lif() if rules.last_token_guard else z3.BoolVal(False)
    guarded = z3.Or(lif, cr.held(c)) if rules.held_chunk_skipped else lif
    n = z3.If(guarded, 0, n)
    # allocate_or_preempt retries with the same n after preempting another request
    # (S:928-996): n is computed once per request, not once per round.
    if rules.n_once_per_request:
        n = z3.If(s.pend >= 1, s.pend, n)
    return n, lif


@dataclass(frozen=True)
class _Round:
    """What one round decided: the grant `n` and its new blocks `need`, and which
    way it went (skipped, granted, allocation failed, the cursor's own preemption)."""

    n: Any
    need: Any
    guard: Any
    skipping: Any
    success: Any
    fail: Any
    self_pre: Any
    guard_stop: Any
    ahead_c: Any  # x is behind the cursor, not the request at it
    ahead_v: Any  # x is behind the cursor and behind the victim, not the victim


def _state_after(c: LoopConfig, s: RunState, cr: RunReq, v: RunReq, sp: RunSplit, r: _Round,
                 rules: LoopRules) -> RunState:
    """The iteration state after the round."""
    n, need, success, fail = r.n, r.need, r.success, r.fail
    refund = z3.And(fail, v.g) if rules.refund else z3.BoolVal(False)
    tb = s.tb - z3.If(success, n, 0) + z3.If(refund, v.n, 0)
    # a grant takes its drafter's rows from the input budget too, a refund gives them back (S:971, 1019)
    rows = c.D if rules.drafter_rows_charged else z3.IntVal(0)
    ib = s.ib - z3.If(success, n + rows, 0) + z3.If(refund, v.n + rows, 0)
    T = s.T + z3.If(success, n, 0) - z3.If(z3.And(fail, v.g), v.n, 0)
    Dc = s.Dc + z3.If(success, c.D, 0) - z3.If(z3.And(fail, v.g), c.D, 0)
    freed = sp.Fv if rules.preempt_frees_blocks else z3.IntVal(0)
    F = s.F - z3.If(success, need, 0) + z3.If(fail, freed, 0)
    H = s.H + z3.If(success, need, 0) - z3.If(fail, sp.Fv, 0)
    P = s.P + z3.If(fail, 1, 0)
    Rn = s.Rn - z3.If(fail, 1, 0)
    back = z3.And(fail, v.pos < s.cur) if rules.cursor_fix else z3.BoolVal(False)
    cur = s.cur + z3.If(z3.Or(r.skipping, success), 1, 0) - z3.If(back, 1, 0)
    stop_now = z3.And(r.self_pre, z3.Not(moves_on(c))) if rules.fcfs_break else z3.BoolVal(False)
    stopped = z3.Or(s.stopped, stop_now, r.guard_stop)
    AL = s.AL + z3.If(success, need, 0)
    moved_on = z3.Or(r.skipping, success)
    DV = s.DV + z3.If(moved_on, cr.dem(c), 0)
    Drest = s.Drest - z3.If(moved_on, cr.dem(c), 0)
    CG = s.CG + z3.If(success, cr.cap(c), 0) - z3.If(z3.And(fail, v.g), v.cap(c), 0)
    UA = s.UA - z3.If(z3.And(success, r.ahead_c), cr.cap(c), 0) \
        - z3.If(z3.And(fail, r.ahead_v, z3.Not(v.g)), v.cap(c), 0)
    PA = s.PA + z3.If(z3.And(fail, r.ahead_v), v.cap(c), 0)
    pend = z3.If(r.guard, z3.If(z3.And(fail, z3.Not(r.self_pre)), n, -1), s.pend)
    noted = z3.And(success, cr.pf) if rules.prefill_scheduled_noted else z3.BoolVal(False)
    return RunState(tb, ib, T, P, Rn, cur, F, H, AL, DV, Drest, CG, UA, PA, pend, Dc, stopped, z3.Or(s.PS, noted))


def _ghost_after(c: LoopConfig, s: RunState, x: RunReq, cr: RunReq, v: RunReq, r: _Round,
                 rules: LoopRules) -> RunReq:
    """The ghost `x` after the round: granted if it is at the cursor, preempted if
    it is the victim, one place forward if the victim was ahead of it."""
    n, fail = r.n, r.fail
    x_is_c, x_is_v = same_request(x, cr), same_request(x, v)
    done = x.nc + n if rules.grant_caches_computed else x.nt  # the tokens its caching reaches
    shift = z3.And(fail, x.inr, z3.Not(x_is_v), v.pos < x.pos)
    gone = z3.And(fail, x_is_v)
    x_grant = z3.And(r.success, x_is_c)
    return replace(x, inr=z3.And(x.inr, z3.Not(gone)),
                   pos=x.pos - z3.If(shift, 1, 0),
                   g=z3.Or(x_grant, z3.And(x.g, z3.Not(gone))),
                   n=z3.If(gone, 0, z3.If(x_grant, n, x.n)),
                   b=z3.If(gone, 0, z3.If(x_grant, x.b + r.need, x.b)),
                   seq=z3.If(gone, s.P, x.seq),
                   ds=z3.If(gone, 0 if rules.victim_drafts_dropped else x.ds,
                            z3.If(x_grant, x.drafts_sent(n), x.ds)),
                   # a grant caches the full blocks it computes (K:642-646); a preemption frees
                   # them all and forgets the count (T:596-604)
                   cb=z3.If(gone, 0, z3.If(x_grant, cached_after(c, x.cb, done, x.nt), x.cb)))
