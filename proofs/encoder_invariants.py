"""Encoder inputs' properties for ANY number of requests, items and cache entries (z3).

A step changes the encoder budget and the encoder cache (spec/encoder_inputs.py,
spec/encoder_cache.py; S = vllm/v1/core/sched/scheduler.py, ECM =
v1/core/encoder_cache_manager.py) only through these operations, each one rule:

- begin:   a request's plan starts from the budget left (S:2064-2106, `plan`);
- hit:     an item found cached is referenced, leaving the freeable list if it was on it (ECM:111-139);
- choose:  an item of n embeddings is planned: n within the plan's budget, n plus the
           request's items planned so far within the cache's free slots after evicting
           k freeable ones (ECM:148-209);
- commit:  the request is scheduled: its planned items are allocated and charged, and
           the budget becomes the plan's (S:1044-1052, 2050-2062; the plan's, not the
           budget a preemption meanwhile refunded, S:1046);
- preempt: a victim granted this step gives back the embeddings it was to encode (S:973-984);
- unref:   a last reference dropped makes an entry freeable (ECM:259-298).

**Aggregates** (`Agg`): the budget B and cache size C, the budget left `eb`, the
embeddings of the items that the step's standing grants encode `E`, the cache's used
slots `U` and freeable slots `FR`, and the plan in progress (`plan`, its planned
embeddings `S` and its budget `ebp`).  The invariant (`agg_I`) is shown to hold at a
step's start and to be preserved by each operation from any state satisfying it; so
after any sequence of them, for any number of requests, items and entries:
`encoder_budget_respected` (E <= B) and `encoder_cache_within_capacity` (U <= C).
Where an operation takes one share out of a sum (a victim's refund out of E, evicted
slots out of FR) the share is bounded by the sum: true of any list of non-negative
shares.

**The plan's loop** (`encoder_inputs_available`): `plan` walks the request's items in
offset order (they lie apart).  From an arbitrary iteration state (computed tokens
`c`, chunk `n`, the drafter's read-ahead `shift`, whether the loop was cut, and `nxt`,
below which every item handled so far ends and at or above which every other starts),
one iteration handles the next item `f`: outside the window (skipped), unsplittable
(the chunk stops before it, S:2139-2151), found (a hit or a repeat, S:2156-2201), not
fitting (the chunk stops before it, or is nothing when it starts inside, S:2203-2225),
or chosen.  Whether an item is found or fits is an input: any cache may answer either.
The invariant, for an arbitrary item `g` (the ghost): handled and reached by the chunk
implies available (chosen or found); not handled implies it starts at or after `nxt`;
a cut leaves the chunk empty or every unhandled item at or past its end.  At the loop's exit, and
after the drafter's reserve shortens the chunk (S:902-905), every item the chunk
reaches is available.  That a found item stays cached to the step's end (it is
referenced, and only unreferenced entries are evicted: `choose`'s k <= FR) and a chosen
one is allocated when the request is granted is checked on the spec's runs
(tests/test_proofs_encoder_invariants.py), as is every encoding here against the
spec's own functions on concrete values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import z3

from schedspec.spec import versions
from schedspec.spec.versions import MM_CHUNK_INSIDE_ITEM_WAITS

from .solving import vacuity_result
from .witness_replay import fixed_witness_description, replay_witness
from .claim_obligations import Claim, claim_obligations, discharge_parts
from .obligation import Bound, Obligation, Result
from .release import DEFAULT, Release

DEFAULT_TIMEOUT_S = 20.0
BoolTerm = Any  # a z3 Bool (an Int otherwise): `_fresh` makes each field's variable by it


@dataclass(frozen=True)
class EncRules:
    """The spec's rules ("correct") and known-bad changes, one rule each."""

    budget_check: bool = True  # ECM:163-164: an item over the plan's budget is not chosen
    planned_counted: bool = True  # ECM:166: the request's items planned so far count against the cache
    evict_freeable_only: bool = True  # ECM:174-182: only unreferenced entries are evicted
    commit_takes_plan: bool = True  # S:1046: the budget becomes the plan's (False: a refund kept)
    preempt_refund_leaves: bool = True  # S:973-984: a refunded victim's embeddings leave E
    cut_margin: int = 0  # S:2215-2219: the chunk stops `cut_margin` tokens past the item's start
    nothing_inside_item: bool = True  # S:2220-2225: 0 when the chunk starts inside the item
    unsplit_cut: bool = True  # S:2139-2151: an unsplittable item stops the chunk before it


ENC_VARIANTS: dict[str, EncRules] = {
    "correct": EncRules(),
    "encoder_budget_unchecked": EncRules(budget_check=False),
    "planned_items_not_counted": EncRules(planned_counted=False),
    "referenced_entry_evicted": EncRules(evict_freeable_only=False),
    "refund_kept_at_commit": EncRules(commit_takes_plan=False),
    "refunded_embeddings_kept": EncRules(preempt_refund_leaves=False),
    "cut_inside_item": EncRules(cut_margin=1),
    "chunk_kept_inside_item": EncRules(nothing_inside_item=False),
    "unsplittable_item_split": EncRules(unsplit_cut=False),
}


def _fresh(cls, prefix: str, **given):
    """A `cls` of fresh z3 symbols `prefix.field`, but the fields `given`."""
    return cls(**{f.name: (z3.Bool if f.type == "BoolTerm" else z3.Int)(f"{prefix}.{f.name}") for f in fields(cls)
                  if f.name not in given}, **given)


@dataclass(frozen=True)
class Agg:
    B: Any  # max_num_encoder_input_tokens
    C: Any  # the encoder cache's size
    eb: Any  # the budget left (ScheduleWork.encoder_budget)
    E: Any  # embeddings the standing grants encode (ScheduleWork.encoder_inputs)
    U: Any  # used slots: every entry (EncoderCache.num_used_slots)
    FR: Any  # freeable slots: the unreferenced entries
    S: Any  # the plan's embeddings so far (plan's `this_step`)
    ebp: Any  # the plan's budget (plan's `budget`)
    plan: BoolTerm  # a plan in progress


def agg_I(a: Agg):
    return z3.And(a.B >= 1, a.C >= 1, a.eb >= 0, a.E >= 0, a.E + a.eb <= a.B, 0 <= a.FR, a.FR <= a.U, a.U <= a.C,
                  z3.If(a.plan, z3.And(a.S >= 0, a.ebp >= 0, a.ebp + a.S <= a.eb, a.S <= a.C - a.U), a.S == 0))


def begin(a: Agg, x: dict, R: EncRules):
    return [], replace(a, plan=z3.BoolVal(True), S=z3.IntVal(0), ebp=a.eb)


def hit(a: Agg, x: dict, R: EncRules):
    """An entry of x['n'] embeddings found; x['unref']: nobody referenced it."""
    n, unref = x["n"], x["unref"]
    return [n >= 1, z3.Implies(unref, n <= a.FR)], replace(a, FR=a.FR - z3.If(unref, n, 0))


def choose(a: Agg, x: dict, R: EncRules):
    """An item of x['n'] embeddings planned after evicting x['k'] slots."""
    n, k = x["n"], x["k"]
    need = n + (a.S if R.planned_counted else 0)
    pre = [a.plan, n >= 1, k >= 0, k <= (a.FR if R.evict_freeable_only else a.U), need <= a.C - (a.U - k)]
    if R.budget_check:
        pre.append(n <= a.ebp)
    return pre, replace(a, U=a.U - k, FR=a.FR - k if R.evict_freeable_only else a.FR, ebp=a.ebp - n, S=a.S + n)


def commit(a: Agg, x: dict, R: EncRules):
    some = a.S > 0
    return [a.plan], replace(a, U=a.U + a.S, E=a.E + a.S, eb=z3.If(some, a.ebp if R.commit_takes_plan else a.eb, a.eb),
                             plan=z3.BoolVal(False), S=z3.IntVal(0))


def preempt(a: Agg, x: dict, R: EncRules):
    """A victim granted this step refunds x['ev'], its share of E."""
    ev = x["ev"]
    return [ev >= 0, ev <= a.E], replace(a, E=a.E - ev if R.preempt_refund_leaves else a.E, eb=a.eb + ev)


def unref(a: Agg, x: dict, R: EncRules):
    """An entry of x['n'] embeddings, referenced, loses its last reference."""
    n = x["n"]
    return [n >= 1, n <= a.U - a.FR], replace(a, FR=a.FR + n)


AGG_OPERATIONS: dict[str, Callable] = {"begin": begin, "hit": hit, "choose": choose, "commit": commit,
                                       "preempt": preempt, "unref": unref}


def agg_inputs(prefix: str = "X") -> dict:
    return {"n": z3.Int(f"{prefix}.n"), "k": z3.Int(f"{prefix}.k"), "ev": z3.Int(f"{prefix}.ev"),
            "unref": z3.Bool(f"{prefix}.unref")}


# --- the plan's loop over a request's items -------------------------------------------------


@dataclass(frozen=True)
class Win:
    c: Any  # the request's computed tokens the chunk starts from
    n: Any  # the chunk, as cut so far
    shift: Any  # the drafter's read-ahead (num_prefill_lookahead_tokens)
    unsplit: BoolTerm  # disable_chunked_mm_input
    cut: BoolTerm  # the loop broke
    nxt: Any  # handled items end at or before it, the others start at or after it
    og: Any  # the ghost item's offset
    lg: Any  # ... its length
    pg: BoolTerm  # ... handled
    ag: BoolTerm  # ... available: chosen, or found cached or repeated
    release: Release = DEFAULT  # the vLLM release whose window rule the plan applies


def reaches(w: Win, n) -> Any:
    """The chunk [c, c + n), not empty, overlaps the ghost item."""
    return z3.And(n > 0, w.og < w.c + n, w.og + w.lg > w.c)


def win_J(w: Win):
    return z3.And(w.c >= 0, w.n >= 0, w.shift >= 0, w.lg >= 1, w.og >= 0, w.nxt >= 0,
                  z3.Implies(z3.And(w.pg, reaches(w, w.n)), w.ag),
                  z3.Implies(w.pg, w.og + w.lg <= w.nxt), z3.Implies(z3.Not(w.pg), w.og >= w.nxt),
                  z3.Implies(w.cut, z3.Or(w.n == 0, w.nxt >= w.c + w.n)))


def plan_iteration(w: Win, x: dict, R: EncRules):
    """One item `f` (offset x['of'], length x['lf']), the ghost when x['isg'];
    x['found']: a hit or a repeat; x['fits']: can_allocate's answer.  Returns the
    premises, the next state and the iteration's facts."""
    of, lf, isg, found, fits = x["of"], x["lf"], x["isg"], x["found"], x["fits"]
    pre = [z3.Not(w.cut), lf >= 1, of >= w.nxt,
           z3.Implies(isg, z3.And(of == w.og, lf == w.lg, z3.Not(w.pg))),
           z3.Implies(z3.And(z3.Not(isg), z3.Not(w.pg)), w.og >= of + lf)]
    c, n = w.c, w.n
    inwin = z3.And(of < c + n + w.shift, of + lf > c)  # get_mm_features_in_window (S:2109-2116)
    # From 0.34.0 a chunk starting inside the item is held too, to nothing (S:2144-2161;
    # versions.MM_CHUNK_INSIDE_ITEM_WAITS); before, only one starting at or before it.
    starts = z3.BoolVal(True) if w.release.applies(MM_CHUNK_INSIDE_ITEM_WAITS) else c <= of
    unsplit = z3.And(inwin, w.unsplit, starts, c + n < of + lf)
    n_unsplit = z3.If(c < of, z3.If(of - c - w.shift > 0, of - c - w.shift, 0), 0) if R.unsplit_cut else n
    no_room = z3.And(inwin, z3.Not(unsplit), z3.Not(found), z3.Not(fits))
    stop = of - c + R.cut_margin
    n_no_room = z3.If(c < of, z3.If(n < stop, n, stop), 0 if R.nothing_inside_item else n)
    cut = z3.Or(unsplit, no_room)
    n2 = z3.If(unsplit, n_unsplit, z3.If(no_room, n_no_room, n))
    available = z3.And(inwin, z3.Not(cut))  # found, or chosen
    w2 = replace(w, n=n2, cut=cut, nxt=z3.If(cut, of, of + lf), pg=z3.If(isg, z3.Not(cut), w.pg),
                 ag=z3.If(isg, available, w.ag))
    return pre, w2, {"inwin": inwin, "unsplit": unsplit, "no_room": no_room, "available": available}


def win_inputs(prefix: str = "Y") -> dict:
    return {"of": z3.Int(f"{prefix}.of"), "lf": z3.Int(f"{prefix}.lf"), "isg": z3.Bool(f"{prefix}.isg"),
            "found": z3.Bool(f"{prefix}.found"), "fits": z3.Bool(f"{prefix}.fits")}


class EncVars:
    def __init__(self, release: Release):
        self.a = _fresh(Agg, "E.a")
        self.w = _fresh(Win, "E.w", release=release)
        self.x = agg_inputs()
        self.y = win_inputs()


def part_agg_entry(V: EncVars, R: EncRules):
    """A step starts with the whole budget, nothing encoded, no plan, and the cache as
    the last step left it (within its size, freeable slots within the used ones)."""
    a = V.a
    start = replace(a, eb=a.B, E=z3.IntVal(0), S=z3.IntVal(0), plan=z3.BoolVal(False))
    return [a.B >= 1, a.C >= 1, 0 <= a.FR, a.FR <= a.U, a.U <= a.C, a.ebp >= 0], agg_I(start)


def _agg_preserved(op: str):
    def build(V: EncVars, R: EncRules):
        pre, a2 = AGG_OPERATIONS[op](V.a, V.x, R)
        return [agg_I(V.a)] + pre, agg_I(a2)
    build.__name__ = f"part_{op}_preserved"
    return build


def exit_budget(V: EncVars, R: EncRules):
    """encoder_budget_respected: the standing grants encode at most B embeddings."""
    return [agg_I(V.a)], V.a.E <= V.a.B


def exit_capacity(V: EncVars, R: EncRules):
    """encoder_cache_within_capacity: the entries hold at most C embeddings."""
    return [agg_I(V.a)], V.a.U <= V.a.C


def part_win_entry(V: EncVars, R: EncRules):
    """The loop starts uncut with nothing handled: every item starts at or after 0."""
    w = V.w
    start = replace(w, cut=z3.BoolVal(False), nxt=z3.IntVal(0), pg=z3.BoolVal(False))
    return [w.c >= 0, w.n >= 0, w.shift >= 0, w.lg >= 1, w.og >= 0], win_J(start)


def part_win_preserved(V: EncVars, R: EncRules):
    pre, w2, _ = plan_iteration(V.w, V.y, R)
    return [win_J(V.w)] + pre, win_J(w2)


def exit_available(V: EncVars, R: EncRules):
    """encoder_inputs_available: when the loop ends (cut, or every item handled), and
    after the drafter's reserve shortens the chunk to any n2 <= n, every item the
    chunk reaches is available."""
    w = V.w
    n2 = z3.Int("E.n2")
    return [win_J(w), z3.Or(w.cut, w.pg), 0 <= n2, n2 <= w.n], z3.Implies(reaches(w, n2), w.ag)


AGG_INV = (("entry: the step's start", part_agg_entry),) + tuple(
    (f"{op}: preserved", _agg_preserved(op)) for op in AGG_OPERATIONS)

CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("encoder_budget_respected", AGG_INV + (("exit: E <= B", exit_budget),),
             ("encoder_budget_unchecked", "refund_kept_at_commit", "refunded_embeddings_kept"),
             "encoder inputs: a step's standing grants encode at most max_num_encoder_input_tokens embeddings, "
             "whatever the preemptions between a plan and its grant"),
    Claim("encoder_cache_within_capacity", AGG_INV + (("exit: U <= C", exit_capacity),),
             ("planned_items_not_counted", "referenced_entry_evicted"),
             "encoder inputs: the encoder cache's entries, referenced or freeable, hold at most encoder_cache_size "
             "embeddings"),
    Claim("encoder_inputs_available", (("entry: nothing handled", part_win_entry),
                                          ("iteration: preserved", part_win_preserved),
                                          ("exit: the chunk reaches available items only", exit_available)),
             ("cut_inside_item", "chunk_kept_inside_item", "unsplittable_item_split"),
             "encoder inputs: every item a chunk reaches is chosen to be encoded, found cached or repeated, for "
             "any number of items"),
)}


def discharge(claim: Claim, release: Release, variant: str = "correct",
              timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Every part proved, or the first refuted (claim_obligations.discharge_parts)."""
    return discharge_parts(claim, EncVars(release), ENC_VARIANTS[variant], timeout_s)


def vacuity(claim: Claim, release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Every part's premises are satisfiable, and the operations can do what the claims
    are about: a commit after a preemption refunded a victim, an eviction, a hit on a
    freeable entry; a chunk cut before an item, one cut to nothing inside an item, an
    unsplittable item, the ghost chosen and found."""
    t0 = time.perf_counter()
    rules = ENC_VARIANTS["correct"]
    V = EncVars(release)
    checks = [(name, build(V, rules)[0]) for name, build in claim.parts]
    a, x, w, y = V.a, V.x, V.w, V.y
    if claim.name == "encoder_inputs_available":
        pre, _, f = plan_iteration(w, y, rules)
        base = [win_J(w)] + pre
        checks += [("a chunk cut before an item", base + [f["no_room"], w.c < y["of"], y["of"] - w.c < w.n]),
                   ("a chunk cut to nothing inside an item", base + [f["no_room"], w.c > y["of"], w.n > 0]),
                   ("an unsplittable item", base + [f["unsplit"], w.n > 0]),
                   ("the ghost chosen", base + [y["isg"], f["available"], z3.Not(y["found"])]),
                   ("the ghost found", base + [y["isg"], f["available"], y["found"]])]
    else:
        pc, _ = commit(a, x, rules)
        checks += [("a commit after a refund", [agg_I(a)] + pc + [a.S > 0, a.eb > a.ebp + a.S]),
                   ("an eviction", [agg_I(a)] + choose(a, x, rules)[0] + [x["k"] > 0]),
                   ("a hit on a freeable entry", [agg_I(a)] + hit(a, x, rules)[0] + [x["unref"]]),
                   ("a refund", [agg_I(a)] + preempt(a, x, rules)[0] + [x["ev"] > 0])]
    return vacuity_result(checks, timeout_s, t0)


# --- witnesses and obligations ---------------------------------------------------------------------


def witness_scenario(release: Release):
    """Encoder inputs on a budget of 6 embeddings and a cache of 8: r0 and r1 share item
    "a", r1's chunk stops before its item "b", which the budget cannot take beside "a";
    later items evict freeable entries."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 32, "max_num_seqs": 4, "block_size": 4, "max_model_len": 64,
           "num_gpu_blocks": 40, "max_num_encoder_input_tokens": 6, "encoder_cache_size": 8}
    reqs = (RequestSpec(id="r0", prompt_len=10, max_tokens=2, mm_features=((2, 4, "a"),)),
            RequestSpec(id="r1", prompt_len=12, max_tokens=2, mm_features=((0, 4, "a"), (6, 4, "b"))),
            RequestSpec(id="r2", prompt_len=12, arrival_step=3, max_tokens=2, mm_features=((1, 5, "c"),)),
            RequestSpec(id="r3", prompt_len=9, arrival_step=4, max_tokens=2, mm_features=((0, 6, "d"),)))
    return Scenario(name="encoder-operations", config=release.scenario_config(cfg), requests=reqs, max_steps=40,
                    description=fixed_witness_description(
                        "encoder inputs: an item shared by two requests, a chunk cut before an item the budget "
                        "cannot take, and evictions (encoder:encoder_budget_respected, "
                        "encoder:encoder_cache_within_capacity, encoder:encoder_inputs_available)"))


def _budget_filled(t) -> bool:
    """A step whose items take the whole encoder budget."""
    total = sum(t.before.requests[rid].mm_features[i].length for rid, ids in t.output.scheduled_encoder_inputs
                for i in ids)
    return total == t.before.config.encoder_compute_budget


def _evicted(t) -> bool:
    return bool(t.output.free_encoder_mm_hashes)


def _cut_before_item(t) -> bool:
    """A chunk that ends where an item it did not encode, and that is not cached, starts."""
    encoded = dict(t.output.scheduled_encoder_inputs)
    for rid, n in t.output.num_scheduled_tokens:
        r = t.before.requests[rid]
        end = t.output.computed_on_admission(rid, r.num_computed_tokens) + n
        if end < r.num_tokens and any(f.offset == end and i not in encoded.get(rid, ())
                                      and f.identifier not in t.after.encoder_cache.cached
                                      for i, f in enumerate(r.mm_features)):
            return True
    return False


WITNESS_SHOWS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "encoder_budget_respected": ("a step whose items take the whole budget", _budget_filled),
    "encoder_cache_within_capacity": ("an entry evicted", _evicted),
    "encoder_inputs_available": ("a chunk cut before an item", _cut_before_item),
}


def witness(name: str, release: Release) -> tuple[Result, Any]:
    label, shows = WITNESS_SHOWS[name]
    return replay_witness(witness_scenario(release), name, label, shows)


def obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """`encoder:<name>` obligations for a release that has encoder inputs modelled
    (0.33.0, Release.models(versions.ENCODER_INPUTS)); none for the others."""
    if not release.models(versions.ENCODER_INPUTS):
        return []
    return claim_obligations(CLAIMS.values(), kind="encoder",
                             bound=Bound(None, None, 1, "any number of requests, items and cache entries"),
                             discharge=lambda claim, variant: discharge(claim, release, variant, timeout_s),
                             vacuity=lambda claim: vacuity(claim, release, timeout_s),
                             witness=lambda name: witness(name, release))
