"""The scheduler's state, a value: nothing reachable from it changes once built.
Each scheduler call makes a `Working` copy, changes that, and freezes it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from .block_pool import BlockPool
from .config import SchedulerConfig
from .encoder_cache import EMPTY_ENCODER_CACHE, EncoderCache
from .kv_cache import BlockCounts
from .output import SchedulerOutput  # noqa: F401 - the step's decision, beside the state
from .prefill_throttle import PrefillCadence
from .request import Request
from .versions import UNHASHED_FREE_BLOCKS_FIRST, has

# vLLM's PauseState names (sched/interface.py:24)
UNPAUSED, PAUSED_NEW, PAUSED_ALL = PAUSE_STATES = ("UNPAUSED", "PAUSED_NEW", "PAUSED_ALL")


@dataclass(frozen=True)
class SchedulerState:
    config: SchedulerConfig
    # Every request that has arrived and not finished, by id.
    requests: Mapping[str, Request] = field(default_factory=dict)
    # The running list in order (S:242).
    running: tuple[str, ...] = ()
    # The waiting queue in pop order: a deque for FCFS, heap order for PRIORITY (Q).
    waiting: tuple[str, ...] = ()
    # The KV pool: block by block with enable_prefix_caching, else as counts
    # (kv_cache.py); None means the empty pool of `config`.
    kv_cache: BlockCounts | BlockPool | None = None
    # Ids finished since the last schedule(): `has_requests()` stays true until
    # schedule() flushes them (sched/interface.py:205-208; the async engine loop).
    finished_req_ids: tuple[str, ...] = ()
    # Structured output: failed grammars noted by schedule(), finished by the next update.
    grammar_compile_error_reqs: tuple[str, ...] = ()
    # set_pause_state (S:3213), from outside: PAUSED_NEW admits nothing, PAUSED_ALL schedules nothing.
    pause_state: str = UNPAUSED
    prefill_cadence: PrefillCadence = PrefillCadence()  # prefill throttling (prefill_throttle.py)
    encoder_cache: EncoderCache = EMPTY_ENCODER_CACHE  # encoder outputs of multimodal items (encoder_cache.py)

    def __post_init__(self):
        if self.kv_cache is None:
            c = self.config
            empty = BlockPool(c.num_gpu_blocks, unhashed_first=has(c, UNHASHED_FREE_BLOCKS_FIRST)) \
                if c.enable_prefix_caching else BlockCounts(c.num_usable_blocks)
            object.__setattr__(self, "kv_cache", empty)

    def has_requests(self) -> bool:
        """Requests live, finished ids to hand on, or finished requests holding blocks (S:3287-3305)."""
        return bool(self.requests or self.finished_req_ids)

    def num_blocks(self, request_id: str) -> int:
        return self.kv_cache.num_blocks(request_id)

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache.num_free_blocks

    @property
    def req_to_num_blocks(self) -> Mapping[str, int]:
        return self.kv_cache.req_to_num_blocks

    @property
    def block_pool(self) -> BlockPool | None:
        """The block-level pool, with prefix caching; None without."""
        return self.kv_cache if isinstance(self.kv_cache, BlockPool) else None


class Working:
    """A state's working copy inside one call: the queues as vLLM's loops have them, the
    KV pool's working view, and the requests, each copied once, when first changed."""

    def __init__(self, state: SchedulerState):
        self.config = state.config
        self.requests: dict[str, Request] = dict(state.requests)
        self.running: list[str] = list(state.running)
        self.waiting: deque[str] = deque(state.waiting)
        self.kv = state.kv_cache.work()
        self.encoder = state.encoder_cache.work()
        self.finished_req_ids = state.finished_req_ids
        self.grammar_compile_error_reqs = state.grammar_compile_error_reqs
        self.pause_state, self.cadence = state.pause_state, state.prefill_cadence
        self._copied: set[str] = set()

    def request(self, request_id: str) -> Request:
        """The request, to be changed: this call's own copy."""
        if request_id in self._copied:
            return self.requests[request_id]
        self._copied.add(request_id)
        r = self.requests[request_id] = self.requests[request_id].copy()
        return r

    def freeze(self) -> SchedulerState:
        return SchedulerState(config=self.config, requests=self.requests, running=tuple(self.running),
                              waiting=tuple(self.waiting), kv_cache=self.kv.freeze(),
                              finished_req_ids=self.finished_req_ids,
                              grammar_compile_error_reqs=self.grammar_compile_error_reqs,
                              pause_state=self.pause_state, prefill_cadence=self.cadence,
                              encoder_cache=self.encoder.freeze())
