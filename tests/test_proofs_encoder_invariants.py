"""proofs/encoder_invariants.py: encoder inputs' three properties for any number of
requests, items and cache entries.

- Each claim is proved, its bad variants refuted, its premises satisfiable, its
  witness replayed on the spec.
- The encodings agree with the spec's own functions on concrete values: the spec runs
  drawn scenarios with its encoder cache and plan instrumented, and every operation
  (a plan, a hit, an eviction, a commit, a refund, a freed reference) is replayed
  through the encoding, whose state must equal the spec's and satisfy the invariant;
  every plan is replayed through the loop encoding item by item, whose chunk and
  available items must equal the spec's.  A mutant of an encoding breaks that.
"""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import z3

from schedspec.proofs import encoder_invariants as E
from schedspec.proofs.release import DEFAULT, Release
from schedspec.reference.campaign import random_scenario
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import FLAGS_ALL, features_for
from schedspec.reference.impl import SpecScheduler
from schedspec.spec import encoder_cache, encoder_inputs

SEED = 5


@pytest.mark.parametrize("name", list(E.CLAIMS))
def test_each_claim_is_proved_its_bad_variants_refuted_and_its_witness_shown(name):
    claim = E.CLAIMS[name]
    assert E.discharge(claim, DEFAULT).status == "proved"
    for variant in claim.bad_variants:
        assert E.discharge(claim, DEFAULT, variant).status == "refuted", variant
    assert E.vacuity(claim, DEFAULT).status == "proved"
    result, scenario = E.witness(name, DEFAULT)
    assert result.status == "proved", result.detail


def test_obligations_exist_for_the_release_that_models_encoder_inputs_only():
    assert {o.name for o in E.obligations(DEFAULT)} == {f"encoder:{n}" for n in E.CLAIMS}
    assert all(set(o.bad_variants) == set(E.CLAIMS[o.property].bad_variants) for o in E.obligations(DEFAULT))
    assert E.obligations(Release("0.30.0")) == []


def test_every_bad_variant_belongs_to_a_claim():
    used = {v for c in E.CLAIMS.values() for v in c.bad_variants}
    assert used == set(E.ENC_VARIANTS) - {"correct"}


# -- agreement with the spec on concrete values ----------------------------------------------------


def value(t):
    t = z3.simplify(t) if z3.is_expr(t) else t
    if z3.is_expr(t):
        return z3.is_true(t) if z3.is_bool(t) else t.as_long()
    return t


def agg_of(a: E.Agg) -> dict:
    return {f.name: value(getattr(a, f.name)) for f in fields(E.Agg)}


class Recorder:
    """Replays the spec's encoder operations of one run through the encodings."""

    def __init__(self, rules: E.EncRules):
        self.rules = rules
        self.agg: E.Agg | None = None
        self.mismatches: list[str] = []
        self.ops = {k: 0 for k in ("begin", "hit", "choose", "commit", "preempt", "unref", "cut")}
        self.items: list | None = None  # the current plan's (found, fits) answers per item consulted

    def check(self, what: str, spec: dict) -> None:
        got = agg_of(self.agg)
        diff = {k: (got[k], v) for k, v in spec.items() if got[k] != v}
        if diff or not value(E.agg_I(self.agg)):
            self.mismatches.append(f"{what}: {diff or 'invariant false'}")

    def apply(self, op: str, **x) -> None:
        inputs = {"n": 0, "k": 0, "ev": 0, "unref": False, **x}
        pre, self.agg = E.AGG_OPERATIONS[op](self.agg, inputs, self.rules)
        if not all(value(p) for p in pre):
            self.mismatches.append(f"{op}: a premise is false on {inputs}")
        self.ops[op] += 1


def cache_view(w: encoder_cache.EncoderCacheWork, size: int) -> dict:
    return {"U": sum(w.num_embeds.values()), "FR": sum(w.num_embeds[h] for h in w.freeable), "C": size}


@pytest.fixture
def instrumented(monkeypatch):
    """A Recorder fed by the spec's encoder functions, under `rules`."""
    state = {}
    W = encoder_cache.EncoderCacheWork

    def start(rules):
        rec = state["rec"] = Recorder(rules)
        return rec

    def fresh_agg(s):
        c = s.config
        rec = state["rec"]
        v = cache_view(s.encoder, c.encoder_cache_capacity)
        rec.agg = E.Agg(B=c.encoder_compute_budget, C=v["C"], eb=s.encoder_budget, E=0, U=v["U"], FR=v["FR"],
                        S=0, ebp=0, plan=False)

    orig_plan, orig_commit, orig_release = encoder_inputs.plan, encoder_inputs.commit, encoder_inputs.release

    def plan(s, r, num_computed_tokens, n):
        rec = state["rec"]
        if rec.agg is None or state.get("s") is not s:  # a new schedule() (held: no id reused)
            state["s"] = s
            fresh_agg(s)
        rec.items = []
        rec.apply("begin")  # every call starts a plan, an empty one too (encoder_plan is reset)
        state["w"] = s.encoder
        out = orig_plan(s, r, num_computed_tokens, n)
        if n and r.mm_features:
            replay_plan(rec, s, r, num_computed_tokens, n, out)
        return out

    def commit(s, rid):
        rec = state["rec"]
        orig_commit(s, rid)
        if rec.agg is not None and value(rec.agg.plan):
            rec.apply("commit")
            c = s.config
            rec.check("commit", {"eb": s.encoder_budget, "E": encoded(s), **cache_view(s.encoder, c.encoder_cache_capacity)})

    def release(s, victim):
        rec = state["rec"]
        if victim not in s.requests:  # the operation's premise: a request of the step is preempted
            rec.mismatches.append(f"preempt: no request {victim!r} to release")
        ev = sum(s.requests[victim].mm_features[i].length for i in s.encoder_inputs.get(victim, ()))
        if rec.agg is not None and state.get("s") is s:
            rec.apply("preempt", ev=ev)
        orig_release(s, victim)
        if rec.agg is not None and state.get("s") is s:
            rec.check("preempt", {"eb": s.encoder_budget, "E": encoded(s)})

    def encoded(s):
        return sum(s.requests[rid].mm_features[i].length for rid, ids in s.encoder_inputs.items() for i in ids)

    orig_check, orig_can, orig_free = W.check_and_update_cache, W.can_allocate, W.free_encoder_input

    def check_and_update_cache(self, rid, input_id, identifier):
        rec = state.get("rec")
        unref = identifier in self.freeable
        n = self.num_embeds.get(identifier, 0)
        found = orig_check(self, rid, input_id, identifier)
        if rec is not None and rec.items is not None and self is state.get("w"):
            rec.items.append(("found" if found else "miss", input_id))
            if found and rec.agg is not None:
                rec.apply("hit", n=n, unref=unref)
        return found

    def can_allocate(self, num_embeds, budget, planned, size):
        rec = state.get("rec")
        before = cache_view(self, size)
        ok = orig_can(self, num_embeds, budget, planned, size)
        if rec is not None and rec.items is not None and self is state.get("w"):
            rec.items.append(("fits" if ok else "no_room", None))
            if ok and rec.agg is not None:
                rec.apply("choose", n=num_embeds, k=before["U"] - cache_view(self, size)["U"])
                rec.check("choose", cache_view(self, size))
        return ok

    def free_encoder_input(self, rid, input_id):
        rec = state.get("rec")
        identifier = self.refs.get(rid, {}).get(input_id)
        was_free = identifier in self.freeable
        before = cache_view(self, 0)
        orig_free(self, rid, input_id)
        if rec is None or identifier is None or identifier not in self.freeable or was_free:
            return
        if self is state.get("w") and rec.agg is not None:  # inside schedule(): the step's aggregates
            rec.apply("unref", n=self.num_embeds[identifier])
            rec.check("unref", {"FR": cache_view(self, 0)["FR"], "U": cache_view(self, 0)["U"]})
        else:  # update_from_output or a finish: the cache's aggregates alone
            saved, rec.agg = rec.agg, E.Agg(B=1, C=before["U"], eb=0, E=0, U=before["U"], FR=before["FR"], S=0,
                                             ebp=0, plan=False)
            rec.apply("unref", n=self.num_embeds[identifier])
            rec.check("unref", {"FR": cache_view(self, 0)["FR"], "U": cache_view(self, 0)["U"]})
            rec.agg = saved

    monkeypatch.setattr(encoder_inputs, "plan", plan)
    monkeypatch.setattr(encoder_inputs, "commit", commit)
    monkeypatch.setattr(encoder_inputs, "release", release)
    monkeypatch.setattr(W, "check_and_update_cache", check_and_update_cache)
    monkeypatch.setattr(W, "can_allocate", can_allocate)
    monkeypatch.setattr(W, "free_encoder_input", free_encoder_input)
    return start


def replay_plan(rec: Recorder, s, r, c: int, n_in: int, n_out: int) -> None:
    """The plan's loop through `plan_iteration`, item by item, with the cache's answers
    the spec got; the chunk and the available items must be the spec's, and the loop
    invariant hold for every item as the ghost after every iteration."""
    chosen, _, repeated = s.encoder_plan
    answers = iter(rec.items)
    cfg = s.config
    win = dict(c=c, n=n_in, shift=cfg.num_prefill_lookahead_tokens, unsplit=cfg.disable_chunked_mm_input, cut=False,
               nxt=0)
    ghosts = [dict(og=f.offset, lg=f.length, pg=False, ag=False) for f in r.mm_features]
    seen: dict[str, int] = {}
    available = set()
    for i, f in enumerate(r.mm_features):
        if win["cut"]:
            break
        inwin = f.offset < win["c"] + win["n"] + win["shift"] and f.offset + f.length > win["c"]
        unsplit = inwin and win["unsplit"] and c <= f.offset and win["c"] + win["n"] < f.offset + f.length
        found = fits = False
        if inwin and not unsplit:
            if f.identifier in seen:
                found = True  # a repeat: the spec consults nothing
            else:
                kind, _ = next(answers)
                found = kind == "found"
                if not found:
                    fits = next(answers)[0] == "fits"
                    if fits:
                        seen[f.identifier] = i
        new_ghosts = []
        for j, g in enumerate(ghosts):
            w = E.Win(**{**win, **g})
            x = {"of": f.offset, "lf": f.length, "isg": i == j, "found": found, "fits": fits}
            pre, w2, facts = E.plan_iteration(w, x, rec.rules)
            if not value(E.win_J(w2)):
                rec.mismatches.append(f"plan: the loop invariant is false after item {i} (ghost {j})")
            new_ghosts.append({k: value(getattr(w2, k)) for k in ("og", "lg", "pg", "ag")})
            nxt = {k: value(getattr(w2, k)) for k in ("n", "cut", "nxt")}
            if i == j and value(facts["available"]):
                available.add(i)
        ghosts = new_ghosts
        rec.ops["cut"] += nxt["cut"]
        win.update(nxt)
    spec_available = set(chosen) | set(repeated) | {i for kind, i in rec.items if kind == "found"}
    if win["n"] != n_out or available != spec_available:
        rec.mismatches.append(f"plan of {r.request_id}: encoding n={win['n']} available={sorted(available)}; "
                              f"spec n={n_out} available={sorted(spec_available)}")
    rec.items = None


def encoder_scenarios(n: int = 160):
    drawn = (random_scenario(SEED, i, FLAGS_ALL, features_for("vllm", "spec")) for i in range(n))
    return [s for s in drawn if any(r.mm_features for r in s.requests)]


def run_all(start, rules: E.EncRules, until_mismatch: bool = False) -> Recorder:
    """Every encoder scenario run by the spec and replayed through the encodings;
    `until_mismatch`: stop after the first scenario that shows one (a broken
    variant needs only one)."""
    rec = start(rules)
    for sc in encoder_scenarios():
        rec.agg = None
        run_scenario(sc, SpecScheduler())
        if until_mismatch and rec.mismatches:
            break
    return rec


def test_the_encodings_agree_with_the_spec(instrumented):
    rec = run_all(instrumented, E.ENC_VARIANTS["correct"])
    assert rec.mismatches == [], rec.mismatches[:5]
    # Every operation happened, many times.
    assert all(n >= 20 for n in rec.ops.values()), rec.ops


# The variants that change an effect (the others drop a premise: z3 refutes them).
@pytest.mark.parametrize("variant", ["cut_inside_item", "chunk_kept_inside_item", "unsplittable_item_split",
                                     "referenced_entry_evicted"])
def test_a_broken_encoding_disagrees_with_the_spec(instrumented, variant):
    rec = run_all(instrumented, E.ENC_VARIANTS[variant], until_mismatch=True)
    assert rec.mismatches
