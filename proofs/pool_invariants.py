"""Prefix caching's pool properties for ANY number of blocks and requests (z3).

With prefix caching the KV pool is kept block by block (spec/block_pool.py, P =
vllm/v1/core/block_pool.py, T = single_type_kv_cache_manager.py): reference
counts, block hashes, and the free queue in three parts, popped in this order:
`free_front` (freed blocks without a hash), the never-used blocks ("fresh"),
`free_back` (freed hashed blocks, least recently freed first).  A scheduler call
changes the pool only through four operations of `PoolWork`, each acting on one
block of one request `a` (the *acting* request):

- touch:   one prefix hit becomes a's next block (add_hits, T:273-329, P:774-792);
- pop:     the queue's head becomes a's next block, its hash evicted
           (allocate_new_blocks, P:681-722, 751-772);
- cache:   a's block at index j gets a's hash at j (cache_blocks, P:203-273);
- release: a's last block is released (free, tail first, T:596-604, P:799-839).

`add_hits` is touches in hit order, `allocate_new_blocks(k)` k pops, `cache_blocks`
one cache per new full block, `free` releases until a holds nothing.  The pool
invariant, stated for an arbitrary block `g` and an arbitrary request `x` (the
ghosts, as in loop_running.py), is shown to hold at a step's start (entry)
and to be preserved by each operation from any pool satisfying it; by induction
it holds after any sequence of operations, so after every step, for any number
of blocks and requests.  The step's start is where `prefix_hit_within_shared_prefix`
resets what is available: the hashes cached then.

**Per block** (`Blk`): ref_cnt (`ref`), the number of requests holding it (`H`,
a ghost: the count the property compares with), its queue part (`part`: 0 held,
1 front, 2 fresh, 3 back), whether it is hashed and with which hash id, whether
its hash is available this step (`av`), and its index in the acting request's
and the ghost request's block lists (`ha`/`ia`, `hx`/`ix`).  **Aggregates**
(`Pool`): num_free_blocks (`NF`), the sizes of the three parts, the lengths of
a's and x's lists.  Where an operation needs a count over blocks (the head is in
front only if front is not empty) the count is split as the target's share plus
the ghost's plus a non-negative rest, sound for any number of blocks.

**Hashes.**  A request's block hashes are a chain (each hashes its prefix), given
here only where used: `ra` / `rx`, the acting / ghost request's hash at the
block's index in its list, and `hn`, a's hash at its next index.  A touch takes
a block cached under `hn` (get_computed_blocks looks a's hashes up in order,
T:797-805), a cache gives a's block the hash at its index; the invariant says a
hashed block carries the hash of its index in every list that holds it, and an
unhashed held block has one holder (only hits share blocks, and hits are
hashed).  So a cache never changes a hash that some holder relies on, and never
needs a second entry in the hash map: the map (`BlockPool.cached`) is derived
from the blocks' hashes here, and that the spec's map is exactly that is a fact
of the abstraction, checked on every pool of the agreement test
(tests/test_proofs_pool_invariants.py).

`touch`, `pop`, `cache` and `release` are the encodings; the agreement test runs
the spec's `PoolWork` on the pools of prefix-caching runs, decomposes each call
into these operations, and compares every block's fields and the aggregates with
the encodings evaluated on the same values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import z3

from schedspec.spec.versions import UNHASHED_FREE_BLOCKS_FIRST

from .claim_obligations import Claim, claim_obligations, discharge_parts
from .obligation import Bound, Obligation, Result
from .release import DEFAULT, Release
from .solving import vacuity_result
from .witness_replay import fixed_witness_description, replay_witness

DEFAULT_TIMEOUT_S = 20.0
HELD, FRONT, FRESH, BACK = 0, 1, 2, 3


@dataclass(frozen=True)
class PoolRules:
    """The spec's rules ("correct") and known-bad changes, one rule each."""

    hit_leaves_queue: bool = True  # P:774-792: touching a free hit takes it out of the queue
    hit_is_cached: bool = True  # T:797-805: a hit is a block cached under the request's hash
    pop_evicts_hash: bool = True  # P:751-772: a popped block loses its hash
    release_decrements: bool = True  # T:596-604: free lowers each block's ref_cnt
    hashed_to_back: bool = True  # P:799-839: a freed hashed block goes to the back (LRU)
    free_counted: bool = True  # num_free_blocks rises by each block freed


POOL_VARIANTS: dict[str, PoolRules] = {
    "correct": PoolRules(),
    "hit_stays_in_queue": PoolRules(hit_leaves_queue=False),
    "hit_on_uncached_block": PoolRules(hit_is_cached=False),
    "pop_keeps_hash": PoolRules(pop_evicts_hash=False),
    "release_keeps_ref_cnt": PoolRules(release_decrements=False),
    "hashed_freed_to_front": PoolRules(hashed_to_back=False),
    "free_not_counted": PoolRules(free_counted=False),
}


BOOLS = frozenset({"hashed", "av", "ha", "hx", "xa"})


def _fresh(cls, prefix: str, **given):
    """A `cls` of fresh z3 symbols `prefix.field`, but the fields `given`."""
    return cls(**{f.name: (z3.Bool if f.name in BOOLS else z3.Int)(f"{prefix}.{f.name}") for f in fields(cls)
                  if f.name not in given}, **given)


@dataclass(frozen=True)
class Blk:
    """One block (module docstring)."""

    bid: Any
    ref: Any
    H: Any
    part: Any
    hsh: Any
    ia: Any
    ix: Any
    ra: Any
    rx: Any
    hashed: Any
    av: Any
    ha: Any
    hx: Any


@dataclass(frozen=True)
class Pool:
    NF: Any
    NFr: Any
    NFs: Any
    NBk: Any
    la: Any
    lx: Any
    hn: Any  # a's block hash at index la (its next block's), where it has one
    xa: Any  # the ghost request x is the acting request a
    release: Release = DEFAULT  # the vLLM release whose free-queue order the operations keep


@dataclass(frozen=True)
class Split:
    """Non-negative rests of the part counts beyond the target's and the ghost's share."""

    fr: Any
    fs: Any
    bk: Any


def order_applies(release: Release) -> bool:
    """Freed unhashed blocks go to the front, hashed ones to the back, from vLLM
    0.21 (versions.UNHASHED_FREE_BLOCKS_FIRST); 0.20.0 appends every freed block."""
    return release.applies(UNHASHED_FREE_BLOCKS_FIRST)


def pool_I(p: Pool):
    return z3.And(p.NF == p.NFr + p.NFs + p.NBk, p.NFr >= 0, p.NFs >= 0, p.NBk >= 0, p.la >= 0, p.lx >= 0,
                  z3.Implies(p.xa, p.lx == p.la))


def blk_J(p: Pool, g: Blk):
    """The per-block invariant (module docstring)."""
    if order_applies(p.release):
        order = z3.And(z3.Implies(g.part == BACK, g.hashed), z3.Implies(z3.Or(g.part == FRONT, g.part == FRESH),
                                                                         z3.Not(g.hashed)))
    else:  # 0.20.0: nothing freed goes to the front; never-used blocks have no hash
        order = z3.And(g.part != FRONT, z3.Implies(g.part == FRESH, z3.Not(g.hashed)))
    return z3.And(
        g.ref == g.H, g.ref >= 0, g.part >= HELD, g.part <= BACK, (g.part == HELD) == (g.ref >= 1), order,
        z3.Implies(g.part == FRONT, p.NFr >= 1), z3.Implies(g.part == FRESH, p.NFs >= 1),
        z3.Implies(g.part == BACK, p.NBk >= 1),
        z3.Implies(g.ha, z3.And(0 <= g.ia, g.ia < p.la)), z3.Implies(g.hx, z3.And(0 <= g.ix, g.ix < p.lx)),
        z3.Implies(p.xa, z3.And(g.hx == g.ha, z3.Implies(g.ha, z3.And(g.ix == g.ia, g.rx == g.ra)))),
        # H counts holders: a and x, when they are two requests, are two of them
        g.H >= z3.If(g.ha, 1, 0) + z3.If(z3.And(g.hx, z3.Not(p.xa)), 1, 0),
        # a hashed block carries each holder's hash at its index; an unhashed one has one holder
        z3.Implies(z3.And(g.hashed, g.ha), g.hsh == g.ra), z3.Implies(z3.And(g.hashed, g.hx), g.hsh == g.rx),
        z3.Implies(z3.Not(g.hashed), g.H <= 1),
        z3.Implies(g.hashed, g.av),
    )


def _same(a: Blk, b: Blk):
    return a.bid == b.bid


def _frame(p: Pool, g: Blk, t: Blk, sp: Split):
    """What holds of the ghost g and the operation's target t together."""
    eq = z3.And([getattr(g, f.name) == getattr(t, f.name) for f in fields(Blk)])
    share = lambda part: z3.If(t.part == part, 1, 0) + z3.If(z3.And(g.part == part, z3.Not(_same(g, t))), 1, 0)  # noqa: E731
    return [blk_J(p, t), z3.Implies(_same(g, t), eq), sp.fr >= 0, sp.fs >= 0, sp.bk >= 0,
            p.NFr == share(FRONT) + sp.fr, p.NFs == share(FRESH) + sp.fs, p.NBk == share(BACK) + sp.bk,
            # a list holds one block per index (for a and for x)
            z3.Implies(z3.And(g.ha, t.ha, g.ia == t.ia), _same(g, t)),
            z3.Implies(z3.And(g.hx, t.hx, g.ix == t.ix), _same(g, t))]


def _counts(p: Pool, part, delta):
    """The part counts with `delta` added to the count of `part` (a term)."""
    return (p.NFr + z3.If(part == FRONT, delta, 0), p.NFs + z3.If(part == FRESH, delta, 0),
            p.NBk + z3.If(part == BACK, delta, 0))


def _joins_a(p: Pool, b: Blk):
    """b becomes a's block at index la, whose hash in a's chain is hn (and x's, when x is a)."""
    return replace(b, ha=z3.BoolVal(True), ia=p.la, ra=p.hn, hx=z3.Or(b.hx, p.xa), ix=z3.If(p.xa, p.la, b.ix),
                   rx=z3.If(p.xa, p.hn, b.rx))


def touch(p: Pool, g: Blk, t: Blk, sp: Split, rules: PoolRules = PoolRules()):
    """One prefix hit t becomes a's next block; a free hit leaves the queue (P:774-792).
    Returns (frame, premises, pool, ghost, facts)."""
    # get_computed_blocks: a block cached under a's hash at the index it takes,
    # which a does not hold yet (hits are distinct blocks)
    pre = [z3.Not(t.ha)] + ([t.hashed, t.hsh == p.hn] if rules.hit_is_cached else [])
    was_free = t.part != HELD
    leaves = z3.And(was_free, rules.hit_leaves_queue)
    fr, fs, bk = _counts(p, t.part, z3.If(leaves, -1, 0))
    p2 = replace(p, NF=p.NF - z3.If(leaves, 1, 0), NFr=fr, NFs=fs, NBk=bk, la=p.la + 1,
                 lx=p.lx + z3.If(p.xa, 1, 0))
    t2 = _joins_a(p, replace(t, ref=t.ref + 1, H=t.H + 1, part=z3.If(leaves, HELD, t.part)))
    g2 = z3_blk_if(_same(g, t), t2, g)
    return _frame(p, g, t, sp), pre, p2, g2, {"free_hit": was_free, "hashed": t.hashed, "av": t.av}


def pop(p: Pool, g: Blk, t: Blk, sp: Split, rules: PoolRules = PoolRules()):
    """The queue's head t becomes a's next block, its hash evicted (P:681-722, 751-772)."""
    head = z3.Or(t.part == FRONT, z3.And(t.part == FRESH, p.NFr == 0), z3.And(t.part == BACK, p.NFr == 0, p.NFs == 0))
    pre = [head]
    fr, fs, bk = _counts(p, t.part, -1)
    p2 = replace(p, NF=p.NF - 1, NFr=fr, NFs=fs, NBk=bk, la=p.la + 1, lx=p.lx + z3.If(p.xa, 1, 0))
    t2 = _joins_a(p, replace(t, ref=t.ref + 1, H=t.H + 1, part=z3.IntVal(HELD),
                             hashed=z3.BoolVal(False) if rules.pop_evicts_hash else t.hashed))
    g2 = z3_blk_if(_same(g, t), t2, g)
    return _frame(p, g, t, sp), pre, p2, g2, {"evicts": t.hashed, "from": t.part}


def cache(p: Pool, g: Blk, t: Blk, sp: Split, rules: PoolRules = PoolRules()):
    """a's block t gets a's hash at its index (t.ra), now available (P:203-273); a
    block already hashed keeps its hash (the same, by the invariant)."""
    pre = [t.ha]
    t2 = replace(t, hashed=z3.BoolVal(True), hsh=z3.If(t.hashed, t.hsh, t.ra), av=z3.Or(t.av, z3.Not(t.hashed)))
    g2 = z3_blk_if(_same(g, t), t2, g)
    return _frame(p, g, t, sp), pre, p, g2, {"new": z3.Not(t.hashed)}


def release_tail(p: Pool, g: Blk, t: Blk, sp: Split, rules: PoolRules = PoolRules()):
    """a's last block t is released; at ref_cnt 0 it joins the queue, hashed at the
    back, else at the front (P:799-839; 0.20.0 always at the back)."""
    pre = [t.ha, t.ia == p.la - 1]
    dec = 1 if rules.release_decrements else 0
    freed = t.ref - dec == 0
    if order_applies(p.release):
        to = z3.If(z3.And(t.hashed, rules.hashed_to_back), BACK, FRONT)
    else:
        to = z3.IntVal(BACK)
    fr, fs, bk = _counts(p, to, z3.If(freed, 1, 0))
    p2 = replace(p, NF=p.NF + z3.If(z3.And(freed, rules.free_counted), 1, 0), NFr=fr, NFs=fs, NBk=bk,
                 la=p.la - 1, lx=p.lx - z3.If(p.xa, 1, 0))
    t2 = replace(t, ref=t.ref - dec, H=t.H - 1, part=z3.If(freed, to, HELD), ha=z3.BoolVal(False),
                 hx=z3.And(t.hx, z3.Not(p.xa)))
    g2 = z3_blk_if(_same(g, t), t2, g)
    return _frame(p, g, t, sp), pre, p2, g2, {"freed": freed, "hashed": t.hashed}


def z3_blk_if(c, a: Blk, b: Blk) -> Blk:
    return Blk(**{f.name: z3.If(c, getattr(a, f.name), getattr(b, f.name)) for f in fields(Blk)})


OPERATIONS: dict[str, Callable] = {"touch": touch, "pop": pop, "cache": cache, "release": release_tail}


class PoolVars:
    def __init__(self, release: Release):
        self.p = _fresh(Pool, "P.p", release=release)
        self.g = _fresh(Blk, "P.g")
        self.t = _fresh(Blk, "P.t")
        self.sp = _fresh(Split, "P.sp")

    def run(self, op: str, rules: PoolRules):
        return OPERATIONS[op](self.p, self.g, self.t, self.sp, rules)


def _pre(V: PoolVars):
    return [pool_I(V.p), blk_J(V.p, V.g)]


def part_entry(V: PoolVars, R: PoolRules):
    """At a step's start what is available is what is cached (the property resets
    it): a pool satisfying the invariant but for `av` satisfies it with av = hashed."""
    g = V.g
    return [pool_I(V.p), blk_J(V.p, replace(g, av=z3.BoolVal(True)))], blk_J(V.p, replace(g, av=g.hashed))


def _preserved(op: str):
    def build(V: PoolVars, R: PoolRules):
        frame, pre, p2, g2, _ = V.run(op, R)
        return _pre(V) + frame + pre, z3.And(pool_I(p2), blk_J(p2, g2))
    build.__name__ = f"part_{op}_preserved"
    return build


def exit_ref_counts(V: PoolVars, R: PoolRules):
    """block_ref_counts_match_holders: every block's ref_cnt is its number of
    holders; a request freed to the end (la == 0, as finish and preemption leave
    it) holds no block."""
    g, p = V.g, V.p
    return _pre(V), z3.And(g.ref == g.H, z3.Implies(p.la == 0, z3.Not(g.ha)))


def exit_partitioned(V: PoolVars, R: PoolRules):
    """kv_pool_partitioned: a block is held or in the queue, not both; the queue's
    length is num_free_blocks; from 0.21 cached free blocks sit behind uncached ones
    (the back holds hashed blocks only, front and fresh unhashed ones)."""
    g, p = V.g, V.p
    goal = [(g.part == HELD) == (g.ref >= 1), p.NF == p.NFr + p.NFs + p.NBk, p.NF >= 0]
    if order_applies(V.p.release):
        goal += [z3.Implies(g.part == BACK, g.hashed), z3.Implies(g.part != BACK, z3.Or(g.part == HELD,
                                                                                      z3.Not(g.hashed)))]
    return _pre(V), z3.And(goal)


def iter_hit_available(V: PoolVars, R: PoolRules):
    """prefix_hit_within_shared_prefix: a hit is a block whose hash was cached at
    the step's start or by an earlier grant of the step (available)."""
    frame, pre, _, _, facts = V.run("touch", R)
    return _pre(V) + frame + pre, facts["av"]


def lookup_length(run, num_tokens, block_size):
    """How many hits the lookup returns: the request's cached hashes from the start
    (`run` of them before the first uncached one), over at most (num_tokens - 1)
    // block_size blocks, so that a token is left to compute (K:318-329,
    T:797-805).  The agreement test evaluates it on every lookup of the spec."""
    cap = (num_tokens - 1) / block_size
    return z3.If(run < cap, run, cap)


def lemma_hit_length(V: PoolVars, R: PoolRules):
    """... and the lookup's k hit blocks are whole blocks leaving a token to compute."""
    k, run, nt, bs = z3.Ints("P.k P.run P.nt P.bs")
    return [bs >= 1, nt >= 1, run >= 0, k == lookup_length(run, nt, bs)], z3.And(k * bs <= nt - 1, k * bs >= 0)


INV = (("entry: available = cached at the step's start", part_entry),) + tuple(
    (f"{op}: preserved", _preserved(op)) for op in OPERATIONS)

CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("block_ref_counts_match_holders", INV + (("exit: ref_cnt = holders", exit_ref_counts),),
              ("release_keeps_ref_cnt", "hit_stays_in_queue"),
              "prefix caching: every block's ref_cnt is the number of requests holding it; a freed request holds "
              "none"),
    Claim("kv_pool_partitioned", INV + (("exit: held xor free, queue length, order", exit_partitioned),),
              ("hit_stays_in_queue", "pop_keeps_hash", "hashed_freed_to_front", "free_not_counted"),
              "prefix caching: held and free blocks partition the pool, num_free_blocks is the queue's length, "
              "cached free blocks behind uncached ones (from 0.21)"),
    Claim("prefix_hit_within_shared_prefix", INV + (
        ("iteration: a hit's hash was available", iter_hit_available),
        ("lemma: hits are whole blocks leaving a token", lemma_hit_length)),
        ("hit_on_uncached_block", "pop_keeps_hash"),
        "prefix caching: a hit is whole blocks leaving a token to compute, each cached at the step's start or by "
        "an earlier grant of the step"),
)}


def discharge(claim: Claim, release: Release, variant: str = "correct",
              timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Every part proved, or the first refuted (claim_obligations.discharge_parts)."""
    return discharge_parts(claim, PoolVars(release), POOL_VARIANTS[variant], timeout_s)


def vacuity(claim: Claim, release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> Result:
    """Every part's premises are satisfiable, and the operations can do what the
    claims are about: a free hit leaving the queue, a held one shared, a pop
    from each part (from the back evicting a hash), a new hash, a release that
    frees a hashed block and one that frees an unhashed one, one that leaves the
    block held by another request; each with the ghost a different block and the
    same block, and x the acting request and another."""
    t0 = time.perf_counter()
    rules = POOL_VARIANTS["correct"]
    V = PoolVars(release)
    checks = []
    for name, build in claim.parts:
        premises, _ = build(V, rules)
        checks.append((name, premises))
    p, g, t = V.p, V.g, V.t

    def op(name, *extra):
        frame, pre, _, _, facts = V.run(name, rules)
        return _pre(V) + frame + pre, facts

    tc, tf = op("touch")
    checks += [("a free hit leaves the queue", tc + [tf["free_hit"], z3.Not(_same(g, t)), g.part == BACK]),
               ("a held hit is shared", tc + [z3.Not(tf["free_hit"]), t.H >= 1, z3.Not(p.xa), t.hx])]
    pc, pf = op("pop")
    checks += [("a pop of a never-used block", pc + [t.part == FRESH]),
               ("a pop from the back evicting a hash", pc + [t.part == BACK, pf["evicts"]])]
    if order_applies(V.p.release):  # 0.20.0 frees nothing to the front
        checks.append(("a pop from the front", pc + [t.part == FRONT, g.part == FRONT, z3.Not(_same(g, t))]))
    cc, cf = op("cache")
    checks += [("a new hash", cc + [cf["new"], p.xa]), ("a hash kept", cc + [z3.Not(cf["new"])])]
    rc, rf = op("release")
    checks += [("a hashed block freed", rc + [rf["freed"], rf["hashed"], _same(g, t)]),
               ("an unhashed block freed", rc + [rf["freed"], z3.Not(rf["hashed"])]),
               ("a block released that another request still holds", rc + [z3.Not(rf["freed"]), t.hx,
                                                                            z3.Not(p.xa)])]
    return vacuity_result(checks, timeout_s, t0)


# --- witnesses and obligations ---------------------------------------------------------------------


def witness_scenario(release: Release):
    """Prefix caching on a pool of 8 usable blocks (block_size 2): r1 shares r0's
    four prefix blocks while both run; r2 takes the last blocks, evicting cached
    ones; r3, of r0's prefix group, hits the cached blocks still in the queue
    (found by a small search over the spec, kept so the witness is the same every run)."""
    from schedspec.reference.scenario import RequestSpec, Scenario

    cfg = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 2, "max_model_len": 16,
           "num_gpu_blocks": 9, "async_scheduling": False, "enable_prefix_caching": True}
    reqs = (RequestSpec(id="r0", prompt_len=9, max_tokens=4, prefix_group="A", prefix_len=8),
            RequestSpec(id="r1", prompt_len=9, arrival_step=1, max_tokens=4, prefix_group="A", prefix_len=8),
            RequestSpec(id="r2", prompt_len=6, arrival_step=2, max_tokens=3),
            RequestSpec(id="r3", prompt_len=9, arrival_step=5, max_tokens=2, prefix_group="A", prefix_len=8))
    return Scenario(name="pool-operations", config=release.scenario_config(cfg), requests=reqs, max_steps=40,
                    description=fixed_witness_description(
                        "prefix caching, a block shared by two requests, an eviction, and a hit on a cached block "
                        "in the free queue (pool:block_ref_counts_match_holders, pool:kv_pool_partitioned, "
                        "pool:prefix_hit_within_shared_prefix)"))


def _shared(t) -> bool:
    return any(v >= 2 for v in t.after.block_pool.ref_cnt.values())


def _evicted(t) -> bool:
    before, after = t.before.block_pool, t.after.block_pool
    return any(b in before.block_hash and b not in before.ref_cnt and after.block_hash.get(b) != before.block_hash[b]
               for b in after.ref_cnt)


def _free_hit(t) -> bool:
    before, after = t.before.block_pool, t.after.block_pool
    bs = t.before.config.block_size
    return any(h > 0 and any(b not in before.ref_cnt for b in after.req_to_blocks.get(rid, ())[:h // bs])
               for rid, h in t.output.prefix_hits)


WITNESS_SHOWS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "block_ref_counts_match_holders": ("a block held by two requests", _shared),
    "kv_pool_partitioned": ("a cached block evicted from the queue", _evicted),
    "prefix_hit_within_shared_prefix": ("a hit on cached blocks in the free queue", _free_hit),
}


def witness(name: str, release: Release) -> tuple[Result, Any]:
    label, shows = WITNESS_SHOWS[name]
    return replay_witness(witness_scenario(release), name, label, shows)


def obligations(release: Release, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obligation]:
    """`pool:<name>` obligations: each claim for any number of blocks and requests;
    the witness is the vacuity check plus the fixed scenario replayed on the spec."""
    return claim_obligations(CLAIMS.values(), kind="pool",
                             bound=Bound(None, None, 1, "any number of blocks and requests; prefix caching on"
                                         + ("" if order_applies(release) else "; 0.20.0: no free-queue order")),
                             discharge=lambda claim, variant: discharge(claim, release, variant, timeout_s),
                             vacuity=lambda claim: vacuity(claim, release, timeout_s),
                             witness=lambda name: witness(name, release))
