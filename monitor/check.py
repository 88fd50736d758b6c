"""Comparing what vLLM did in one call with what the spec says it should have done.

Both sides are spec values: vLLM's by `lift`, the spec's by running the call on
the lifted pre-state.  Equality is exact, with two representation choices
normalised away, each an implementation freedom and not a behaviour:

- the KV free queue is compared as one sequence in pop order (the spec keeps
  it in three parts, spec/block_pool.py); entries for requests holding no
  block are dropped;
- block hashes created during the call are compared up to renaming: the spec
  hashes with BLAKE2b, vLLM with sha256 (spec/kv_cache_utils.py).  A hash made
  in the call must correspond one to one, position by position, to vLLM's,
  which is what equal token content gives; hashes that existed before the call
  must be equal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Any, Mapping

from schedspec.reference.state_json import cadence_fields
from schedspec.spec.block_pool import BlockPool
from schedspec.spec.request import Request
from schedspec.spec.state import SchedulerOutput, SchedulerState

REQUEST_FIELDS = tuple(f.name for f in fields(Request))
_block_hashes = attrgetter("block_hashes")
OUTPUT_FIELDS = tuple(f.name for f in fields(SchedulerOutput))


@dataclass(frozen=True)
class Difference:
    """The first place the spec and vLLM disagree, with both values as JSON."""

    field: str  # e.g. "output.preempted_req_ids", "post_state.requests.r3.num_computed_tokens"
    spec: Any
    vllm: Any

    def describe(self) -> str:
        return f"{self.field}: spec {self.spec!r}, vLLM {self.vllm!r}"

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "spec": self.spec, "vllm": self.vllm}


def jsonable(value: Any) -> Any:
    """A value as JSON: bytes as hex, enums by name, tuples as lists."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    return value


def compare_outputs(spec: SchedulerOutput, vllm: SchedulerOutput) -> Difference | None:
    if spec == vllm:
        return None
    for name in OUTPUT_FIELDS:
        a, b = getattr(spec, name), getattr(vllm, name)
        if a != b:
            return Difference(f"output.{name}", jsonable(a), jsonable(b))
    return None


def compare_finished(spec: Any, vllm: Any, what: str) -> Difference | None:
    a, b = sorted(jsonable(spec)), sorted(jsonable(vllm))
    return None if a == b else Difference(what, a, b)


def hash_renaming(pre: SchedulerState, spec: SchedulerState, vllm: SchedulerState,
                  gone: Mapping[str, tuple[tuple, tuple]] | None = None) -> dict[bytes, bytes] | Difference:
    """Spec hash -> vLLM hash for the hashes the call created, position by position.
    `gone`: for requests the call finished (no longer in either state), their block
    hashes as each side computed them in the call (spec's, vLLM's): a block they
    completed and freed in one call is cached under such a hash."""
    rename: dict[bytes, bytes] = {}
    pairs = [(rid, r.block_hashes, v.block_hashes) for rid, r in spec.requests.items()
             if (v := vllm.requests.get(rid)) is not None and r is not v and r.block_hashes != v.block_hashes]
    pairs += [(rid, a, b) for rid, (a, b) in (gone or {}).items() if a != b]
    for rid, r_hashes, v_hashes in pairs:
        before = pre.requests[rid].block_hashes if rid in pre.requests else ()
        if r_hashes[:len(before)] != before or v_hashes[:len(before)] != before or len(r_hashes) != len(v_hashes):
            continue  # a real difference: the field comparison (or the pool's) reports it
        for a, b in zip(r_hashes[len(before):], v_hashes[len(before):]):
            if rename.setdefault(a, b) != b:
                return Difference(f"post_state.requests.{rid}.block_hashes", "one new block hash",
                                  "two different hashes for it")
    return rename


def renamed(state: SchedulerState, rename: Mapping[bytes, bytes]) -> SchedulerState:
    """`state` with the spec's new hashes replaced by vLLM's: only what holds one changes."""
    if not rename:
        return state
    sub = lambda hs: tuple(rename.get(h, h) for h in hs)  # noqa: E731
    requests = dict(state.requests)
    # Which requests hold a renamed hash: one pass of map() in C, then only those.
    disjoint = map(rename.keys().isdisjoint, map(_block_hashes, state.requests.values()))
    for (rid, r), clear in zip(state.requests.items(), disjoint):
        if not clear:
            requests[rid] = r.evolve(block_hashes=sub(r.block_hashes))
    kv = state.kv_cache
    if isinstance(kv, BlockPool) and not kv.cached.keys().isdisjoint(rename):  # else the pool holds none of them
        cached, block_hash = dict(kv.cached), dict(kv.block_hash)
        moved = {h: cached.pop(h) for h in rename if h in cached}
        for h, blocks in moved.items():
            cached[rename[h]] = cached.get(rename[h], ()) + tuple(blocks)
            for b in blocks:
                block_hash[b] = rename[h]
        kv = replace(kv, block_hash=block_hash, cached=cached)
    # Every other field as it is (the pause state, the prefill cadence, the pool's free order).
    return replace(state, requests=requests, kv_cache=kv)


def kv_view(state: SchedulerState) -> dict[str, Any]:
    """The KV pool as comparable parts (see the module's docstring)."""
    kv = state.kv_cache
    if isinstance(kv, BlockPool):
        held = {rid: b for rid, b in kv.req_to_blocks.items() if b}
        return {"free_queue": kv.free_queue(), "req_to_blocks": held, "ref_cnt": dict(kv.ref_cnt),
                "block_hash": dict(kv.block_hash), "cached": dict(kv.cached),
                "num_cached_block": {rid: n for rid, n in kv.num_cached_block.items() if n and rid in held}}
    return {"num_free_blocks": kv.num_free_blocks,
            "req_to_num_blocks": {rid: n for rid, n in kv.req_to_num_blocks.items() if n}}


def first_difference(field: str, a: Any, b: Any) -> Difference:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b or a[k] != b[k]:
                where = f"{field}.{jsonable(k)}"
                if k not in a:
                    return Difference(where, "<absent>", jsonable(b[k]))
                if k not in b:
                    return Difference(where, jsonable(a[k]), "<absent>")
                return first_difference(where, a[k], b[k])
    return Difference(field, jsonable(a), jsonable(b))


def compare_states(pre: SchedulerState, spec: SchedulerState, vllm: SchedulerState,
                   gone: Mapping[str, tuple[tuple, tuple]] | None = None) -> Difference | None:
    """The first difference between the spec's post-state and vLLM's lifted one
    (`gone`: hash_renaming's)."""
    rename = hash_renaming(pre, spec, vllm, gone) if spec.block_pool is not None else {}
    if isinstance(rename, Difference):
        return rename
    spec = renamed(spec, rename)
    difference = queues_difference(spec, vllm)
    if difference is not None:
        return difference
    if not same_requests(spec.requests, vllm.requests):
        for rid in list(spec.requests) + [k for k in vllm.requests if k not in spec.requests]:
            a, b = spec.requests.get(rid), vllm.requests.get(rid)
            if a is None or b is None:
                return Difference(f"post_state.requests.{rid}", "<absent>" if a is None else "<present>",
                                  "<absent>" if b is None else "<present>")
            if a != b:
                name = next(n for n in REQUEST_FIELDS if getattr(a, n) != getattr(b, n))
                return Difference(f"post_state.requests.{rid}.{name}", jsonable(getattr(a, name)),
                                  jsonable(getattr(b, name)))
    if not same_kv(spec.kv_cache, vllm.kv_cache):
        a, b = kv_view(spec), kv_view(vllm)
        if a != b:
            return first_difference("post_state.kv_cache", a, b)
    return encoder_difference(spec, vllm)


def queues_difference(spec: SchedulerState, vllm: Any) -> Difference | None:
    """The queues, the finished set, the pause state, the prefill cadence and the
    grammar errors: `vllm` is a lifted state, or anything with those attributes
    (the incremental check reads them alone, incremental.py)."""
    for name in ("running", "waiting"):
        if getattr(spec, name) != getattr(vllm, name):
            return Difference(f"post_state.{name}", list(getattr(spec, name)), list(getattr(vllm, name)))
    if set(spec.finished_req_ids) != set(vllm.finished_req_ids):
        return Difference("post_state.finished_req_ids", sorted(spec.finished_req_ids), sorted(vllm.finished_req_ids))
    if spec.pause_state != vllm.pause_state:
        return Difference("post_state.pause_state", spec.pause_state, vllm.pause_state)
    if spec.prefill_cadence != vllm.prefill_cadence:
        return first_difference("post_state.prefill_cadence", cadence_fields(spec.prefill_cadence),
                                cadence_fields(vllm.prefill_cadence))
    if set(spec.grammar_compile_error_reqs) != set(vllm.grammar_compile_error_reqs):
        return Difference("post_state.grammar_compile_error_reqs", sorted(spec.grammar_compile_error_reqs),
                          sorted(vllm.grammar_compile_error_reqs))
    return None


def encoder_difference(spec: SchedulerState, vllm: Any) -> Difference | None:
    if spec.encoder_cache != vllm.encoder_cache:
        return first_difference("post_state.encoder_cache", encoder_view(spec), encoder_view(vllm))
    return None


def encoder_view(state: SchedulerState) -> dict[str, Any]:
    """The encoder cache as comparable parts: entries, who references each, each request's
    references, and the freeable entries in eviction order (spec/encoder_cache.py)."""
    e = state.encoder_cache
    return {"cached": {h: sorted(ids) for h, ids in e.cached.items()}, "num_embeds": dict(e.num_embeds),
            "refs": {rid: dict(ids) for rid, ids in e.refs.items()}, "freeable": list(e.freeable)}


def same_requests(a: Mapping[str, Request], b: Mapping[str, Request]) -> bool:
    """Request by request, by identity or field dict (a dict compare in C, where
    the dataclass's __eq__ builds two tuples of every field)."""
    if a is b:
        return True
    if a.keys() != b.keys():
        return False
    for rid, x in a.items():
        y = b[rid]
        if x is not y and x.__dict__ != y.__dict__:
            return False
    return True


def same_kv(a: Any, b: Any) -> bool:
    """The quick test before `kv_view`: part by part, in C, each part by identity
    first (a lifted part equal to the spec's is the spec's own, vllm_lift.py),
    false when unsure."""
    if a is b:
        return True
    if isinstance(a, BlockPool) and isinstance(b, BlockPool):
        return (a.num_free_blocks == b.num_free_blocks and same_free_queue(a, b)
                and _same(a.req_to_blocks, b.req_to_blocks) and _same(a.ref_cnt, b.ref_cnt)
                and _same(a.cached, b.cached) and _same(a.block_hash, b.block_hash)
                and _same(a.num_cached_block, b.num_cached_block))
    return a == b


def same_free_queue(a: BlockPool, b: BlockPool) -> bool:
    """The free queues in pop order, without building them: the parts agree, or the
    never-used range of one starts later and its front holds the other's front and
    then the ids up to that start (a lifted pool keeps the longest range it can,
    vllm_lift.lift_block_pool; the spec's keeps a freed block in front of its range)."""
    if a.num_gpu_blocks != b.num_gpu_blocks or not _same(a.free_back, b.free_back):
        return a.free_queue() == b.free_queue()
    if a.next_fresh > b.next_fresh:
        a, b = b, a
    front = a.free_front
    return len(b.free_front) == len(front) + b.next_fresh - a.next_fresh and b.free_front[:len(front)] == front \
        and tuple(b.free_front[len(front):]) == tuple(range(a.next_fresh, b.next_fresh))


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


__all__ = ["Difference", "compare_finished", "compare_outputs", "compare_states", "encoder_difference", "encoder_view",
           "first_difference", "queues_difference",
           "hash_renaming", "jsonable", "kv_view", "renamed"]
