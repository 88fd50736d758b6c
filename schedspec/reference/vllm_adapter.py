"""The real vLLM 0.33.0 V1 scheduler behind schedspec's implementation protocol.

`VllmScheduler` drives `vllm.v1.core.sched.scheduler.Scheduler` (or
`AsyncScheduler`, sched/async_scheduler.py), built the way
vLLM's own unit tests build it (tests/v1/core/utils.py `create_scheduler`): an
offline OPT-125m model config (reference/vllm_model/config.json, its
`max_position_embeddings` raised to cover `max_model_len`), no tokenizer, one
full-attention KV cache group of `num_gpu_blocks` blocks.  With
`async_scheduling` the scheduler is `AsyncScheduler` with two batches in flight
(the CPU platform would switch async scheduling off; the adapter keeps the
value VllmConfig resolved, as a GPU platform does), and `update_from_output`
takes whichever batch the engine completes.  With `enable_prefix_caching`
requests carry the spec's prompt tokens and the block hasher EngineCore gives
them, and `observe()` reports the block pool block by block, with vLLM's block
ids and hashes (spec/block_pool.py).

vLLM is imported lazily, on the first `reset()`, so the rest of schedspec never
needs it.  Install it with `schedspec install-vllm` (scripts/install-vllm.sh).
The first import takes about 10 s; every further `reset()` builds a new
Scheduler in a few milliseconds, so keep one process for many scenarios.

What vLLM decides, vLLM decides: every scenario config field is handed to
vLLM's own config classes (SchedulerConfig, CacheConfig, ModelConfig,
VllmConfig), and their rejection (pydantic ValidationError or ValueError)
becomes a one-line ValueError.  The engine start-up check that the pool holds
one max_model_len sequence (v1/core/kv_cache_planning.py
`check_enough_kv_cache_memory`, run by EngineCore before the scheduler exists)
is applied here too, since building a Scheduler directly skips it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from schedspec.spec.block_pool import BlockPool
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.state import SchedulerOutput, SchedulerState

MODEL_CONFIG = Path(__file__).parent / "vllm_model" / "config.json"
VLLM_VERSION = "0.33.0"
MAX_MODEL_LEN = 2**24  # prompts up to 16 M tokens: a 128 MiB token list per request at most

# The spec's config fields that vLLM's SchedulerConfig takes under the same name.
SCHEDULER_CONFIG_FIELDS = (
    "max_model_len", "max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_seqs", "max_num_active_seqs",
    "enable_chunked_prefill", "long_prefill_token_threshold", "policy", "watermark",
    "scheduler_reserve_full_isl", "async_scheduling")
# The fields vLLM's Request and the spec's share, name and meaning.
SHARED_REQUEST_FIELDS = (
    "num_prompt_tokens", "max_tokens", "priority", "arrival_time", "num_computed_tokens", "num_output_tokens",
    "num_preemptions", "num_output_placeholders", "num_in_flight_tokens", "num_stale_output_tokens",
    "is_prefill_chunk")

_vllm: dict[str, Any] | None = None  # the lazily imported vLLM names
_model_dirs: dict[int, str] = {}  # max_position_embeddings -> model folder
_tmp_root: str | None = None
_base_config: dict[str, Any] | None = None


def _import_vllm() -> dict[str, Any]:
    """Import the vLLM pieces once per process (about 10 s)."""
    global _vllm
    if _vllm is not None:
        return _vllm
    # Must be set before vLLM is imported: without a device vLLM cannot build
    # a VllmConfig ("Failed to infer device type"); no network, no tokenizer.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's warnings about the missing GPU, Triton and compiled ops concern
    # the model runner, not the scheduler; keep them off the user's terminal.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    import torch
    import vllm
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig as VSchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_planning import check_enough_kv_cache_memory
    from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VRequest
    from vllm.v1.request import RequestStatus as VRequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    if getattr(vllm, "__version__", None) != VLLM_VERSION:
        raise ImportError(
            f"schedspec models vLLM {VLLM_VERSION}, but vllm {getattr(vllm, '__version__', '?')} "
            "is installed; run `schedspec install-vllm`")
    _vllm = dict(
        torch=torch, CacheConfig=CacheConfig, ModelConfig=ModelConfig,
        SchedulerConfig=VSchedulerConfig, VllmConfig=VllmConfig, SamplingParams=SamplingParams,
        check_enough_kv_cache_memory=check_enough_kv_cache_memory, Scheduler=Scheduler,
        AsyncScheduler=AsyncScheduler, get_block_hash=get_block_hash,
        get_request_block_hasher=get_request_block_hasher, init_none_hash=init_none_hash,
        get_hash_fn_by_name=get_hash_fn_by_name,
        FullAttentionSpec=FullAttentionSpec, KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec, ModelRunnerOutput=ModelRunnerOutput,
        Request=VRequest, RequestStatus=VRequestStatus,
        StructuredOutputManager=StructuredOutputManager,
    )
    return _vllm


def _model_dir(max_model_len: int) -> str:
    """A folder holding OPT-125m's config.json with max_position_embeddings at
    least `max_model_len` (ModelConfig caps max_model_len by it).  One folder per
    power of two, so vLLM's per-path config caches stay valid."""
    global _tmp_root, _base_config
    if _base_config is None:
        _base_config = json.loads(MODEL_CONFIG.read_text())
    base = dict(_base_config)
    mpe = int(base.get("max_position_embeddings", 2048))
    while mpe < max_model_len:
        mpe *= 2
    if mpe not in _model_dirs:
        if _tmp_root is None:
            _tmp_root = tempfile.mkdtemp(prefix="schedspec-vllm-model-")
            atexit.register(shutil.rmtree, _tmp_root, True)
        d = Path(_tmp_root) / f"opt-125m-mpe{mpe}"
        d.mkdir(parents=True, exist_ok=True)
        base["max_position_embeddings"] = mpe
        (d / "config.json").write_text(json.dumps(base))
        _model_dirs[mpe] = str(d)
    return _model_dirs[mpe]


@contextlib.contextmanager
def _platform_keeps_async_scheduling():
    """While a VllmConfig is built: the CPU platform hook switches async
    scheduling off whatever was asked (platforms/cpu.py:348, called from
    config/vllm.py:2067), and no other platform touches it.  The scheduler does
    not depend on the device, so the value VllmConfig resolved before the hook
    (an explicit value, checked at config/vllm.py:1668-1684, or None resolved
    at 1685-1719) is put back, as a GPU platform would leave it."""
    from vllm.platforms import current_platform

    hook = current_platform.check_and_update_config

    def check_and_update_config(vllm_config):
        resolved = vllm_config.scheduler_config.async_scheduling
        hook(vllm_config)
        vllm_config.scheduler_config.async_scheduling = resolved

    current_platform.check_and_update_config = check_and_update_config  # shadows the classmethod
    try:
        yield
    finally:
        del current_platform.check_and_update_config


def _one_line(e: BaseException) -> str:
    """vLLM's rejection as one line (pydantic messages span several)."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ()))
            msg = first.get("msg", "")
            got = first.get("input", None)
            msg = re.sub(r"^Value error, ", "", re.sub(r"\s+", " ", msg)).strip()
            if isinstance(got, (int, float, str, bool)) or got is None:
                msg = f"{msg} (got {got!r})"
            text = f"{loc}: {msg}" if loc else msg
            return f"vLLM {VLLM_VERSION} rejects the config: {text}"
        except Exception:  # noqa: BLE001 - fall back to the plain text
            pass
    text = re.sub(r"\s+", " ", str(e)).strip()
    return f"vLLM {VLLM_VERSION} rejects the config: {text}"


class VllmScheduler:
    """vLLM 0.33.0's `Scheduler` (or `AsyncScheduler`) behind the implementation
    protocol (reference/impl.py)."""

    name = "vllm"

    def __init__(self) -> None:
        self._v = _import_vllm()
        self.config: SchedulerConfig | None = None
        self.sched = None
        self._block_hasher = None
        # Every vLLM SchedulerOutput not yet applied, by the identity of the spec
        # output made from it: under async scheduling two batches are in flight
        # and update_from_output() may be handed the older one.
        self._in_flight: dict[int, tuple[SchedulerOutput, Any]] = {}
        self._preempted: list[str] = []
        # vLLM keeps finished ids in a set (S:3054); the order they finished in.
        self._finish_order: list[str] = []
        self._token_seq = 0

    # -- construction -------------------------------------------------------

    def reset(self, config: SchedulerConfig) -> None:
        """Build a fresh vLLM Scheduler for `config`; a config vLLM rejects
        raises ValueError with vLLM's reason on one line."""
        self.close()
        v = self._v
        c = config
        if c.max_model_len > MAX_MODEL_LEN:
            # vLLM's Request holds every prompt token id in a Python list.
            raise ValueError(f"config.max_model_len: = {c.max_model_len} is beyond what the vLLM adapter "
                             f"runs ({MAX_MODEL_LEN}): vLLM keeps every token id of a prompt in memory")
        try:
            scheduler_config = v["SchedulerConfig"](
                is_encoder_decoder=False, **{f: getattr(c, f) for f in SCHEDULER_CONFIG_FIELDS})
            model_config = v["ModelConfig"](
                model=_model_dir(c.max_model_len) if isinstance(c.max_model_len, int) else "",
                skip_tokenizer_init=True,
                max_model_len=c.max_model_len,
                dtype="float16",
                seed=42,
            )
            cache_config = v["CacheConfig"](
                block_size=c.block_size,
                enable_prefix_caching=c.enable_prefix_caching,
            )
            with _platform_keeps_async_scheduling():
                vllm_config = v["VllmConfig"](
                    scheduler_config=scheduler_config,
                    model_config=model_config,
                    cache_config=cache_config,
                )
            # The engine core resolves the physical KV layout before sizing the
            # pool (v1/attention/backends/utils.py:293); a pre-set value is
            # honoured as is.  One block is one page whatever the layout.
            if vllm_config.cache_config.kv_cache_layout is None:
                vllm_config.cache_config.kv_cache_layout = "LBNHC"
            block_size = vllm_config.cache_config.block_size
            kv_spec = v["FullAttentionSpec"](
                block_size=block_size, num_kv_heads=1, head_size=1, dtype=v["torch"].float32)
            # EngineCore's start-up check (kv_cache_planning.py:151): a pool of
            # num_gpu_blocks pages, less the null block, must hold one
            # max_model_len sequence.
            try:
                v["check_enough_kv_cache_memory"](
                    vllm_config, {"layer": kv_spec}, c.num_gpu_blocks * kv_spec.page_size_bytes)
            except ValueError as e:
                need = -(-c.max_model_len // block_size)
                raise ValueError(
                    f"engine start-up check: num_gpu_blocks = {c.num_gpu_blocks} leaves "
                    f"{c.num_gpu_blocks - 1} usable blocks, fewer than the {need} one "
                    f"max_model_len ({c.max_model_len}) sequence needs at block_size {block_size}. "
                    f"vLLM says: {e}") from None
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            raise ValueError(_one_line(e)) from None

        # What vLLM resolved (pydantic takes 1, "yes", ... as true; None = auto).
        want_async = bool(vllm_config.scheduler_config.async_scheduling)
        want_caching = bool(vllm_config.cache_config.enable_prefix_caching)
        scheduler_cls = vllm_config.scheduler_config.get_scheduler_cls()
        expected_cls = v["AsyncScheduler"] if want_async else v["Scheduler"]
        # EngineCore keeps max_concurrent_batches batches in flight (core.py:208);
        # formats.md's async engine loop is written for two.
        expected_batches = 2 if want_async else 1
        if scheduler_cls is not expected_cls or vllm_config.max_concurrent_batches != expected_batches:
            raise RuntimeError(
                f"vLLM adapter: async_scheduling={want_async} gives {scheduler_cls.__name__} with "
                f"max_concurrent_batches={vllm_config.max_concurrent_batches}; expected "
                f"{expected_cls.__name__} with {expected_batches}")

        kv_cache_config = v["KVCacheConfig"](
            num_blocks=c.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[v["KVCacheGroupSpec"](["layer"], kv_spec)],
        )
        vllm_config.cache_config.num_gpu_blocks = c.num_gpu_blocks
        sched = scheduler_cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=v["StructuredOutputManager"](vllm_config),
            block_size=block_size,
            # One full-attention group: EngineCore's resolve_kv_cache_block_sizes
            # (core.py:176) gives hash block size = block size.
            hash_block_size=block_size,
            log_stats=True,
        )
        self._block_hasher = None
        if want_caching:
            # As EngineCore does (v1/engine/core.py:219-230).
            hash_fn = v["get_hash_fn_by_name"](vllm_config.cache_config.prefix_caching_hash_algo)
            v["init_none_hash"](hash_fn)
            self._block_hasher = v["get_request_block_hasher"](
                block_size, hash_fn, vllm_config.num_hash_lookahead_tokens)

        # vLLM keeps the ids preempted in a step in a set; record the order of
        # `_preempt_request` calls instead (S:1799).
        original = sched._preempt_request
        preempted = self._preempted

        def _preempt_request(request, *args, **kwargs):
            preempted.append(request.request_id)
            return original(request, *args, **kwargs)

        sched._preempt_request = _preempt_request
        self.sched = sched
        self.config = config
        self._vllm_config = vllm_config
        self._in_flight = {}
        self._finish_order = []
        self._token_seq = 0

    # -- the four scheduler calls ------------------------------------------

    def add_request(self, request: Request) -> None:
        v = self._v
        params = v["SamplingParams"](max_tokens=request.max_tokens)
        # 0.33.0's Request takes no eos_token_id; the engine front end puts EOS
        # into SamplingParams (sampling_params.py:775, `_eos_token_id`), which
        # check_stop reads (sched/utils.py:121).
        params.update_from_generation_config({}, eos_token_id=EOS_TOKEN_ID)
        kwargs = {}
        if self._block_hasher is not None:
            # The prompt decides which blocks are shared: the spec's own tokens.
            if len(request.prompt_token_ids) != request.num_prompt_tokens:
                raise ValueError(f"request {request.request_id}: prefix caching needs its "
                                 f"{request.num_prompt_tokens} prompt token ids")
            prompt = list(request.prompt_token_ids)
            kwargs["block_hasher"] = self._block_hasher
        else:
            # Distinct first tokens: no two requests share a prompt prefix.
            self._token_seq += 1
            first = 3 + (self._token_seq % 50000)
            prompt = [first] + [(first + k) % 50000 + 3 for k in range(1, request.num_prompt_tokens)]
        req = v["Request"](
            request_id=request.request_id,
            prompt_token_ids=prompt,
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(request.arrival_time),
            priority=request.priority,
            **kwargs,
        )
        self.sched.add_request(req)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[str]:
        ids = list(request_ids)
        done = self.sched.finish_requests(ids, self._v["RequestStatus"][status.name])
        finished = {r.request_id for r in done}
        out = [rid for rid in dict.fromkeys(ids) if rid in finished]
        self._finish_order.extend(out)
        return out

    def schedule(self) -> SchedulerOutput:
        sched = self.sched
        pre_status = None
        if sched.use_v2_model_runner:  # resumed requests then travel as new ones
            pre_status = {rid: r.status.name for rid, r in sched.requests.items()}
        self._preempted.clear()
        out = sched.schedule()
        # schedule() hands the finished ids to this batch and starts a new set
        # (S:1876); keep only those finished since.
        self._finish_order = [rid for rid in self._finish_order if rid in sched.finished_req_ids]
        grants = tuple(out.num_scheduled_tokens.items())  # insertion order = grant order
        new = [d.req_id for d in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        resumed = [rid for rid in cached.req_ids if rid in cached.resumed_req_ids]
        running = [rid for rid in cached.req_ids if rid not in cached.resumed_req_ids]
        # The tokens each admitted request found in the prefix cache: its
        # num_computed_tokens as admission set it, which the output records
        # before _update_after_schedule advances it (S:1641-1677, 1937-1966).
        hits_at = {d.req_id: d.num_computed_tokens for d in out.scheduled_new_reqs}
        hits_at.update((rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens)
                       if rid in cached.resumed_req_ids)
        if pre_status is not None:
            resumed = [rid for rid in new if pre_status.get(rid) == "PREEMPTED"] + resumed
            new = [rid for rid in new if pre_status.get(rid) != "PREEMPTED"]
        preempted = tuple(self._preempted)
        # Consistency of what we read back from vLLM's objects.
        if set(preempted) != set(out.preempted_req_ids) or len(set(preempted)) != len(preempted):
            raise RuntimeError(f"vLLM adapter: preemption record {preempted} does not match "
                               f"vLLM's preempted_req_ids {sorted(out.preempted_req_ids)}")
        granted = [rid for rid, _ in grants]
        admitted = set(new) | set(resumed)
        admission_order = [rid for rid in granted if rid in admitted]
        if granted != running + admission_order or \
                sorted(granted) != sorted(running + new + resumed):
            raise RuntimeError(f"vLLM adapter: grant order {granted} is not the running loop's "
                               f"{running} followed by admissions {new + resumed}")
        prefix_hits = ()
        if self._block_hasher is not None:
            prefix_hits = tuple((rid, hits_at[rid]) for rid in admission_order)
        output = SchedulerOutput(
            num_scheduled_tokens=grants,
            scheduled_new_reqs=tuple(new),
            scheduled_resumed_reqs=tuple(resumed),
            scheduled_running_reqs=tuple(running),
            preempted_req_ids=preempted,
            prefix_hits=prefix_hits,
        )
        self._in_flight[id(output)] = (output, out)
        return output

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, Sequence[int]]
    ) -> list[tuple[str, RequestStatus]]:
        entry = self._in_flight.pop(id(output), None)
        if entry is None or entry[0] is not output:
            raise RuntimeError("update_from_output() for an output this scheduler did not return "
                               "from schedule(), or one already applied")
        vout = entry[1]
        req_ids = list(vout.num_scheduled_tokens)
        held = {rid: self.sched.requests.get(rid) for rid in req_ids}
        was_finished = {rid for rid, r in held.items() if r is None or r.is_finished()}
        runner_output = self._v["ModelRunnerOutput"](
            # The model runner reports every request of the batch; one that
            # samples nothing (a prefill chunk, or dropped meanwhile) gets [].
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[list(sampled_token_ids.get(rid, ())) for rid in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
        )
        self.sched.update_from_output(vout, runner_output)
        finished = []
        for rid in req_ids:
            r = held[rid]
            if rid in was_finished or not r.is_finished():
                continue
            finished.append((rid, RequestStatus[r.status.name]))
        self._finish_order.extend(rid for rid, _ in finished)
        return finished

    # -- state --------------------------------------------------------------

    def observe(self) -> SchedulerState:
        sched = self.sched
        caching = self._block_hasher is not None
        requests = {}
        for rid, r in sched.requests.items():
            if r.is_finished():
                continue
            extra = {}
            if caching:
                extra = dict(prompt_token_ids=tuple(r.prompt_token_ids),
                             block_hashes=tuple(r.block_hashes),
                             partial_block_token_ids=tuple(
                                 r.all_token_ids[len(r.block_hashes) * self.config.block_size:]))
            requests[rid] = Request(request_id=rid, status=RequestStatus[r.status.name], **extra,
                                    **{f: getattr(r, f) for f in SHARED_REQUEST_FIELDS})
        # Pop order: block holders are drained first (S:1064-1066); iterating
        # a priority queue yields heap order (request_queue.py:193).
        waiting = tuple(r.request_id for r in sched.kv_holding_waiting) + \
            tuple(r.request_id for r in sched.waiting)
        kv = sched.kv_cache_manager
        blocks = {}
        for manager in kv.coordinator.single_type_managers:
            for rid, blks in manager.req_to_blocks.items():
                if blks:
                    blocks[rid] = max(blocks.get(rid, 0), len(blks))
        vset = sched.finished_req_ids
        finished_ids = [rid for rid in dict.fromkeys(self._finish_order) if rid in vset]
        finished_ids += sorted(set(vset) - set(finished_ids))
        return SchedulerState(
            config=self.config,
            requests=requests,
            running=tuple(r.request_id for r in sched.running),
            waiting=waiting,
            kv_cache=(self._block_pool() if caching
                      else BlockCounts(kv.block_pool.get_num_free_blocks(), blocks)),
            finished_req_ids=tuple(finished_ids),
        )

    def _block_pool(self) -> BlockPool:
        """vLLM's pool in the spec's terms (spec/block_pool.py): the whole free
        queue in pop order as `free_front` (kv_cache_utils.py:486), block ids and
        hashes as vLLM has them, hash keys without their group id."""
        kv = self.sched.kv_cache_manager
        pool = kv.block_pool
        (manager,) = kv.coordinator.single_type_managers  # one full-attention group
        get_hash = self._v["get_block_hash"]
        if pool.cached_block_hashes_by_block:
            # Only partial-block caching (hash block < block size) adds these.
            raise RuntimeError("vLLM adapter: a block carries a second prefix-cache hash")
        # Held blocks are those in some block table; hashed ones those in the
        # hash map (a block's hash and its map entry are set and reset together,
        # block_pool.py:630-686), so neither needs a pass over the whole pool.
        req_to_blocks = {rid: tuple(blks) for rid, blks in manager.req_to_blocks.items() if blks}
        ref_cnt = {b.block_id: b.ref_cnt for blks in req_to_blocks.values() for b in blks if not b.is_null}
        block_hash, cached = {}, {}
        for key, entry in pool.cached_block_hash_to_block._cache.items():
            blks = (entry,) if hasattr(entry, "block_id") else tuple(entry.values())
            h = get_hash(key)
            cached[h] = tuple(b.block_id for b in blks)
            block_hash.update((b.block_id, h) for b in blks)
        free = []
        b = pool.free_block_queue.fake_free_list_head.next_free_block
        while b.next_free_block is not None:  # the fake tail has none (kv_cache_utils.py:486-505)
            free.append(b.block_id)
            b = b.next_free_block
        return BlockPool(
            num_gpu_blocks=pool.num_gpu_blocks,
            free_front=tuple(free),
            next_fresh=pool.num_gpu_blocks,
            free_back=(),
            ref_cnt=ref_cnt,
            block_hash=block_hash,
            cached=cached,
            req_to_blocks={rid: tuple(b.block_id for b in blks) for rid, blks in req_to_blocks.items()},
            num_cached_block=dict(manager.num_cached_block),
        )

    def close(self) -> None:
        if self.sched is not None:
            try:
                self.sched.shutdown()
            except Exception:  # noqa: BLE001 - nothing to release in the core scope
                pass
        self.sched = None
        self._in_flight = {}
