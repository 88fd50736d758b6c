"""The pool-operation encodings (proofs/pool_invariants.py) agree with the spec.

Prefix-caching scenarios of the campaign generator run on the spec with every
call of `PoolWork` recorded: `add_hits`, `allocate_new_blocks`, `cache_blocks`
and `free`, with the pool before and after.  Each call is cut into the
encodings' one-block operations (a touch per hit, a pop per new block, a cache
per full block without a hash, a release per block, tail first), by what the
call was asked to do and the pool before it, never by the spec's answer; the
encodings are
evaluated on the abstraction of the pool before the call, one operation after
the other, and after the last one every tracked block's fields and the
aggregates must be the abstraction of the spec's pool after the call.  Before
each operation its premises (the head is popped, a hit is cached under the
request's hash at its index, ...), the invariant and the frame must evaluate to
true: what the proofs assume of an operation is true of the spec's.  Every pool
of the corpus must also satisfy the abstraction's own facts: the hash map is
exactly the blocks' hashes, each free block is once in the queue.  Each
lookup's hit count must be the encoding's `lookup_length`.  Mutants of the
encodings (POOL_VARIANTS that change an effect) must make the comparison fail.
"""

from __future__ import annotations

import dataclasses
import os
import random
import weakref
from dataclasses import fields

import pytest
import z3

from schedspec.proofs import pool_invariants as PI
from schedspec.proofs.release import DEFAULT, Release
from schedspec.proofs.symbolic import Evaluator, const_val
from schedspec.reference.engine import run_scenario
from schedspec.reference.generator import generate_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.spec.block_pool import PoolWork
from schedspec.spec.versions import DEFAULT_RELEASE
from schedspec.spec.config import config_as_given

# The generator's seeds 7000 + i: the first 20, and 7024, where a preempted request
# resumes without a hit (its num_cached_block must start again from 0).
SEEDS = tuple(range(20)) + (24,)


# --- recording the spec's pool calls --------------------------------------------------------------


def snap(w: PoolWork) -> dict:
    """A concrete pool, as plain values."""
    return {"front": list(w.front), "fresh": list(range(w.next_fresh, w.num_gpu_blocks)), "back": list(w.back),
            "ref": dict(w.ref_cnt), "hash": dict(w.block_hash), "cached": {h: tuple(b) for h, b in w.cached.items()},
            "lists": {r: tuple(b) for r, b in w.req_to_blocks.items()}, "NF": w.num_free_blocks,
            "ncached": dict(w.num_cached_block),
            "blocks": w.num_gpu_blocks}


class Recorder:
    """Wraps PoolWork's four calls (and the lookup before add_hits) while a scenario runs."""

    def __init__(self):
        self.calls: list[dict] = []
        self.known: dict[str, tuple] = {}  # each request's longest known block-hash chain
        # per PoolWork (one scheduler call): the hashes cached at its start and hashed since
        self.available: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.lookup: list = []
        self.lookups: list[dict] = []  # every lookup: the cached run, its arguments, how many hits
        self.scenario = 0

    def _avail(self, w):
        if w not in self.available:
            self.available[w] = set(w.cached)
        return self.available[w]

    def install(self, monkeypatch):
        rec = self
        orig = {n: getattr(PoolWork, n) for n in ("get_computed_blocks", "add_hits", "allocate_new_blocks",
                                                  "cache_blocks", "free")}

        def get_computed_blocks(self, block_hashes, num_tokens, block_size):
            rec.lookup = list(block_hashes)
            hits = orig["get_computed_blocks"](self, block_hashes, num_tokens, block_size)
            run = next((i for i, h in enumerate(block_hashes) if not self.cached.get(h)), len(block_hashes))
            rec.lookups.append({"run": run, "num_tokens": num_tokens, "block_size": block_size, "hits": len(hits)})
            return hits

        def wrap(name):
            def call(self, rid, *args):
                avail = set(rec._avail(self))
                if name == "cache_blocks" and len(args[0]) > len(rec.known.get(rid, ())):
                    rec.known[rid] = tuple(args[0])
                if name == "add_hits" and len(rec.lookup) > len(rec.known.get(rid, ())):
                    rec.known[rid] = tuple(rec.lookup)
                before = snap(self)
                out = orig[name](self, rid, *args)
                after = snap(self)
                if name == "cache_blocks":
                    rec._avail(self).update(after["hash"].values())
                rec.calls.append({"name": name, "rid": rid, "args": args, "before": before, "after": after,
                                  "available": avail, "known": dict(rec.known), "scenario": rec.scenario})
                return out
            return call

        monkeypatch.setattr(PoolWork, "get_computed_blocks", get_computed_blocks)
        for n in ("add_hits", "allocate_new_blocks", "cache_blocks", "free"):
            monkeypatch.setattr(PoolWork, n, wrap(n))


# The records are the spec's own outputs, so they are kept per mutant under test:
# mutmut runs the clean tests in its main process and forks each mutant's run from
# it, and a record of the unmutated spec's calls, inherited, would let every mutant
# of block_pool.py pass the comparison unseen.  The lookups are checked in the test
# that records them: mutmut runs, for a mutant, only the tests that reached its
# function in its stats run, and a test that read another test's record reached none.
_RECORDS: dict = {}


def record(vllm_release: str = DEFAULT_RELEASE) -> tuple[list[dict], list[dict]]:
    """The pool calls and the lookups of the SEEDS' prefix-caching scenarios of a
    release (drawn once per release and mutant under test, kept)."""
    key = (vllm_release, os.environ.get("MUTANT_UNDER_TEST", ""))
    if key not in _RECORDS:
        mp = pytest.MonkeyPatch()
        rec = Recorder()
        rec.install(mp)
        try:
            for i in SEEDS:
                sc = generate_scenario(random.Random(7000 + i), i, flags=((True, False), (True, True)),
                                       release=vllm_release)
                sc = dataclasses.replace(sc, config={**config_as_given(sc.config), "vllm_version": vllm_release})
                if sc.scheduler_config().num_gpu_blocks > 200:
                    continue  # small pools: evictions, and few blocks to evaluate
                rec.known.clear()  # request ids repeat from scenario to scenario
                rec.scenario = i
                run_scenario(sc, SpecScheduler())
        finally:
            mp.undo()
        _RECORDS[key] = (rec.calls, rec.lookups)
    return _RECORDS[key]


def recorded_calls(vllm_release: str = DEFAULT_RELEASE) -> list[dict]:
    return record(vllm_release)[0]


def recorded_lookups(vllm_release: str = DEFAULT_RELEASE) -> list[dict]:
    return record(vllm_release)[1]


# --- the abstraction ------------------------------------------------------------------------------


class Ids:
    """Block hashes (bytes) as small integers; unknown chain positions get fresh negative ids."""

    def __init__(self):
        self.ids: dict = {}

    def __call__(self, h) -> int:
        return self.ids.setdefault(h, len(self.ids) + 1)


def part_of(s: dict, b: int) -> int:
    if s["ref"].get(b, 0) > 0:
        return PI.HELD
    return PI.FRONT if b in s["front"] else PI.FRESH if b in s["fresh"] else PI.BACK if b in s["back"] else -1


def chain_id(ids: Ids, known: dict, rid, i: int) -> int:
    chain = known.get(rid, ())
    return ids(chain[i]) if 0 <= i < len(chain) else -1000 - i


def abstract_block(s: dict, b: int, a, x, ids: Ids, known: dict, available: set) -> dict:
    la_list, lx_list = s["lists"].get(a, ()), s["lists"].get(x, ())
    h = s["hash"].get(b)
    ia = la_list.index(b) if b in la_list else -1
    ix = lx_list.index(b) if b in lx_list else -1
    return dict(bid=b, ref=s["ref"].get(b, 0), H=sum(b in blocks for blocks in s["lists"].values()),
                part=part_of(s, b), hsh=ids(h) if h is not None else 0, ia=ia, ix=ix,
                ra=chain_id(ids, known, a, ia), rx=chain_id(ids, known, x, ix),
                hashed=h is not None, av=h is not None and h in available, ha=ia >= 0, hx=ix >= 0)


def abstract_pool(s: dict, a, x, hn: int) -> dict:
    return dict(NF=s["NF"], NFr=len(s["front"]), NFs=len(s["fresh"]), NBk=len(s["back"]),
                la=len(s["lists"].get(a, ())), lx=len(s["lists"].get(x, ())), hn=hn, xa=a == x)


def abstraction_facts(s: dict) -> list[str]:
    """What the abstraction takes for granted of a concrete pool."""
    bad = []
    queue = s["front"] + s["fresh"] + s["back"]
    if len(queue) != len(set(queue)) or any(s["ref"].get(b, 0) for b in queue):
        bad.append("a free block twice in the queue, or a held one in it")
    derived: dict = {}
    for b, h in s["hash"].items():
        derived.setdefault(h, set()).add(b)
    if {h: set(bs) for h, bs in s["cached"].items()} != derived:
        bad.append("the hash map is not the blocks' hashes")
    if any(len(set(bs)) != len(bs) for bs in s["lists"].values()):
        bad.append("a request holds a block twice")
    return bad


# --- the z3 side ----------------------------------------------------------------------------------


class OpEval:
    """One operation over fresh symbols for a variant, packed for evaluation: the
    premises (frame, op premises, invariant of g and the pool) and the results."""

    def __init__(self, op: str, variant: str, release: Release):
        V = self.V = PI.PoolVars(release)
        frame, pre, p2, g2, _ = V.run(op, PI.POOL_VARIANTS[variant])
        self.names_p = [f.name for f in fields(PI.Pool) if f.name != "release"]
        self.names_b = [f.name for f in fields(PI.Blk)]
        terms = [z3.And(*frame), z3.And(*pre), PI.pool_I(V.p), PI.blk_J(V.p, V.g)]
        terms += [getattr(p2, n) for n in self.names_p] + [getattr(g2, n) for n in self.names_b]
        self.ev = Evaluator(terms)

    def __call__(self, p: dict, g: dict, t: dict, sp: dict):
        pairs = []
        for rec, vals in ((self.V.p, p), (self.V.g, g), (self.V.t, t), (self.V.sp, sp)):
            for name, val in vals.items():
                pairs.append((getattr(rec, name), const_val(val)))
        out = self.ev(pairs)
        n = len(self.names_p)
        return out[:4], dict(zip(self.names_p, out[4:4 + n])), dict(zip(self.names_b, out[4 + n:]))


_EVALS: dict = {}


def op_eval(op: str, variant: str, release: Release) -> OpEval:
    key = (op, variant, release)  # the free-queue order depends on the release
    if key not in _EVALS:
        _EVALS[key] = OpEval(op, variant, release)
    return _EVALS[key]


def split(p: dict, blocks: dict, g: int, t: int) -> dict:
    def share(part):
        return (blocks[t]["part"] == part) + (blocks[g]["part"] == part and g != t)
    return dict(fr=p["NFr"] - share(PI.FRONT), fs=p["NFs"] - share(PI.FRESH), bk=p["NBk"] - share(PI.BACK))


def operations(call: dict, ids: Ids) -> list[tuple[str, int, int]]:
    """(operation, target block, hn) for the one-block operations a call is made of."""
    b, a = call["before"], call["after"]
    rid = call["rid"]
    known = call["known"]
    if call["name"] == "add_hits":
        hits = list(call["args"][0])
        return [("touch", blk, chain_id(ids, known, rid, i)) for i, blk in enumerate(hits)]
    if call["name"] == "allocate_new_blocks":
        start = len(b["lists"].get(rid, ()))
        new = a["lists"].get(rid, ())[start:]
        return [("pop", blk, chain_id(ids, known, rid, start + i)) for i, blk in enumerate(new)]
    if call["name"] == "cache_blocks":
        # every full block of the request, by the call's arguments, that has no hash
        # yet: cut from what the call is asked to do and the pool before it, never
        # from what the spec did (its num_cached_block after the call)
        block_hashes, num_tokens, block_size = call["args"]
        num_full = min(num_tokens, len(block_hashes) * block_size) // block_size
        blocks = b["lists"].get(rid, ())
        return [("cache", blk, 0) for blk in blocks[:num_full] if blk not in b["hash"]]
    if call["name"] == "free":
        return [("release", blk, 0) for blk in reversed(b["lists"].get(rid, ()))]
    raise AssertionError(call["name"])


def compare_call(call: dict, variant: str = "correct", ids: Ids | None = None, stats=None, turn: int = 0,
                 release: Release = DEFAULT) -> list:
    """The encodings composed over one recorded call against the spec's pool after
    it.  The ghost request x is the acting one or, every other call (`turn`),
    another request holding blocks; before each operation the ghost block is the
    target (its effect) and, in turn, another tracked block (the frame, and that
    the operation leaves it unchanged).  Every tracked block is compared at the end."""
    ids = ids or Ids()
    before, after, rid = call["before"], call["after"], call["rid"]
    bad = [f"{call['name']} before: {m}" for m in abstraction_facts(before)]
    bad += [f"{call['name']} after: {m}" for m in abstraction_facts(after)]
    ops = operations(call, ids)
    if not ops:
        return bad
    others = [r for r, bl in before["lists"].items() if r != rid and bl]
    x = others[0] if others and turn % 2 else rid
    targets = [t for _, t, _ in ops]
    extra = [before["front"][:1], before["fresh"][:1], before["back"][:1],
             [blk for r in others[:1] for blk in before["lists"][r][:1]]]
    tracked = list(dict.fromkeys(targets + [blk for e in extra for blk in e]))
    blocks = {blk: abstract_block(before, blk, rid, x, ids, call["known"], call["available"]) for blk in tracked}
    p = abstract_pool(before, rid, x, 0)
    for k, (op, t, hn) in enumerate(ops):
        p = dict(p, hn=hn)
        ev = op_eval(op, variant, release)
        others_g = [g for g in tracked if g != t]
        ghosts = [t] + ([others_g[(turn + k) % len(others_g)]] if others_g else [])
        new_p, new_t = None, None
        for g in ghosts:
            (frame, pre, inv_i, inv_j), p2, g2 = ev(p, blocks[g], blocks[t], split(p, blocks, g, t))
            if not (frame and pre and inv_i and inv_j):
                bad.append(("assumption false", call["name"], op, t, g, dict(frame=frame, pre=pre, I=inv_i, J=inv_j)))
                return bad
            if g == t:
                new_p, new_t = p2, g2
            elif g2 != blocks[g]:
                bad.append(("another block changed", call["name"], op, t, g, g2, blocks[g]))
        blocks[t], p = new_t, new_p
        if stats is not None:
            key = op + {"touch": " of a free block" if before["ref"].get(t, 0) == 0 else " of a held block",
                        "pop": f" from part {part_of(before, t)}",
                        "release": " freeing it" if after["ref"].get(t, 0) == 0 else " leaving it held",
                        "cache": ""}[op]
            stats[key] = stats.get(key, 0) + 1
            if x != rid:
                stats["with another ghost request"] = stats.get("with another ghost request", 0) + 1
    exp_p = abstract_pool(after, rid, x, p["hn"])
    for name, val in exp_p.items():
        if p[name] != val:
            bad.append(("pool", call["name"], x, name, p[name], val))
    for g in tracked:
        exp = abstract_block(after, g, rid, x, ids, call["known"], call["available"] | set(after["hash"].values()))
        for name, val in exp.items():
            if name in ("ia", "ra") and not exp["ha"] or name in ("ix", "rx") and not exp["hx"]:
                continue  # a list position means something only in the list
            if name in ("av", "hsh") and not exp["hashed"]:
                continue  # what is available matters only of a hashed block
            if blocks[g][name] != val:
                bad.append(("block", call["name"], x, g, name, blocks[g][name], val))
    return bad


def resumptions_without_a_hit(calls: list[dict]) -> int:
    """New blocks for a request that holds none, after a free of it with cached
    blocks, in the same scenario and with no hit between: a resumption that must
    hash its blocks from index 0 again."""
    freed: set = set()
    count = 0
    for c in calls:
        key = (c["scenario"], c["rid"])
        if c["name"] == "free" and c["before"]["ncached"].get(c["rid"], 0) > 0:
            freed.add(key)
        elif c["name"] == "add_hits":
            freed.discard(key)
        elif c["name"] == "allocate_new_blocks" and key in freed and not c["before"]["lists"].get(c["rid"]):
            freed.discard(key)
            count += 1
    return count


def test_pool_operations_agree_with_spec():
    stats: dict = {}
    calls = recorded_calls()
    ids = Ids()
    found = []
    for turn, call in enumerate(calls):
        found += compare_call(call, ids=ids, stats=stats, turn=turn)
        assert not found, found[:3]
    stats["resumption without a hit"] = resumptions_without_a_hit(calls)
    check_lookup_lengths(recorded_lookups())
    # Every kind of operation the claims are about happened on the spec.
    for key, least in (("touch of a free block", 20), ("touch of a held block", 20), ("pop from part 1", 20),
                       ("pop from part 2", 20), ("pop from part 3", 20), ("cache", 100), ("release freeing it", 100),
                       ("release leaving it held", 20), ("resumption without a hit", 1)):
        assert stats.get(key, 0) >= least, (key, stats)


def check_lookup_lengths(lookups: list[dict]) -> None:
    """The hit count `lemma_hit_length` assumes (the cached run from the start,
    capped to leave a token) is the spec's on every lookup of the corpus, among
    them lookups where the cap binds and where an uncached hash ends the run, at
    num_tokens a multiple of block_size and one past it."""
    run, nt, bs = z3.Ints("run nt bs")
    term = PI.lookup_length(run, nt, bs)
    seen = {"an uncached hash ends it": 0, "the cap binds at num_tokens = k * block_size": 0,
            "the cap binds at num_tokens = k * block_size + 1": 0}
    for lk in lookups:
        want = z3.substitute(term, (run, z3.IntVal(lk["run"])), (nt, z3.IntVal(lk["num_tokens"])),
                             (bs, z3.IntVal(lk["block_size"])))
        assert z3.simplify(want).as_long() == lk["hits"], lk
        cap, rest = divmod(lk["num_tokens"] - 1, lk["block_size"])
        if 0 < lk["run"] < cap:
            seen["an uncached hash ends it"] += 1
        elif lk["run"] >= cap > 0 and rest in (lk["block_size"] - 1, 0):
            seen[f"the cap binds at num_tokens = k * block_size{' + 1' if rest == 0 else ''}"] += 1
    assert all(n > 0 for n in seen.values()), seen


def test_pool_operations_agree_with_spec_0_20():
    """vLLM 0.20.0 appends every freed block to the queue's back: the release
    operation of that release against the spec's pool of that release."""
    stats: dict = {}
    ids = Ids()
    for turn, call in enumerate(recorded_calls("0.20.0")):
        found = compare_call(call, ids=ids, stats=stats, turn=turn, release=Release("0.20.0"))
        assert not found, found[:3]
    check_lookup_lengths(recorded_lookups("0.20.0"))
    assert stats.get("release freeing it", 0) >= 100 and stats.get("pop from part 3", 0) >= 20, stats


EFFECT_VARIANTS = [v for v in PI.POOL_VARIANTS if v not in ("correct", "hit_on_uncached_block")]


@pytest.mark.parametrize("variant", EFFECT_VARIANTS)
def test_pool_mutant_is_caught(variant):
    ids = Ids()
    for turn, call in enumerate(recorded_calls()):
        if compare_call(call, variant, ids=ids, turn=turn):
            return
    pytest.fail(f"the encoding mutant {variant} agrees with the spec on every pool call recorded")


def test_weakened_hit_premise_still_holds_on_the_spec():
    """hit_on_uncached_block only drops a premise (a hit is cached under the
    request's hash): the spec satisfies the stronger premise on every touch
    (test above), and `prove` refutes the claims under the weaker one."""
    from schedspec.proofs.pool_invariants import CLAIMS, discharge

    assert discharge(CLAIMS["prefix_hit_within_shared_prefix"], DEFAULT, "hit_on_uncached_block").status == "refuted"


@pytest.mark.parametrize("vllm_release", ["0.20.0", DEFAULT_RELEASE])
def test_pool_obligations_prove_and_refute_their_variants(vllm_release):
    """On 0.20.0 (every freed block to the back) and on 0.33.0: each pool claim is
    proved, its witness shows it, and each bad variant of the release is refuted."""
    from schedspec.proofs.obligations import build_obligations

    chosen = [o for o in build_obligations(Release(vllm_release), 2) if o.kind == "pool"]
    assert {o.property for o in chosen} == set(PI.CLAIMS)
    for o in chosen:
        assert o.discharge("correct").status == "proved", o.name
        assert o.witness()[0].status == "proved", o.name
        for v in o.bad_variants:
            assert o.discharge(v).status == "refuted", (o.name, v)
    assert ("hashed_freed_to_front" in {v for o in chosen for v in o.bad_variants}) is \
        (vllm_release != "0.20.0")


def test_the_recorded_calls_are_drawn_again_for_each_mutant(monkeypatch):
    """Under mutmut each mutant runs in a process forked after the clean run:
    the calls recorded there are the unmutated spec's, and must not be reused."""
    clean = recorded_calls()
    monkeypatch.setenv("MUTANT_UNDER_TEST", "schedspec.spec.block_pool.not_a_mutant")
    assert recorded_calls() is not clean
    monkeypatch.delenv("MUTANT_UNDER_TEST")
    assert recorded_calls() is clean
