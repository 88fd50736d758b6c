"""The parts of the loop claims (loop_claims.py): each part builds, from the
fresh symbols of one claim and block size (`LoopVars`) and a rule variant,
(premises, goal), and is proved when premises ∧ ¬goal is unsat.

The parts are the invariants' entry and preservation for each loop (running,
waiting, finish; the drafts sent), the exits that turn an invariant at a loop's
end into a property, one-iteration facts, and lemmas that carry a premise from
one step to the next.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable

import z3

from .encoding import z3_min
from .loop_config import LoopConfig, fresh_record, threshold_constraints, threshold_in_force
from .loop_rules import LoopRules
from .loop_running import RunConsts, RunReq, RunSplit, RunState, run_entry, run_guard, run_I, run_iteration, \
    run_J, same_request
from .loop_update import FinishState, deliver, deliver_tokens, finish_I, finish_iteration, inflight_after, \
    padded_drafts, placeholders_after
from .loop_waiting import WaitReq, WaitState, wait_guard, wait_I, wait_iteration, wait_J
from .release import Release


class LoopVars:
    """Fresh symbols for one claim and one block size."""

    def __init__(self, bs: int, rules: LoopRules, release: Release):
        # c_real: the config; c: what the loops start from (the budget_off_by_one
        # variant's step starts with one token more than max_num_scheduled_tokens)
        self.c_real = LoopConfig.fresh("L.c", bs, release)
        self.c = replace(self.c_real, TB0=self.c_real.TB0 + rules.token_budget_extra) \
            if rules.token_budget_extra else self.c_real
        self.k = RunConsts(*(z3.Int(f"L.k.{f.name}") for f in fields(RunConsts)))
        self.s = fresh_record(RunState, "L.s")
        self.x = fresh_record(RunReq, "L.x")
        self.cr = fresh_record(RunReq, "L.cr")
        self.v = fresh_record(RunReq, "L.v")
        self.sp = fresh_record(RunSplit, "L.sp")
        self.ws = fresh_record(WaitState, "L.ws")
        self.wx = fresh_record(WaitReq, "L.wx")
        self.wh = fresh_record(WaitReq, "L.wh")
        self.W0 = z3.Int("L.W0")
        self.fs = fresh_record(FinishState, "L.fs")
        self.fb, self.fH, self.ff = z3.Int("L.fb"), z3.Int("L.fH"), z3.Int("L.ff")
        self.dk = z3.Int("L.dk")  # tokens one batch delivers to a request
        self.Lc0 = z3.Int("L.Lc0")  # LoRA: the distinct adapters of before.running
        # async counters of the ghost (x or wx) before the step, and the tokens the
        # batch update_from_output applies scheduled for it
        self.inf, self.stl, self.bt = z3.Int("L.inf"), z3.Int("L.stl"), z3.Int("L.bt")
        # the configured long-prefill threshold and its adaptive flag; the eligible
        # requests (running + waiting) of this step and the next, the next step's
        # threshold in force, the requests ahead of x and the sum of their capped needs
        # then (running_never_starved)
        self.T, self.adaptive = z3.Int("L.T"), z3.Bool("L.adaptive")
        self.NE, self.NE2, self.th2 = z3.Int("L.NE"), z3.Int("L.NE2"), z3.Int("L.th2")
        self.kA, self.SA2 = z3.Int("L.kA"), z3.Int("L.SA2")


# One "part" = (name, builder(vars, rules) -> (premises, goal)).  A claim is
# proved when every part's premises ∧ ¬goal is unsat, for every block size.
Part = tuple[str, Callable[["LoopVars", LoopRules], tuple[list, Any]]]


# --- the loops' invariants: entry and preservation -------------------------------------------


def run_pre(V: LoopVars):
    """The running loop's premises at any iteration: the config, the state
    invariant's facts of the ghost, the step's start, and the invariants."""
    c, k, s, x = V.c, V.k, V.s, V.x
    return [c.constraints(), x.static_facts(c, k.R0), k.R0 >= 1, k.R0 <= c.M, k.F0 >= 0, k.H0 >= 0,
            k.F0 + k.H0 == c.U, k.D0 >= 0, k.CAx >= 0, run_I(c, k, s, x), run_J(c, k, s, x)]


def part_run_entry(V: LoopVars, R: LoopRules):
    premises, s0, x0 = run_entry(V.c, V.k, V.x, R)
    return premises, z3.And(run_I(V.c, V.k, s0, x0), run_J(V.c, V.k, s0, x0))


def part_run_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return run_pre(V) + frame + [run_guard(V.s)], z3.And(run_I(V.c, V.k, s2, x2), run_J(V.c, V.k, s2, x2))


def wait_pre(V: LoopVars):
    """The waiting loop's premises at any iteration: the config, the ghost's
    facts and the invariants."""
    c = V.c
    return [c.constraints(), V.W0 >= 1, V.wx.static_facts(c, V.W0), wait_I(c, V.ws, V.W0), wait_J(c, V.ws, V.wx)]


def part_wait_entry(V: LoopVars, R: LoopRules):
    """From the running loop's exit with no preemption (S:1066) to the waiting
    loop's invariant; the bad variant admits after a preemption too.  LoRA's
    premise `before_within_max_loras`: before.running uses at most max_loras
    adapters (max_loras_respected of the step before; the running loop only
    takes requests out, so with no preemption `running` is before.running)."""
    c, s = V.c, V.s
    pre = run_pre(V) + [z3.Not(run_guard(s)), V.W0 >= 1, V.wx.static_facts(c, V.W0),
                         V.Lc0 >= 0, z3.Implies(c.lora, V.Lc0 <= c.ML)]
    if not R.admit_after_preemption:
        pre.append(s.P == 0)
    ws0 = WaitState(s.tb, s.ib, s.T, s.T, s.tb, s.ib, s.Rn, z3.IntVal(0), z3.IntVal(0), s.F, s.H, V.Lc0, s.Dc,
                    z3.BoolVal(False), s.PS)
    wx0 = replace(V.wx, adm=z3.BoolVal(False), n=z3.IntVal(0), b=z3.IntVal(0), ls=z3.BoolVal(False), cb=z3.IntVal(0))
    # With the waiting loop entered, the pool's blocks are the usable blocks.
    pre.append(V.k.F0 + V.k.H0 == c.U)
    return pre, z3.And(wait_I(c, ws0, V.W0), wait_J(c, ws0, wx0), s.P == 0)


def part_wait_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, R)
    return wait_pre(V) + frame + [wait_guard(V.c, V.ws, V.W0, R)], z3.And(wait_I(V.c, s2, V.W0),
                                                                             wait_J(V.c, s2, x2))


def part_finish_entry(V: LoopVars, R: LoopRules):
    ws = V.ws
    return wait_pre(V), finish_I(V.c, FinishState(ws.F, ws.H))


def part_finish_preserved(V: LoopVars, R: LoopRules):
    frame, s2 = finish_iteration(V.c, V.fs, V.fb, V.ff, V.fH, R)
    return [V.c.constraints(), finish_I(V.c, V.fs)] + frame, finish_I(V.c, s2)


# --- exits, iterations and lemmas of the properties ------------------------------------------
# Exit claims, one per property, each from an invariant and a loop's exit.


def exit_token_budget(V: LoopVars, R: LoopRules):
    """token_budget_respected: after the waiting loop (or a running loop with a
    preemption, which skips it) the grants sum to <= both budgets of the real config,
    and with a drafter's rows the grants and rows to <= max_num_batched_tokens."""
    c = V.c_real
    return wait_pre(V), z3.And(V.ws.T <= c.TB0, V.ws.T <= c.IB0, V.ws.T + V.ws.Dc <= c.IB0)


def exit_token_budget_running(V: LoopVars, R: LoopRules):
    c = V.c_real
    return run_pre(V) + [z3.Not(run_guard(V.s))], z3.And(V.s.T <= c.TB0, V.s.T <= c.IB0,
                                                         V.s.T + V.s.Dc <= c.IB0)


def exit_max_num_seqs(V: LoopVars, R: LoopRules):
    """max_num_seqs_respected: running never exceeds max_num_active_reqs after
    the waiting loop (finishes only shrink it)."""
    return wait_pre(V), V.ws.Rn <= V.c.M


def exit_max_num_seqs_running(V: LoopVars, R: LoopRules):
    return run_pre(V), V.s.Rn <= V.c.M


def iter_grants_positive(V: LoopVars, R: LoopRules):
    """grants_positive: every running grant is >= 1 token, to a request not granted before in the step."""
    frame, _, _, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return run_pre(V) + frame + [f["success"]], z3.And(f["n"] >= 1, z3.Not(f["cr_granted_before"]))


def iter_admission_positive(V: LoopVars, R: LoopRules):
    frame, _, _, f = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, R)
    return wait_pre(V) + frame + [f["admit"]], z3.And(f["n"] >= 1, z3.Not(f["head_admitted_before"]))


def exit_running_full_needs(V: LoopVars, R: LoopRules):
    """running_before_waiting, running part: the running loop left budget and
    preempted nothing (the waiting loop's premise), so every request of
    before.running with a positive capped need got all of it, but a prefill chunk
    a step holding prefill skips on purpose (S:838; the property's exception too)."""
    s, x = V.s, V.x
    pre = run_pre(V) + [z3.Not(run_guard(s)), s.P == 0, s.tb > 0, s.ib > 0, x.cap(V.c) > 0, z3.Not(x.held(V.c))]
    return pre, z3.And(x.inr, x.g, x.n == x.cap(V.c))


def exit_admissions_within_left(V: LoopVars, R: LoopRules):
    """running_before_waiting, waiting part: admissions use at most the budget the
    running loop left, min(token_budget, max_num_batched_tokens) - Tr, and only
    if it left some of both budgets."""
    c, ws = V.c_real, V.ws
    return wait_pre(V) + [ws.A > 0], z3.And(ws.T - ws.Tr <= c.B - ws.Tr,
                                              ws.tbE > 0, ws.ibE > 0)


def exit_grammar_wait(V: LoopVars, R: LoopRules):
    """grammar_wait_respected: when the waiting loop ends, a request of
    before.waiting whose grammar is compiling or failed was not admitted.  The
    running loop schedules only running requests, and a step with a preemption
    admits nobody (exit_no_admission_after_preemption), so this is every way it
    could be scheduled."""
    return wait_pre(V) + [z3.Not(wait_guard(V.c, V.ws, V.W0, R))], z3.Implies(V.wx.gw, z3.Not(V.wx.adm))


def exit_max_loras(V: LoopVars, R: LoopRules):
    """max_loras_respected: when the waiting loop ends, the batch has at most
    max_loras adapters.  A step with a preemption admits nobody
    (exit_no_admission_after_preemption) and the finish loop only takes requests
    out, so their adapters are a subset of before.running's, within max_loras by
    the premise."""
    return wait_pre(V) + [z3.Not(wait_guard(V.c, V.ws, V.W0, R))], z3.Implies(V.c.lora, V.ws.Lc <= V.c.ML)


def exit_preemption_failure(V: LoopVars, R: LoopRules):
    """preemption_only_on_allocation_failure: a preemption implies the whole block
    demand of before.running exceeds the free pool, and the victims are the first
    P of the policy's order (rank)."""
    s, x, k = V.s, V.x, V.k
    return run_pre(V) + [s.P > 0], z3.And(k.D0 > k.F0, z3.Implies(z3.Not(x.inr), x.seq == x.rank),
                                           z3.Implies(x.inr, x.rank >= s.P))


def exit_no_admission_after_preemption(V: LoopVars, R: LoopRules):
    """... and no request is admitted in that step: the waiting loop is entered
    only with P == 0 (S:1066); the bad variant enters it always."""
    entered = z3.BoolVal(True) if R.admit_after_preemption else (V.s.P == 0)
    return run_pre(V) + [z3.Not(run_guard(V.s)), V.s.P > 0], z3.Not(entered)


def exit_kv_conserved(V: LoopVars, R: LoopRules):
    """kv_blocks_conserved: after the finish loop, free + held == usable and free
    >= 0; each request holds cdiv(min(computed, L)) blocks: a running one of
    before.running (computed advanced by its grant, or 0 if preempted), and an
    admitted one."""
    c, x, wx = V.c, V.x, V.wx
    nc_after = z3.If(x.g, x.nc + x.n, z3.If(x.inr, x.nc, 0))
    per_x = x.b == c.cdiv(z3_min(nc_after, c.L))
    per_wx = wx.b == c.cdiv(z3_min(wx.computed(c), c.L))
    return run_pre(V) + wait_pre(V) + [finish_I(c, V.fs)], z3.And(
        V.fs.F + V.fs.H == c.U, V.fs.F >= 0, per_x, per_wx)


def exit_computed_bounded(V: LoopVars, R: LoopRules):
    """computed_tokens_bounded: 0 <= computed <= num_tokens + placeholders after
    schedule() and update_after_schedule (the grant never passes the need);
    with async on, strictly below (the state invariant
    computed_tokens_below_num_tokens: the placeholder added to a request that
    completes its known tokens; in the synchronous engine the token it samples,
    U:98-140, gives it); and computed < max_model_len (cap 3, S:868), the premise
    `static_facts` assumes of the next step.  A preempted request restarts from 0
    with no placeholders (S:1853-1897)."""
    c, x, wx = V.c, V.x, V.wx
    nc_after = z3.If(x.g, x.nc + x.n, z3.If(x.inr, x.nc, 0))
    ph_after = z3.If(x.inr, placeholders_after(c, nc_after, x.nt, x.ph, x.g, R, x.drafts_sent(x.n)), 0)
    # a waiting request has none (preempt resets them)
    wnc = wx.computed(c)
    wph_after = placeholders_after(c, wnc, wx.nt, 0, wx.adm, R, padded_drafts(c, wx))
    return run_pre(V) + wait_pre(V), z3.And(
        0 <= nc_after, nc_after <= x.nt + ph_after, z3.Implies(c.asy, nc_after < x.nt + ph_after), nc_after < c.L,
        z3.Implies(wx.adm, z3.And(wnc <= wx.nt + wph_after, z3.Implies(c.asy, wnc < wx.nt + wph_after),
                                  wnc < c.L)))


def lemma_delivery_keeps_bound(V: LoopVars, R: LoopRules):
    """update_from_output of a batch (with async, an older one, S:2301-2618)
    keeps computed < num_tokens + placeholders, computed < max_model_len and
    placeholders >= 0 for a request it does not finish: it delivers k <= 1 token
    (no speculative decoding), which replaces a placeholder (S:2898-2905) or, for
    a request preempted meanwhile (stale), is appended with progress and
    placeholders unchanged (S:2362-2384); computed tokens fall only by tokens
    discarded past a stop (S:2891-2897), which finishes the request."""
    c, x, k = V.c, V.x, V.dk
    nt2 = x.nt + k
    ph2 = x.ph - z3.If(z3.And(x.ph > 0, k > 0), k, 0)
    pre = [c.constraints(), c.asy, 0 <= x.nc, x.ph >= 0, x.nc < x.nt + x.ph, x.nc < c.L, 0 <= k, k <= 1]
    return pre, z3.And(x.nc < nt2 + ph2, x.nc < c.L, ph2 >= 0)


def exit_never_starved(V: LoopVars, R: LoopRules):
    """A request x of before.running that is still running after the running loop
    received >= 1 token, given the named premises: the capped needs of the
    requests ahead of it sum to less than the step budget (`ahead_within_budget`);
    `not_last_token_in_flight`: the async max_tokens guard does not skip it
    (S:816-830); `below_max_model_len_cap`: computed + 1 < max_model_len, so the
    max_model_len cap (S:868) leaves it a token (under async, computed tokens run
    ahead of num_tokens by the placeholders).  Both hold always in the
    synchronous engine (lemma below).  `not_held_prefill_chunk`: the step does
    not hold prefill, or x is not a prefill chunk (S:838, prefill throttling).
    `engine_not_paused_all`: a PAUSED_ALL engine schedules nothing (S:735, 739-741)."""
    s, x, k, c = V.s, V.x, V.k, V.c
    pre = run_pre(V) + [z3.Not(run_guard(s)), x.inr, k.CAx < c.B, z3.Not(x.lif()), x.nc + 1 < c.L,
                         z3.Not(x.held(c)), z3.Not(c.pa)]
    return pre, z3.And(x.g, x.n >= 1)


def exit_whole_need_when_it_fits(V: LoopVars, R: LoopRules):
    """... and when its own capped need fits the budget too (CAx + cap <= B), it
    received all of it.  Applied to each request y ahead of x (whose needs ahead
    and own are within x's: CAy + cap_y <= CAx < B), every request ahead of a
    request meeting `ahead_within_budget` gets its whole capped need: what the
    lemma `capped needs ahead never grow` needs to carry the premise to the next step."""
    s, x, k, c = V.s, V.x, V.k, V.c
    pre = run_pre(V) + [z3.Not(run_guard(s)), x.inr, x.cap(c) >= 1, k.CAx + x.cap(c) <= c.B, z3.Not(x.held(c)),
                         z3.Not(c.pa)]
    return pre, z3.And(x.g, x.n == x.cap(c))


def lemma_cap_positive_sync(V: LoopVars, R: LoopRules):
    """Without async scheduling both exceptions are void: computed < num_tokens <
    max_model_len gives no placeholder (so no guard) and room L - computed - 1 >= 1."""
    c, x = V.c, V.x
    return [c.constraints(), x.static_facts(c, V.k.R0), z3.Not(c.asy)], z3.And(z3.Not(x.lif()), x.nc + 1 < c.L)


def lemma_cap_positive(V: LoopVars, R: LoopRules):
    """The named exceptions are the only ones: outside them a running request's
    capped need is >= 1 (async on or off), so they are exactly the cases where the
    running loop skips it (n == 0, S:907-925) with budget left."""
    c, x = V.c, V.x
    return [c.constraints(), x.static_facts(c, V.k.R0), z3.Not(x.lif()), x.nc + 1 < c.L], x.cap(c) >= 1


def lemma_caps_nonincreasing(V: LoopVars, R: LoopRules):
    """`ahead_within_budget` is kept from step to step: a request that got its whole
    capped need c has a capped need <= c in the next step (its prefill chunk
    shrinks, or it samples and needs one token), so the sum ahead of x never grows
    (requests join running only at its tail, S:1609-1611, and leave by preemption
    or finish).  The next step's threshold in force `th2` is the same, or a lower
    positive one: an adaptive threshold that falls as requests arrive
    (config.long_prefill_threshold); one that grows is the next lemma's case."""
    c, x, k = V.c, V.x, V.dk
    cap = x.cap(c)
    nc2 = x.nc + cap
    # Async: update_after_schedule's placeholder, then the batch update_from_output
    # applies delivers k <= 1 token that replaces a placeholder (a sampling batch in
    # flight always carries one, async_scheduler.py:24-56, S:2898-2905).  Sync: the
    # step samples one token when the prefill is complete.
    ph2 = placeholders_after(c, nc2, x.nt, x.ph, z3.BoolVal(True), R, x.drafts_sent(cap))
    deliveries = z3.If(c.asy, z3.And(0 <= k, k <= 1, k <= ph2), k == z3.If(nc2 >= x.nt, 1, 0))
    nt3 = x.nt + k
    ph3 = ph2 - z3.If(ph2 > 0, k, 0)
    finished = z3.Or(nt3 >= c.L, nt3 >= x.lim)  # the length stops (U:98-140): it leaves
    x2 = replace(x, nc=nc2, nt=nt3, ph=ph3)
    c2 = replace(c, th=V.th2)
    same_or_lower = z3.Or(V.th2 == c.th, z3.And(0 < V.th2, V.th2 <= c.th))
    return [c.constraints(), x.static_facts(c, V.k.R0), cap >= 1, deliveries, z3.Not(finished),
            same_or_lower], x2.cap(c2) <= cap


def lemma_grown_threshold_within_budget(V: LoopVars, R: LoopRules):
    """An adaptive threshold that grows (config.long_prefill_threshold: max(threshold,
    max_num_batched_tokens // eligible), S:770-788) keeps `ahead_within_budget`
    when max_num_scheduled_tokens >= max_num_batched_tokens (the named premise
    `scheduled_at_least_batched`): the kA requests ahead of x and x are eligible, so
    the next step's threshold is at most max_num_batched_tokens // (kA + 1), and
    their capped needs, each at most it, sum to kA * threshold < the budget.  Each
    cap is at most the threshold (get_capped_need); their sum is bounded by kA
    times it as a sum of kA terms (the aggregation of proofs/starvation.py).
    Without the premise this fails: a request that got tokens is starved once
    other requests leave (tests/regressions/adaptive-threshold-grows.json, on the
    spec and vLLM 0.33.0)."""
    c = V.c
    # This step's and the next step's thresholds, both of the configured T, with x and
    # the kA requests ahead of it eligible in both.
    pre = [c.constraints(), threshold_constraints(c, V.T, V.adaptive), c.TB0 >= c.IB0,
           V.kA >= 1, V.NE >= V.kA + 1, V.NE2 >= V.kA + 1,
           c.th == threshold_in_force(V.T, V.adaptive, c.IB0, V.NE, c.chunked, c.release),
           V.th2 == threshold_in_force(V.T, V.adaptive, c.IB0, V.NE2, c.chunked, c.release),
           V.SA2 >= 0, V.SA2 <= V.kA * V.th2]
    # Only a grown threshold is this lemma's case (before 0.33.0 none grows: no adaptive flag).
    return pre, z3.Implies(V.th2 > c.th, V.SA2 < c.B)


# --- speculative decoding: drafts_sent_are_known ------------------------------------------


def drafts_J(c: LoopConfig, r: RunReq):
    """What the step's output holds for a request of before.running: drafts only
    for a request granted this step (a victim's leave with its grant, S:967-973),
    as many as spec_decode.schedule_drafts takes of its grant."""
    return r.ds == z3.If(r.g, r.drafts_sent(r.n), 0)


def part_drafts_entry(V: LoopVars, R: LoopRules):
    premises, s0, x0 = run_entry(V.c, V.k, V.x)
    return premises, drafts_J(V.c, x0)


def part_drafts_preserved(V: LoopVars, R: LoopRules):
    frame, s2, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    return run_pre(V) + [drafts_J(V.c, V.x)] + frame + [run_guard(V.s)], drafts_J(V.c, x2)


def exit_drafts_known(V: LoopVars, R: LoopRules):
    """drafts_sent_are_known, running part: when the running loop ends, a request
    of before.running has drafts in the output only if it is scheduled and still
    running, and no more than it has (its grant never passes num_tokens_with_spec
    + placeholders, S:855), so they are a prefix of its own (the spec slices
    them: spec_decode.schedule_drafts)."""
    x = V.x
    return run_pre(V) + [drafts_J(V.c, x), z3.Not(run_guard(V.s))], z3.And(
        x.ds <= x.d, z3.Implies(x.ds > 0, z3.And(x.g, x.inr)))


def iter_padded_admission(V: LoopVars, R: LoopRules):
    """... and admission part: a padded new decode is granted exactly 1 +
    num_speculative_tokens tokens, the one token it lacks and one per -1 draft, so
    its drafts are num_speculative_tokens paddings and vLLM's assertion S:1643
    holds; given the premise `threshold_admits_padded_decode` (no long-prefill
    threshold, or one of at least 1 + num_speculative_tokens: below it the
    threshold cuts the padded decode and vLLM 0.33.0 raises, docs/rules.md)."""
    c = V.c
    frame, _, _, f = wait_iteration(c, V.ws, V.W0, V.wx, V.wh, R)
    premise = z3.Or(c.th == 0, c.th >= 1 + c.K)
    return wait_pre(V) + frame + [f["padded"], premise], f["n"] == 1 + c.K


# --- async counters: placeholders_never_negative ------------------------------------------


def counters_J(ph, inf, stl, running):
    """One request's async counters between steps (spec/request.py): placeholders,
    in-flight and stale tokens are >= 0 and stale <= in flight (the property);
    and stale output is all of its output in flight, of a waiting request with
    no placeholders: a preemption makes all of it stale and resets the
    placeholders (S:1853-1897), and the waiting loop never admits it while any is
    left (S:1123), so nothing new goes in flight meanwhile."""
    return z3.And(ph >= 0, inf >= 0, stl >= 0, stl <= inf,
                  z3.Implies(stl > 0, z3.And(stl == inf, ph == 0, z3.Not(running))))


def _batch(V: LoopVars, n_now):
    """The batch update_from_output applies in this engine step: one scheduled
    before this schedule() (its tokens are in flight already: bt <= inf), or, when
    none was in flight, this step's (bt = its grant now; reference/engine.py
    _async_step, EngineCore.step_with_batch_queue); it samples k <= 1 token (no
    speculative decoding), only if it scheduled some."""
    return [V.bt >= 0, z3.Or(V.bt <= V.inf, V.bt == n_now), 0 <= V.dk, V.dk <= 1, V.dk <= V.bt]


def exit_counters_running(V: LoopVars, R: LoopRules):
    """A request of before.running after schedule(), update_after_schedule and
    the delivery: preempted (its output in flight goes stale, placeholders reset),
    granted (the grant goes in flight, a placeholder unless mid-prefill) or left."""
    c, x = V.c, V.x
    n_now = z3.If(x.g, x.n, 0)
    pre = run_pre(V) + [z3.Not(run_guard(V.s)), c.asy, counters_J(x.ph, V.inf, V.stl, True)] + _batch(V, n_now)
    nc2 = z3.If(x.g, x.nc + x.n, x.nc)
    gone = z3.Not(x.inr)
    ph2 = z3.If(gone, 0, placeholders_after(c, nc2, x.nt, x.ph, x.g, R, x.drafts_sent(x.n)))
    inf2 = inflight_after(V.inf, x.g, x.n, R)
    stl2 = z3.If(gone, V.inf, V.stl)
    ph3, inf3, stl3 = deliver(ph2, inf2, stl2, V.bt, V.dk, R)
    return pre, counters_J(ph3, inf3, stl3, x.inr)


def exit_counters_waiting(V: LoopVars, R: LoopRules):
    """A request of before.waiting (no placeholders: a preemption reset them),
    admitted (never with stale output: the skip of S:1123, wait_J) or left."""
    c, wx = V.c, V.wx
    n_now = z3.If(wx.adm, wx.n, 0)
    pre = wait_pre(V) + [c.asy, counters_J(0, V.inf, V.stl, False), wx.st == (V.stl > 0)] + _batch(V, n_now)
    ph2 = placeholders_after(c, wx.computed(c), wx.nt, 0, wx.adm, R, padded_drafts(c, wx))
    inf2 = inflight_after(V.inf, wx.adm, wx.n, R)
    ph3, inf3, stl3 = deliver(ph2, inf2, V.stl, V.bt, V.dk, R)
    return pre, counters_J(ph3, inf3, stl3, wx.adm)


# --- prefix caching: which blocks a step caches ---------------------------------------------


class DeliveryVars:
    """A delivery's inputs besides the request's (RunReq x): tokens sampled, the
    first stop's position, drafts sent, and in-flight tokens before it and of the batch."""

    def __init__(self):
        self.m, self.stop_at, self.d = z3.Int("L.del.m"), z3.Int("L.del.stop"), z3.Int("L.del.d")
        self.inf, self.bt = z3.Int("L.del.inf"), z3.Int("L.del.bt")


def delivery(V: LoopVars, R: LoopRules):
    """deliver_tokens on the ghost x as update_from_output finds it (nc: computed
    tokens with the batches in flight, b: blocks held): its cached blocks held and
    known (what the iteration parts prove a grant leaves), its blocks covering its
    computed tokens (blocks_match_computed_tokens), not finished (num_tokens below
    both limits); a batch that granted it drafts: m <= d + 1 tokens sampled."""
    c, x, D = V.c, V.x, DeliveryVars()
    nc2, nt2, cb2 = deliver_tokens(c, x.nc, x.nt, x.lim, x.cb, D.d, D.m, D.stop_at, D.inf, D.bt, x.ph, R)
    pre = [c.constraints(), 0 <= x.cb, x.cb <= x.b, x.cb * c.bs <= x.nt, z3.Implies(z3.Not(c.pc), x.cb == 0),
           0 <= x.nc, c.cdiv(x.nc) <= x.b, x.ph >= 0, 1 <= x.nt, x.nt < c.L, x.nt < x.lim,
           1 <= D.m, D.m <= D.d + 1, 0 <= D.d, D.d <= c.K, D.stop_at >= 1, 0 <= D.bt, D.bt <= D.inf, D.inf <= x.nc]
    return D, pre, nc2, nt2, cb2


def iter_grant_caches_computed(V: LoopVars, R: LoopRules):
    """prefix_hit_within_shared_prefix, running part: after a grant of n the
    request's cached blocks are blocks it holds, of tokens it knows, and those it
    newly caches the step computes (the property's `available` grows by at most
    min(start + n, num_tokens) // block_size blocks of it)."""
    frame, _, x2, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, R)
    x = V.x
    return run_pre(V) + frame + [f["success"], same_request(x, V.cr)], z3.And(
        x2.cb <= x2.b, x2.cb * V.c.bs <= x.nt, z3.Or(x2.cb == x.cb, x2.cb * V.c.bs <= x.nc + f["n"]))


def iter_admission_caches_computed(V: LoopVars, R: LoopRules):
    """... and waiting part: an admission holds its hit blocks, cached already, and
    caches only blocks whose tokens the hit and its grant compute."""
    c, wx = V.c, V.wx
    frame, _, x2, f = wait_iteration(c, V.ws, V.W0, wx, V.wh, R)
    return wait_pre(V) + frame + [f["admit"], wx.q == V.wh.q], z3.And(
        x2.cb <= x2.b, x2.cb * c.bs <= wx.nt, x2.cb * c.bs <= wx.hit(c) + f["n"])


def lemma_delivery_caches_computed(V: LoopVars, R: LoopRules):
    """... and a delivery keeps the cached blocks within those it holds and the
    tokens it knows, and newly caches only blocks of tokens computed by the batches
    applied (out of flight), after its rejected drafts and discarded tokens."""
    D, pre, nc2, nt2, cb2 = delivery(V, R)
    x = V.x
    out_of_flight = nc2 - (D.inf - D.bt)
    return pre, z3.And(cb2 <= x.b, cb2 * V.c.bs <= nt2, z3.Or(cb2 == x.cb, cb2 * V.c.bs <= out_of_flight))
