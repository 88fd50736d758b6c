"""The loop claims are not vacuous: every part's premises are satisfiable, and the
iterations can do what the claim is about (a grant, a preemption, an admission, a
skip for each reason the spec skips a request), with the engine flags off and on.
A part whose premises were unsat would prove its goal vacuously.
"""

from __future__ import annotations

import time

import z3

from schedspec.spec import versions

from .encoding import z3_min
from .loop_claims import ASYNC_ONLY, SPEC_DECODE, LoopClaim, claim_premises
from .loop_parts import LoopVars, delivery, drafts_J, exit_counters_running, exit_counters_waiting, run_pre, wait_pre
from .loop_rules import LOOP_VARIANTS, LoopRules
from .loop_running import run_iteration, same_request
from .loop_waiting import wait_iteration
from .obligation import Result
from .release import Release
from .solving import vacuity_result


def vacuity(claim: LoopClaim, release: Release, timeout_s: float, bs: int = 4) -> Result:
    """Every part's premises are satisfiable, and the iterations can do what the
    claim is about: a grant and a preemption in the running loop (P == 0 before
    it), an admission in the waiting loop.  A part whose premises were unsat would
    prove its goal vacuously."""
    t0 = time.perf_counter()
    rules = LOOP_VARIANTS["correct"]
    V = LoopVars(bs, rules, release)
    # speculative decoding on too, where the claim covers it and the release has it
    spec_decode = claim.name in SPEC_DECODE and release.models(versions.SPEC_DECODE)
    checks = _part_checks(claim, V, rules, spec_decode)
    frame, _, _, f = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, rules)
    run = run_pre(V) + frame
    checks += _running_checks(V, f, run)
    wframe, _, _, wf = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, rules)
    wait = wait_pre(V) + wframe
    checks += _waiting_checks(V, f, run, wf, wait)
    if spec_decode:
        checks += _spec_decode_checks(V, f, run, wf, wait)
    if claim.name == "prefix_hit_within_shared_prefix":
        checks += _caching_checks(V, rules, f, run, wf, wait)
    if claim.name in ASYNC_ONLY:
        checks += _async_counter_checks(V, rules)
    return vacuity_result(checks, timeout_s, t0)


def _part_checks(claim: LoopClaim, V: LoopVars, rules: LoopRules, spec_decode: bool) -> list:
    """Each part's premises with the engine flags off and on (the synchronous-only
    lemma: off); speculative decoding on too where the claim covers it."""
    checks = []
    for name, build in claim.parts:
        premises, _ = build(V, rules)
        premises = premises + claim_premises(claim, V)
        for asy in (False, True):
            if asy and name.startswith("lemma: without async"):
                continue
            if not asy and claim.name in ASYNC_ONLY and name.startswith("exit"):
                continue
            if not asy and "delivering" in name:
                continue  # stated for async (the synchronous delivery is the existing "update only appends")
            for sd in (False, True) if spec_decode else (False,):
                if not sd and "padded" in name:
                    continue  # a padded new decode exists only with speculative decoding on
                checks.append((f"{name} (async {'on' if asy else 'off'}, speculative decoding "
                               f"{'on' if sd else 'off'})", premises + [V.c.asy == asy, V.c.sd == sd]))
    return checks


def _running_checks(V: LoopVars, f: dict, run: list) -> list:
    """A running-loop round can grant, preempt another request or itself, and do so
    under async scheduling."""
    return [("a running grant", run + [f["success"], z3.Not(same_request(V.x, V.cr)), V.x.inr, V.x.pos > V.s.cur]),
            ("a first preemption of another request", run + [f["fail"], V.s.P == 0, z3.Not(f["self_preempt"])]),
            ("a self-preemption", run + [f["self_preempt"]]),
            ("async: a grant that counts placeholders", run + [V.c.asy, f["success"], V.cr.ph > 0]),
            ("async: a request skipped by the max_tokens guard, budget left",
             run + [V.c.asy, f["skip"], f["guarded"], V.x.inr, V.x.pos > V.s.cur]),
            ("async: a preemption of a request with placeholders", run + [V.c.asy, f["fail"], V.v.ph > 0])]


def _waiting_checks(V: LoopVars, f: dict, run: list, wf: dict, wait: list) -> list:
    """A waiting-loop round can admit and skip, and each modelled feature's rule
    (prefill throttling, structured output, LoRA) can act."""
    checks = [("an admission", wait + [wf["admit"], V.ws.A > 0]),
              ("async: a stale head skipped", wait + [wf["skip_stale"]]),
              ("async: an admission behind a skipped request", wait + [wf["admit"], V.ws.K > 0])]
    if V.c.release.models(versions.PREFILL_THROTTLE):
        checks += [("prefill throttling: a held prefill chunk skipped, budget left",
                    run + [f["held"], V.x.inr, V.x.pos > V.s.cur]),
                   ("prefill throttling: admission stopped at a request with prefill left",
                    wait + [wf["held_stop"]]),
                   ("prefill throttling: a one-token admission in a step that holds prefill",
                    wait + [wf["admit"], V.c.hold])]
    if V.c.release.models(versions.STRUCTURED_OUTPUT):
        checks.append(("a head waiting for its grammar skipped", wait + [wf["skip_grammar"]]))
        checks.append(("an admission behind a request waiting for its grammar",
                       wait + [wf["admit"], V.wx.gw, V.wx.q < V.wh.q]))
    if V.c.release.models(versions.LORA):
        checks += [("LoRA: a head skipped, its adapter one too many", wait + [wf["skip_lora"]]),
                   ("LoRA: an admission bringing a new adapter to a batch below max_loras",
                    wait + [wf["admit"], V.c.lora, V.wh.ln, V.ws.Lc > 0]),
                   ("LoRA: an admission behind a request skipped for its adapter",
                    wait + [wf["admit"], V.wx.ls, V.wx.q < V.wh.q])]
    return checks


def _spec_decode_checks(V: LoopVars, f: dict, run: list, wf: dict, wait: list) -> list:
    """Speculative decoding's rules can act: drafts sent whole and cut short, a
    victim's drafts, a padded new decode, drafter rows charged and refunded."""
    ns = V.cr.drafts_sent(f["n"])
    return [("speculative decoding: a grant sending all of a request's drafts",
             run + [V.c.sd, f["success"], ns == V.cr.d, V.cr.d > 1]),
            ("speculative decoding: a grant cut short of a request's drafts",
             run + [V.c.sd, f["success"], ns > 0, ns < V.cr.d]),
            ("speculative decoding: a preemption of a request granted drafts",
             run + [V.c.sd, f["fail"], V.v.g, V.v.drafts_sent(V.v.n) > 0, drafts_J(V.c, V.v)]),
            ("speculative decoding: a padded new decode admitted, with a lookahead",
             wait + [wf["padded"], V.c.K > 1, V.c.LA > 0]),
            ("speculative decoding: a grant cut by the drafter rows, after another grant",
             run + [V.c.D > 0, f["success"], f["n"] == V.s.ib, V.s.Dc > 0]),
            ("speculative decoding: a refund of a victim's drafter rows",
             run + [V.c.D > 0, f["fail"], V.v.g]),
            ("speculative decoding: an admission after grants charged drafter rows",
             wait + [wf["admit"], V.c.D > 0, V.ws.Dc > V.c.D])]


def _caching_checks(V: LoopVars, rules: LoopRules, f: dict, run: list, wf: dict, wait: list) -> list:
    """prefix_hit_within_shared_prefix: a grant, an admission from a hit and a
    delivery can each cache a block, and a hash lookahead can hold one back."""
    _, _, x2, _ = run_iteration(V.c, V.k, V.s, V.x, V.cr, V.v, V.sp, rules)
    _, _, wx2, _ = wait_iteration(V.c, V.ws, V.W0, V.wx, V.wh, rules)
    D, dpre, _, _, cb2 = delivery(V, rules)
    return [("prefix caching: a running grant that caches a block",
             run + [f["success"], same_request(V.x, V.cr), x2.cb > V.x.cb]),
            ("prefix caching: an admission from a hit that caches a block past it",
             wait + [wf["admit"], V.wx.q == V.wh.q, V.wh.hb > 0, wx2.cb > V.wh.hb]),
            ("prefix caching: a delivery of drafts, one rejected, past a stop, that caches a block",
             dpre + [D.d > 0, D.m <= D.d, D.stop_at < D.m, cb2 > V.x.cb]),
            ("prefix caching: a hash lookahead holding a full block back",
             run + [f["success"], same_request(V.x, V.cr), V.c.LH > 0,
                    x2.cb < z3_min(V.x.nc + f["n"], V.x.nt) / V.c.bs])]


def _async_counter_checks(V: LoopVars, rules: LoopRules) -> list:
    """placeholders_never_negative: output goes stale and is delivered, a granted
    request gets an older batch's token, an admission's own batch is applied."""
    xr, _ = exit_counters_running(V, rules)
    xw, _ = exit_counters_waiting(V, rules)
    return [("async: a preempted request's output goes stale and is delivered",
             xr + [z3.Not(V.x.inr), V.inf > 0, V.bt > 0]),
            ("async: a granted request with placeholders gets a token of an older batch",
             xr + [V.x.g, V.x.ph > 0, V.dk == 1, V.bt <= V.inf]),
            ("async: a waiting request's stale output delivered", xw + [V.stl > 0, V.bt > 0]),
            ("async: an admission whose own batch is applied", xw + [V.wx.adm, V.bt == V.wx.n])]
