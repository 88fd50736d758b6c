"""Encoder inputs: which of a request's multimodal items a step encodes, and how they
cut its chunk (S = vllm/v1/core/sched/scheduler.py; docs/rules.md §20).

Scope: a decoder-only model, no encoder-cache connector, every placeholder token an
embedding.  An item is encoded whole, in the step whose chunk first reaches it,
under a per-step encoder compute budget and the encoder cache's room; a chunk that
would reach an item neither gives stops just before it (S:2064-2258).  Each function
is called at one site of scheduler.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .request import Request
from .versions import ENCODER_NEVER_SPLITS_UNCHUNKED_PROMPT, MM_CHUNK_INSIDE_ITEM_WAITS, has

if TYPE_CHECKING:  # the working state of scheduler.py, which imports this module
    from .scheduler import ScheduleWork
    from .state import Working


def plan(s: "ScheduleWork", r: Request, num_computed_tokens: int, n: int) -> int:
    """`_try_schedule_encoder_inputs` (S:2064-2258) for a chunk of `n` tokens from
    `num_computed_tokens`: the chunk, cut at the first item that it reaches and cannot
    encode, or not at all (0) if it starts inside one.  The items to encode, the budget
    they leave and the items repeated in the request wait in `s.encoder_plan` for
    `commit`; cache hits are referenced and room is evicted now, as vLLM does."""
    budget = s.encoder_budget
    s.encoder_plan = ((), budget, ())
    if n == 0:
        return n
    c = s.config
    shift = c.num_prefill_lookahead_tokens  # an MTP drafter's read-ahead (S:895)
    end = num_computed_tokens + n + shift
    chosen: list[int] = []
    repeated: list[int] = []
    this_step: dict[str, int] = {}  # identifier -> embeddings, of the items chosen here
    for i, f in enumerate(r.mm_features):
        if not (f.offset < end and f.offset + f.length > num_computed_tokens):  # the window (S:2109-2116)
            continue
        if c.disable_chunked_mm_input and num_computed_tokens + n < f.offset + f.length \
                and (num_computed_tokens <= f.offset or has(c, MM_CHUNK_INSIDE_ITEM_WAITS)):
            # An item is not split (S:2144-2161): stop before it, or, started on or inside
            # it (a prefix hit can end there), schedule nothing until the rest fits.
            n = max(0, f.offset - (num_computed_tokens + shift)) if num_computed_tokens < f.offset else 0
            break
        if f.identifier in this_step:  # the same item again in this request (S:2156-2176)
            repeated.append(i)
            continue
        if s.encoder.check_and_update_cache(r.request_id, i, f.identifier):  # S:2198-2201
            continue
        if not s.encoder.can_allocate(f.length, budget, sum(this_step.values()), c.encoder_cache_capacity):
            # An item is encoded whole: stop before it, or, reached already (a prefix
            # hit inside it), schedule nothing (S:2203-2225).
            n = min(n, f.offset - num_computed_tokens) if num_computed_tokens < f.offset else 0
            break
        budget -= f.length
        this_step[f.identifier] = f.length
        chosen.append(i)
    s.encoder_plan = (tuple(chosen), budget, tuple(repeated))
    return n


def unsplit_unchunked(s: "ScheduleWork", r: Request, num_computed_tokens: int, n: int) -> int:
    """An admission's chunk `n` after its plan: with chunked prefill off, one the plan cut
    short of the whole request is not scheduled from 0.34.0 (0, a skip), and the cache
    references the plan took are released (S:1444-1455)."""
    c = s.config
    if not c.enable_chunked_prefill and has(c, ENCODER_NEVER_SPLITS_UNCHUNKED_PROMPT) \
            and 0 < n < r.num_tokens - num_computed_tokens:
        s.encoder.free(r.request_id)
        return 0
    return n


def commit(s: "ScheduleWork", rid: str) -> None:
    """The planned items of a request just scheduled: noted for the batch, charged to
    the budget, given cache entries; repeated items referenced (S:1044-1052, 2050-2062).
    The budget becomes the plan's, dropping a refund a preemption made meanwhile (S:1046)."""
    chosen, budget, repeated = s.encoder_plan
    if not chosen:
        return
    r = s.requests[rid]
    s.encoder_inputs[rid] = chosen
    s.encoder_budget = budget
    for i in chosen:
        f = r.mm_features[i]
        s.encoder.allocate(rid, i, f.identifier, f.length)
    for i in repeated:
        s.encoder.check_and_update_cache(rid, i, r.mm_features[i].identifier)


def release(s: "ScheduleWork", victim: str) -> None:
    """A preempted request's items: a refund of those it was to encode this step
    (S:973-984), and its references (S:1872)."""
    chosen = s.encoder_inputs.pop(victim, ())
    if chosen:
        s.encoder_budget += sum(s.requests[victim].mm_features[i].length for i in chosen)
    s.encoder.free(victim)


def free_computed(w: "Working", r: Request) -> None:
    """After a step ran: the references to items wholly computed, and not in a range
    that rejected drafts could still roll back into (S:2433-2435, 2961-2991)."""
    held = w.encoder.refs.get(r.request_id)
    if not held:
        return
    done = r.num_computed_tokens - r.num_output_placeholders
    for i in sorted(held):  # vLLM walks a set: in id order for ids below 8 (input_processor.py)
        f = r.mm_features[i]
        if f.offset + f.length <= done:
            w.encoder.free_encoder_input(r.request_id, i)
