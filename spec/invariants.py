"""The state invariant: what holds of every reachable `SchedulerState`.

Each predicate is a function `(state) -> Verdict` over one state (the properties
of `properties.py` judge a step; these judge a state).  `STATE_INVARIANTS` is the
registry the hypothesis machine, `schedspec prove` (as the premise of every step
obligation, and as the claim of the inductive ones) and the proofs' agreement
tests iterate over.  Only what really holds in every state reachable by
`add_request`, `schedule` + `update_from_output` and `finish_requests` from the
empty state belongs here, with and without prefix caching and async scheduling
(the proofs use them in their scope: both off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import FCFS, PRIORITY
from .properties import HOLDS, Verdict, get_block_span, violated
from .kv_connector import holds_loaded_blocks
from .request import RequestStatus
from .state import SchedulerState


@dataclass(frozen=True)
class StateInvariant:
    name: str
    doc: str
    check: Callable[[SchedulerState], Verdict]


STATE_INVARIANTS: dict[str, StateInvariant] = {}


def invariant(fn: Callable[[SchedulerState], Verdict]):
    doc = " ".join((fn.__doc__ or "").split())
    STATE_INVARIANTS[fn.__name__] = StateInvariant(fn.__name__, doc, fn)
    return fn


@invariant
def queues_partition_requests(s: SchedulerState) -> Verdict:
    """Every request is in exactly one of running and waiting, once, but a request
    finished while its KV load is in flight, held until the load ends (kv_connector.py)."""
    ids = list(s.running) + list(s.waiting)
    held = {rid for rid, r in s.requests.items() if r.status.is_finished}
    if len(ids) != len(set(ids)) or set(ids) | held != set(s.requests) or held & set(ids):
        return violated("running + waiting is not a partition of the requests",
                        running=list(s.running), waiting=list(s.waiting), requests=sorted(s.requests))
    return HOLDS


@invariant
def statuses_match_queues(s: SchedulerState) -> Verdict:
    """Running requests are RUNNING; waiting ones are WAITING or PREEMPTED, or waiting
    for a grammar they have (structured_output.py) or for their KV load (kv_connector.py)."""
    for rid in s.running:
        if rid in s.requests and s.requests[rid].status != RequestStatus.RUNNING:
            return violated("a running request is not RUNNING", request=rid, status=s.requests[rid].status.name)
    for rid in s.waiting:
        r = s.requests.get(rid)
        if r is not None and r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and not (
                r.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and r.grammar) \
                and not (r.status == RequestStatus.WAITING_FOR_REMOTE_KVS and r.kv_connector_async):
            return violated("a waiting request is neither WAITING nor PREEMPTED", request=rid,
                            status=s.requests[rid].status.name)
    return HOLDS


@invariant
def request_lengths_valid(s: SchedulerState) -> Verdict:
    """1 <= prompt < max_model_len, num_tokens < max_model_len and num_output_tokens < max_tokens:
    a request reaching either limit has finished (U:98-140), and is gone or, held for a
    KV connector (kv_connector.py), may stand at the limit it reached."""
    L = s.config.max_model_len
    for rid, r in s.requests.items():
        done = r.status.is_finished
        if not (1 <= r.num_prompt_tokens < L and r.num_tokens <= L - (not done)
                and 0 <= r.num_output_tokens <= r.max_tokens - (not done) and r.num_preemptions >= 0):
            return violated("a request's lengths are out of range", request=rid,
                            num_prompt_tokens=r.num_prompt_tokens, num_output_tokens=r.num_output_tokens,
                            max_tokens=r.max_tokens, max_model_len=L)
    return HOLDS


@invariant
def computed_tokens_below_num_tokens(s: SchedulerState) -> Verdict:
    """0 <= num_computed_tokens < num_tokens + num_output_placeholders: a request whose
    computed tokens reach its length samples a token in that step, which raises
    num_tokens or finishes it; under async scheduling that token is a placeholder
    until its batch returns."""
    for rid, r in s.requests.items():
        if not 0 <= r.num_computed_tokens < r.num_tokens + r.num_output_placeholders:
            return violated("num_computed_tokens out of [0, num_tokens + num_output_placeholders)",
                            request=rid, num_computed_tokens=r.num_computed_tokens,
                            num_tokens=r.num_tokens, num_output_placeholders=r.num_output_placeholders)
    return HOLDS


@invariant
def waiting_requests_hold_nothing(s: SchedulerState) -> Verdict:
    """A waiting request has no computed tokens and no blocks (no prefix caching: a
    preemption resets both, S:1853-1897), unless it holds those of its KV load."""
    for rid in s.waiting:
        r = s.requests.get(rid)
        if r is not None and (r.num_computed_tokens != 0 or s.num_blocks(rid) != 0) and not holds_loaded_blocks(r):
            return violated("a waiting request holds progress or blocks", request=rid,
                            num_computed_tokens=r.num_computed_tokens, blocks=s.num_blocks(rid))
    return HOLDS


@invariant
def blocks_match_computed_tokens(s: SchedulerState) -> Verdict:
    """Every request holds exactly cdiv(min(num_computed_tokens, max_model_len), block_size)
    blocks (with speculative decoding, up to those of its drafts and lookahead too:
    properties.get_block_span), and no block is held for an unknown request."""
    for rid, n in s.req_to_num_blocks.items():
        if rid not in s.requests and n != 0:
            return violated("blocks held for a request that is gone", request=rid, blocks=n)
    for rid, r in s.requests.items():
        lo, hi = get_block_span(s, r)
        if not lo <= s.num_blocks(rid) <= hi:
            return violated("a request holds the wrong number of blocks", request=rid,
                            blocks=s.num_blocks(rid), expected=lo if lo == hi else f"{lo}..{hi}")
    return HOLDS


@invariant
def blocks_conserved(s: SchedulerState) -> Verdict:
    """free + held == num_gpu_blocks - 1 (the null block is never free), free >= 0;
    with prefix caching a block shared by several requests counts once."""
    held = sum(s.req_to_num_blocks.values()) if s.block_pool is None else len(s.block_pool.ref_cnt)
    if s.num_free_blocks < 0 or held + s.num_free_blocks != s.config.num_usable_blocks:
        return violated("free + held != usable blocks", held=held, num_free_blocks=s.num_free_blocks,
                        usable=s.config.num_usable_blocks)
    return HOLDS


@invariant
def running_within_limit(s: SchedulerState) -> Verdict:
    """len(running) <= max_num_active_seqs (<= max_num_seqs)."""
    if len(s.running) > s.config.max_num_active_reqs:
        return violated("too many running requests", running=len(s.running),
                        max_num_active_reqs=s.config.max_num_active_reqs)
    return HOLDS


@invariant
def waiting_queue_ordered(s: SchedulerState) -> Verdict:
    """The requests holding blocks of a KV load come first, in a queue of their own
    (S:1091-1107); then, and within those: PRIORITY: in queue_key order; FCFS: the
    requests that never ran (WAITING, or waiting for a grammar) come after all
    others, the PREEMPTED ones (those are prepended, S:1896, and admission pops the front)."""
    holding = [w for w in s.waiting if w in s.requests and holds_loaded_blocks(s.requests[w])]
    if list(s.waiting[:len(holding)]) != holding:
        return violated("a request holding KV blocks waits behind one that holds none", waiting=list(s.waiting))
    if s.config.policy == PRIORITY:
        for part in (s.waiting[:len(holding)], s.waiting[len(holding):]):
            keys = [s.requests[w].queue_key for w in part if w in s.requests]
            if keys != sorted(keys):
                return violated("the priority waiting queue is out of queue_key order", waiting=list(s.waiting))
    elif s.config.policy == FCFS:
        seen_waiting = False
        for w in s.waiting[len(holding):]:  # the holders wait in the order their loads started
            r = s.requests.get(w)
            if r is None:
                continue
            if r.status in (RequestStatus.WAITING, RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR):
                seen_waiting = True
            elif seen_waiting:
                return violated("a request that ran waits behind one that never did", request=w,
                                waiting=list(s.waiting))
    return HOLDS


def check_state(state: SchedulerState) -> dict[str, Verdict]:
    """Every registered state invariant on one state."""
    return {name: inv.check(state) for name, inv in STATE_INVARIANTS.items()}


__all__ = ["STATE_INVARIANTS", "StateInvariant", "check_state"]
