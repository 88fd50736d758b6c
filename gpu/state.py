"""The batched scheduler's data: S scenarios x R request slots, as tensors.

`Batch` is what does not change while a batch runs: each scenario's config and
each request's static fields (padded slots never arrive).  `State` is what a
step changes.  Both are frozen; a step builds a new `State`.  Dtypes and their
limits are explained in gpu/limits.py.

Orders are integer keys, not lists:
- the running list is the running requests sorted by `run_pos`, a per-scenario
  counter taken at admission (admissions append at the tail);
- the waiting queue is the waiting requests sorted by `wait_key` under FCFS
  (arrivals take their slot index; a preempted request takes the next value of a
  decreasing counter, so it goes in front of everything, the newest first), and
  by the static `queue_rank` under PRIORITY (the heap order
  (priority, arrival_time, request_id), ranked on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from schedspec.spec.request import RequestStatus
from .pool import Pool, grow_requests, initial_pool, select_pool

# Request status codes: vLLM's (spec/request.py) plus 0 for "has not arrived".
NOT_ARRIVED = 0
WAITING = int(RequestStatus.WAITING)
RUNNING = int(RequestStatus.RUNNING)
PREEMPTED = int(RequestStatus.PREEMPTED)
STOPPED = int(RequestStatus.FINISHED_STOPPED)
LENGTH_CAPPED = int(RequestStatus.FINISHED_LENGTH_CAPPED)
ABORTED = int(RequestStatus.FINISHED_ABORTED)

NEVER = 2**31 - 1  # an arrival or abort step that never comes (int32)

I8, I32, I64 = torch.int8, torch.int32, torch.int64


@dataclass(frozen=True)
class Batch:
    # per scenario, (S,)
    token_budget: torch.Tensor  # int64: min(max_num_scheduled_tokens, max_num_batched_tokens)
    max_num_active_reqs: torch.Tensor  # int64
    long_prefill_token_threshold: torch.Tensor  # int64
    enable_chunked_prefill: torch.Tensor  # bool
    resumed_as_new: torch.Tensor  # bool: a resumed request is admitted as new (versions.RESUMED_SENT_AS_NEW)
    priority_policy: torch.Tensor  # bool
    block_size: torch.Tensor  # int64
    watermark_blocks: torch.Tensor  # int64: int(watermark * num_gpu_blocks)
    reserve_full_isl: torch.Tensor  # bool
    max_model_len: torch.Tensor  # int64
    num_usable_blocks: torch.Tensor  # int64: num_gpu_blocks - 1 (the null block is never free)
    # per request slot, (S, R)
    valid: torch.Tensor  # bool: a real request, not padding
    num_prompt_tokens: torch.Tensor  # int32
    max_tokens: torch.Tensor  # int32, clamped to max_model_len
    output_len: torch.Tensor  # int32: EOS as this output token; 0 = never
    arrival_step: torch.Tensor  # int32
    abort_step: torch.Tensor  # int32
    queue_rank: torch.Tensor  # int64: heap order rank (priority, arrival_time, request_id)
    victim_rank: torch.Tensor  # int64: dense rank of (priority, arrival_time)
    # Prefix caching (gpu/pool.py): set when some scenario of the batch has it on,
    # and then every scenario runs on the block-level pool.
    block_hashes: torch.Tensor | None = None  # (S, R, H) int32: request's i-th block's hash id, -1 = none
    abort_rank: torch.Tensor | None = None  # (S, R) int64: order of the step's aborts (their frees)
    unhashed_first: torch.Tensor | None = None  # (S,) bool: versions.UNHASHED_FREE_BLOCKS_FIRST
    num_hashes: int = 0  # hash ids per scenario, at most
    # Async scheduling (docs/rules.md §9): set when some scenario of the batch has
    # it on, and then every scenario steps through the engine step with a batch in
    # flight (gpu/step.py `engine_step`), the synchronous ones applying theirs at once.
    async_sched: torch.Tensor | None = None  # (S,) bool: config.async_scheduling
    # (S,) block_size as a float, for the step's block floors and ceilings:
    # float32 when every max_model_len of the batch is at most
    # limits.MAX_FLOAT32_DIV_LEN, else float64 (see gpu/limits.py: exact either way).
    # Integer division has no vector instruction on the CPU (a (2048, 32) int32
    # floor division 116 µs, float32 division and floor 36 µs).
    block_size_f: torch.Tensor | None = None
    # The largest max_model_len of the batch, for the running loop's prefix sums:
    # int32 when R * (longest_model_len + 1) < 2**31 (gpu/limits.py).
    longest_model_len: int = 2**30

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.valid.shape)


@dataclass(frozen=True)
class State:
    # (S, R)
    status: torch.Tensor  # int8, codes above
    num_computed_tokens: torch.Tensor  # int32
    num_output_tokens: torch.Tensor  # int32
    num_preemptions: torch.Tensor  # int32
    num_blocks: torch.Tensor  # int32: KV blocks held
    run_pos: torch.Tensor  # int64: running-order key
    wait_key: torch.Tensor  # int64: FCFS waiting-order key
    first_token_step: torch.Tensor  # int32, -1 = none yet
    finish_step: torch.Tensor  # int32, -1 = not finished
    # (S,)
    num_free_blocks: torch.Tensor  # int64
    next_run_pos: torch.Tensor  # int64
    next_front_key: torch.Tensor  # int64: the next (more negative) FCFS front key
    pool: Pool | None = None  # the block-level pool, with Batch.block_hashes
    # Async scheduling (with Batch.async_sched; None otherwise), vLLM's request
    # counters (RQ:169-180, docs/rules.md §9), all 0 between synchronous steps:
    ph: torch.Tensor | None = None  # (S, R) int32: num_output_placeholders
    inflight: torch.Tensor | None = None  # (S, R) int32: num_in_flight_tokens
    stale: torch.Tensor | None = None  # (S, R) int32: num_stale_output_tokens
    chunk: torch.Tensor | None = None  # (S, R) bool: is_prefill_chunk after the last grant
    # The batch in flight (at most one between engine steps, formats.md): its
    # grants, which of its requests sample, its grant order (run_pos when it was
    # scheduled) and its step; `pend_valid` false when none (an empty batch is valid).
    pend_grant: torch.Tensor | None = None  # (S, R) int32
    pend_sample: torch.Tensor | None = None  # (S, R) bool
    pend_key: torch.Tensor | None = None  # (S, R) int64
    pend_step: torch.Tensor | None = None  # (S,) int32
    pend_valid: torch.Tensor | None = None  # (S,) bool
    # finished_req_ids non-empty: a request finished since the last schedule(), so
    # has_requests() holds and the async engine calls schedule() (I:205-208).
    fin_flag: torch.Tensor | None = None  # (S,) bool


@dataclass(frozen=True)
class Decision:
    """What one schedule() decided, per request slot (S, R), plus per scenario."""

    num_scheduled_tokens: torch.Tensor  # int32, 0 = not scheduled (refunded grants are 0)
    admitted: torch.Tensor  # int8: 0 no, 1 new (a resumed one too where resumed_as_new), 2 resumed
    preempt_order: torch.Tensor  # int32: index of the preemption in this step, -1 = none
    num_running: torch.Tensor  # (S,) int64: len(running) after schedule (slots held)
    hit_tokens: torch.Tensor | None = None  # int32: prefix-cache hit of an admission (prefix_hits)
    sample: torch.Tensor | None = None  # bool: granted and not a prefill chunk (async batches only)


def initial_state(batch: Batch) -> State:
    S, R = batch.shape
    dev = batch.valid.device
    z32 = torch.zeros((S, R), dtype=I32, device=dev)
    pool = None
    if batch.block_hashes is not None:
        H = batch.block_hashes.shape[2]
        W = max(1, min(int(batch.num_usable_blocks.max()), 64))  # grows as blocks are used (pool.py)
        pool = initial_pool(batch.num_usable_blocks, R, H, W, max(batch.num_hashes, 1))
    asy = {}
    if batch.async_sched is not None:
        asy = dict(ph=z32, inflight=z32, stale=z32, chunk=torch.zeros((S, R), dtype=torch.bool, device=dev),
                   pend_grant=z32, pend_sample=torch.zeros((S, R), dtype=torch.bool, device=dev),
                   pend_key=torch.zeros((S, R), dtype=I64, device=dev),
                   pend_step=torch.zeros(S, dtype=I32, device=dev),
                   pend_valid=torch.zeros(S, dtype=torch.bool, device=dev),
                   fin_flag=torch.zeros(S, dtype=torch.bool, device=dev))
    return State(
        status=torch.zeros((S, R), dtype=I8, device=dev),
        num_computed_tokens=z32, num_output_tokens=z32, num_preemptions=z32, num_blocks=z32,
        run_pos=torch.zeros((S, R), dtype=I64, device=dev),
        wait_key=torch.zeros((S, R), dtype=I64, device=dev),
        first_token_step=torch.full((S, R), -1, dtype=I32, device=dev),
        finish_step=torch.full((S, R), -1, dtype=I32, device=dev),
        num_free_blocks=batch.num_usable_blocks.clone(),
        next_run_pos=torch.zeros(S, dtype=I64, device=dev),
        next_front_key=torch.full((S,), -1, dtype=I64, device=dev),
        pool=pool,
        **asy,
    )


# Padding values of each per-request field when a batch grows (TorchScheduler).
_BATCH_PAD = {"valid": False, "num_prompt_tokens": 1, "max_tokens": 1, "output_len": 0,
              "arrival_step": NEVER, "abort_step": NEVER, "queue_rank": 0, "victim_rank": 0, "abort_rank": 0}
_STATE_PAD = {"status": NOT_ARRIVED, "num_computed_tokens": 0, "num_output_tokens": 0,
              "num_preemptions": 0, "num_blocks": 0, "run_pos": 0, "wait_key": 0,
              "first_token_step": -1, "finish_step": -1, "ph": 0, "inflight": 0, "stale": 0, "chunk": False,
              "pend_grant": 0, "pend_sample": False, "pend_key": 0}


def _grow(obj, pads: dict, extra: int):
    changes = {}
    for f in fields(obj):
        t = getattr(obj, f.name)
        if f.name in pads and t is not None:
            pad = torch.full((t.shape[0], extra), pads[f.name], dtype=t.dtype, device=t.device)
            changes[f.name] = torch.cat([t, pad], dim=1)
    return replace(obj, **changes)


def grow(batch: Batch, state: State, extra: int, H: int = 0) -> tuple[Batch, State]:
    """`extra` more (empty) request slots per scenario; with prefix caching, at
    least H block positions per request."""
    b, s = _grow(batch, _BATCH_PAD, extra), _grow(state, _STATE_PAD, extra)
    if batch.block_hashes is not None:
        bh = batch.block_hashes
        S, R, H0 = bh.shape
        H = max(H, H0)
        bh = torch.cat([bh, bh.new_full((S, R, H - H0), -1)], dim=2)
        bh = torch.cat([bh, bh.new_full((S, extra, H), -1)], dim=1)
        b = replace(b, block_hashes=bh)
        s = replace(s, pool=grow_requests(state.pool, extra, H, b.num_hashes))
    return b, s


def select(obj, rows: torch.Tensor, num_slots: int):
    """The scenarios `rows` of a Batch or State, keeping the first `num_slots`
    request slots (the rest must be padding)."""
    changes = {}
    for f in fields(obj):
        t = getattr(obj, f.name)
        if isinstance(t, Pool):
            changes[f.name] = select_pool(t, rows, num_slots)
        elif isinstance(t, torch.Tensor):
            t = t.index_select(0, rows)
            # contiguous: a narrowed view would be copied again by every flat
            # read of it (pool.cache reads the block hashes flat, every step)
            changes[f.name] = t[:, :num_slots].contiguous() if t.dim() >= 2 else t
    return replace(obj, **changes)
