"""Speculative decoding, as the scheduler sees it: drafts a request carries into a
step, the padding of a new decode, rejected drafts rolled back, and the drafter's
proposals after a step (S = vllm/v1/core/sched/scheduler.py; modelled from 0.33.0).

The drafter is n-gram or one of the EAGLE family, with
`max_num_new_slots_for_drafting` rows of its own in the target batch (scheduler.py
charges them); `num_lookahead_tokens` KV slots past the scheduled tokens are
reserved by kv_cache.allocate_slots.  An EAGLE-family drafter reads prompt tokens
past a chunk (one; multi-module MTP num_speculative_tokens: reserve_prefill_lookahead,
cacheable_tokens) and may drop a prefix hit's last block (eagle_block_drop).
Each function here is called at one site of scheduler.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from .config import SchedulerConfig
from .request import Request
from .state import SchedulerState, Working

if TYPE_CHECKING:
    from .scheduler import ScheduleWork


def schedule_drafts(s: ScheduleWork, rid: str, n: int) -> None:
    """The drafts that fit in grant `n`, past the tokens the
    request already has, go to the model; the request's drafts are spent either way,
    and the next ones come after the step (S:1025-1041)."""
    r = s.requests[rid]
    if not r.spec_token_ids:
        return
    num_drafts = n + r.num_computed_tokens - r.num_tokens - r.num_output_placeholders
    if num_drafts > 0:
        s.drafts_sent[rid] = r.spec_token_ids[:num_drafts]
    s.request(rid).spec_token_ids = ()


def pads_new_decode(s: ScheduleWork, r: Request, num_computed_tokens: int) -> bool:
    """An admission with one token left is a decode, padded to
    1 + num_speculative_tokens rows of -1 drafts so the batch stays uniform, when no
    prefill chunk runs, some request is decoding already or it resumes, and the
    padded rows and a sampled token fit in max_model_len (S:1358-1380)."""
    k = s.config.num_speculative_tokens
    return (k > 0 and r.num_tokens - num_computed_tokens == 1 and not s.prefill_scheduled
            and bool(s.scheduled_running or num_computed_tokens > 0)
            and num_computed_tokens + 1 + k + 1 <= s.config.max_model_len)


def reserve_prefill_lookahead(config: SchedulerConfig, r: Request, num_computed_tokens: int, n: int) -> int:
    """A multi-module MTP drafter reads the num_prefill_lookahead_tokens prompt tokens
    after a prefill chunk: a chunk ends at the prefill's end or at least that far
    before it, else it is cut, down to 0 (S:695-714).  Void at a lookahead of 1."""
    remaining = r.num_tokens - num_computed_tokens - n
    if 0 < remaining < config.num_prefill_lookahead_tokens:
        n -= config.num_prefill_lookahead_tokens - remaining
    return max(n, 0)


def cacheable_tokens(config: SchedulerConfig, num_tokens: int) -> int:
    """Of `num_tokens` computed, those whose KV is final, which alone are cached: a
    multi-module MTP drafter may re-prefill the last num_prefill_lookahead_tokens - 1
    (kv_cache_coordinator.py:118, 350-356)."""
    return max(0, num_tokens - max(0, config.num_prefill_lookahead_tokens - 1))


def eagle_block_drop(config: SchedulerConfig, hits: list[int]) -> list[int]:
    """An EAGLE-family drafter builds a position's draft KV from the token after it,
    which a cached block's hash does not cover: a prefix hit gives back its last
    block, to be recomputed (T:834-842; the flag, S:330-345)."""
    return hits[:-1] if config.use_eagle_block_drop and hits else hits


def reject_drafts(r: Request, num_rejected: int) -> None:
    """The model kept one sampled token per accepted draft plus
    one; the rejected drafts were computed optimistically and are not (S:2417-2426)."""
    if r.num_computed_tokens > 0:
        r.num_computed_tokens -= num_rejected
    if r.num_output_placeholders > 0:
        r.num_output_placeholders -= num_rejected


def update_draft_token_ids(state: SchedulerState, draft_token_ids: Mapping[str, Sequence[int]]) -> SchedulerState:
    """Synchronous engine: the drafter's proposals after a step
    become the drafts each request verifies next (S:2996-3016).  Finished requests
    are skipped, gone or held for a KV send (S:3001); a request mid-prefill drops its drafts."""
    w = Working(state)
    for rid, ids in draft_token_ids.items():
        r = w.requests.get(rid)
        if r is None or r.status.is_finished:
            continue
        if r.is_prefill_chunk:
            if r.spec_token_ids:
                w.request(rid).spec_token_ids = ()
            continue
        w.request(rid).spec_token_ids = tuple(ids)
    return w.freeze()
