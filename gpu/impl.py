"""`--impl torch`: the batched scheduler of gpu/step.py at S = 1 behind the
implementation protocol of reference/impl.py.

It is the same tensor code as `run_batch`, not a second implementation: the
protocol's calls map onto step.py's functions (finish_requests -> abort,
add_request -> arrive, schedule, update_from_output -> update, or with async
scheduling -> deliver, for the batch the output names).  Requests arrive
one at a time here, so the request slots grow (doubling) and the priority ranks
are recomputed on the host at each arrival.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

import torch

from schedspec.spec.config import ConfigError, SchedulerConfig, validate_config
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.block_pool import BlockPool
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerOutput, SchedulerState
from schedspec.spec.versions import UNHASHED_FREE_BLOCKS_FIRST, has
from .batch import build_batch, config_row, request_ranks
from .device import resolve_device
from .hashes import OUTPUT_TOKEN_ID, block_hash_bytes, chain_ids
from .limits import UNMODELLED_FEATURES, limit_violation, unmodelled_in_request
from .pool import BACK, HELD, grow_requests
from .state import I64, PREEMPTED, RUNNING, WAITING, Decision, grow, initial_state
from .step import abort, arrive, deliver, finish, schedule, update, waiting_key


class TorchScheduler:
    name = "torch"
    models_kv_connector_hits = False  # scenarios with kv_connector_tokens are refused (reference/engine.py)
    models_encoder_inputs = False  # and those with mm_features
    # The features (reference/generator.py FEATURES) random campaigns against torch leave out (gpu/limits.py).
    unmodelled_features = UNMODELLED_FEATURES

    def __init__(self, device: str | None = None) -> None:
        self.device = resolve_device(device)
        self.config: SchedulerConfig | None = None

    def reset(self, config: SchedulerConfig) -> None:
        validate_config(config)
        beyond = limit_violation(config, 0)
        if beyond:
            raise ValueError(beyond)
        self.config = config
        self.requests: list[Request] = []  # by slot, in arrival order
        self.slot: dict[str, int] = {}
        self.prefix = bool(config.enable_prefix_caching)
        prefix = None
        if self.prefix:
            # Hash ids are interned here as requests arrive (gpu/hashes.py), for
            # as many blocks as the requests' tokens fill, growing with them.
            self.hash_table: dict = {}
            self.ids: list[list[int]] = []
            dev = self.device
            prefix = {"block_hashes": torch.full((1, 1, 1), -1, dtype=torch.int32, device=dev),  # R = 1 as build_batch
                      "abort_rank": torch.zeros((1, 1), dtype=I64, device=dev),
                      "unhashed_first": torch.tensor([has(config, UNHASHED_FREE_BLOCKS_FIRST)], device=dev),
                      "num_hashes": 1}
        self.asy = bool(config.async_scheduling)
        if self.asy:
            prefix = {**(prefix or {}), "async_sched": torch.ones(1, dtype=torch.bool, device=self.device)}
        # Ids finished since the last schedule() (only has_requests() reads them: the async engine).
        self.finished_ids: list[str] = []
        self.batch = build_batch([config_row(config)], [{k: [] for k in (
            "valid", "num_prompt_tokens", "max_tokens", "output_len", "arrival_step", "abort_step",
            "queue_rank", "victim_rank")}], self.device, prefix)
        self.state = initial_state(self.batch)
        self.step = 0
        self._decision: Decision | None = None
        self._active = torch.ones(1, dtype=torch.bool, device=self.device)

    def add_request(self, request: Request) -> None:
        unmodelled = unmodelled_in_request(request)  # refused, never ignored
        if unmodelled:
            raise ValueError(unmodelled)
        if request.request_id in self.slot:
            raise ConfigError("id", f"duplicate request id {request.request_id!r}")
        j = len(self.requests)
        if j == self.batch.shape[1]:
            self.batch, self.state = grow(self.batch, self.state, max(j, 1))
        self.requests.append(request)
        self.slot[request.request_id] = j
        queue_rank, victim_rank = request_ranks(self.requests)
        dev = self.device

        def put(t: torch.Tensor, value) -> torch.Tensor:
            t = t.clone()
            t[0, j] = value
            return t

        R = self.batch.shape[1]
        pad = R - len(self.requests)
        b = self.batch
        self.batch = replace(
            b, valid=put(b.valid, True), num_prompt_tokens=put(b.num_prompt_tokens, request.num_prompt_tokens),
            max_tokens=put(b.max_tokens, min(request.max_tokens, self.config.max_model_len)),
            queue_rank=torch.tensor([queue_rank + [0] * pad], dtype=I64, device=dev),
            victim_rank=torch.tensor([victim_rank + [0] * pad], dtype=I64, device=dev))
        if self.prefix:
            self.ids.append([])
            self._extend_hashes([j], [request.num_prompt_tokens])
        mask = torch.zeros((1, R), dtype=torch.bool, device=dev)
        mask[0, j] = True
        self.state = arrive(self.batch, self.state, mask)

    def _extend_hashes(self, slots: Sequence[int], num_tokens: Sequence[int]) -> None:
        """Hash ids for every block the requests in `slots` can fill with
        `num_tokens` tokens (one spare), growing the block positions if needed."""
        c = self.config
        bs = min(c.block_size, c.max_model_len)
        need = {j: -(-min(t, c.max_model_len) // bs) + 2 for j, t in zip(slots, num_tokens)}
        H = self.batch.block_hashes.shape[2]
        if max(need.values()) > H:
            H = max(max(need.values()), 2 * H)
            self.batch, self.state = grow(self.batch, self.state, 0, H)
            slots = range(len(self.requests))  # every request's ids to the new width
        bh = self.batch.block_hashes.clone()
        for j in slots:
            ids = self.ids[j]
            if len(ids) < H:
                ids += chain_ids(self.hash_table, self.requests[j].prompt_token_ids, c.block_size, H, len(ids),
                                 ids[-1] if ids else -1)
                bh[0, j, :H] = torch.tensor(ids[:H], dtype=torch.int32)
        self.batch = replace(self.batch, block_hashes=bh, num_hashes=max(len(self.hash_table), 1))
        self.state = replace(self.state, pool=grow_requests(self.state.pool, 0, H, self.batch.num_hashes))

    def _mask(self, ids: Iterable[str]) -> torch.Tensor:
        mask = torch.zeros(self.batch.shape, dtype=torch.bool, device=self.device)
        for rid in ids:
            mask[0, self.slot[rid]] = True
        return mask

    def _live_ids(self) -> set[str]:
        status = self.state.status[0].tolist()
        return {r.request_id for r, st in zip(self.requests, status) if WAITING <= st <= PREEMPTED}

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> Sequence[str]:
        assert status.is_finished
        live = self._live_ids()
        done: list[str] = []
        for rid in request_ids:
            if rid in live and rid not in done:
                done.append(rid)
        if done:
            for rid in done:  # one after the other: their blocks are freed in this order
                if status == RequestStatus.FINISHED_ABORTED:
                    self.state, _ = abort(self.batch, self.state, self._mask([rid]), self.step)
                else:
                    self.state = finish(self.batch, self.state, self._mask([rid]), int(status), self.step)
        self.finished_ids += done
        return tuple(done)

    def schedule(self) -> SchedulerOutput:
        if self.prefix and self.requests:
            n = len(self.requests)
            nout = self.state.num_output_tokens[0, :n].tolist()
            self._extend_hashes(range(n), [r.num_prompt_tokens + o for r, o in zip(self.requests, nout)])
        decision, self.state = schedule(self.batch, self.state, self._active)
        self._decision = decision
        self.finished_ids = []
        ids = [r.request_id for r in self.requests]
        n = len(ids)
        grant = decision.num_scheduled_tokens[0, :n].tolist()
        admitted = decision.admitted[0, :n].tolist()
        preempt = decision.preempt_order[0, :n].tolist()
        run_pos = self.state.run_pos[0, :n].tolist()
        granted = sorted((j for j in range(n) if grant[j] > 0), key=run_pos.__getitem__)
        hits = ()
        if self.prefix:
            hit = decision.hit_tokens[0, :n].tolist()
            hits = tuple((ids[j], hit[j]) for j in granted if admitted[j] > 0)
        return SchedulerOutput(
            prefix_hits=hits,
            num_scheduled_tokens=tuple((ids[j], grant[j]) for j in granted),
            scheduled_new_reqs=tuple(ids[j] for j in granted if admitted[j] == 1),
            scheduled_resumed_reqs=tuple(ids[j] for j in granted if admitted[j] == 2),
            scheduled_running_reqs=tuple(ids[j] for j in granted if admitted[j] == 0),
            preempted_req_ids=tuple(ids[j] for j in sorted((j for j in range(n) if preempt[j] >= 0),
                                                           key=preempt.__getitem__)),
        )

    def update_from_output(self, output: SchedulerOutput,
                           sampled_token_ids: Mapping[str, Sequence[int]]) -> Sequence[tuple[str, RequestStatus]]:
        sampled = torch.zeros(self.batch.shape, dtype=torch.bool, device=self.device)
        eos = torch.zeros_like(sampled)
        for rid, _ in output.num_scheduled_tokens:
            tokens = list(sampled_token_ids.get(rid, ()))
            if len(tokens) > 1:
                raise ValueError(f"{rid}: {len(tokens)} tokens in one step; the torch implementation "
                                 "samples at most one (no speculative decoding in the core scope)")
            if self.prefix and tokens and tokens[0] not in (EOS_TOKEN_ID, OUTPUT_TOKEN_ID):
                raise ValueError(f"{rid}: token {tokens[0]}: with prefix caching the torch implementation "
                                 f"knows only the fake model's tokens ({EOS_TOKEN_ID}, {OUTPUT_TOKEN_ID})")
            if tokens and rid in self.slot:
                sampled[0, self.slot[rid]] = True
                eos[0, self.slot[rid]] = tokens[0] == EOS_TOKEN_ID
        before = self.state.status[0].tolist()
        if self.asy:
            if self.prefix:  # hash ids for the blocks the tokens about to be appended can fill
                nout = self.state.num_output_tokens[0, :len(self.requests)].tolist()
                self._extend_hashes(range(len(self.requests)),
                                    [r.num_prompt_tokens + o + 1 for r, o in zip(self.requests, nout)])
            # `output` may be a batch scheduled before the last schedule(): its grants
            # and grant order come from the output itself, not from the state.
            grant = torch.zeros(self.batch.shape, dtype=torch.int32, device=self.device)
            key = torch.full(self.batch.shape, 2**62, dtype=I64, device=self.device)
            for k, (rid, n) in enumerate(output.num_scheduled_tokens):
                j = self.slot.get(rid)
                if j is not None:
                    grant[0, j], key[0, j] = n, k
            self.state, _, _ = deliver(self.batch, self.state, grant, sampled, eos, key, self.step)
        else:
            self.state = update(self.batch, self.state, sampled, eos, self.step)
        after = self.state.status[0].tolist()
        self.step += 1
        finished = []
        for rid, _ in output.num_scheduled_tokens:
            j = self.slot.get(rid)
            if j is not None and before[j] <= PREEMPTED < after[j]:
                finished.append((rid, RequestStatus(after[j])))
        self.finished_ids += [rid for rid, _ in finished]
        return tuple(finished)

    def observe(self) -> SchedulerState:
        n = len(self.requests)
        s = self.state
        status = s.status[0, :n].tolist()
        ncomp = s.num_computed_tokens[0, :n].tolist()
        nout = s.num_output_tokens[0, :n].tolist()
        npre = s.num_preemptions[0, :n].tolist()
        blocks = s.num_blocks[0, :n].tolist()
        run_pos = s.run_pos[0, :n].tolist()
        wkey = waiting_key(self.batch, s)[0, :n].tolist()
        live = [j for j in range(n) if WAITING <= status[j] <= PREEMPTED]
        requests = {self.requests[j].request_id: self.requests[j].evolve(
            status=RequestStatus(status[j]), num_computed_tokens=ncomp[j], num_output_tokens=nout[j],
            num_preemptions=npre[j]) for j in live}
        if self.asy:
            ph, inflight, stale = (t[0, :n].tolist() for t in (s.ph, s.inflight, s.stale))
            chunk = s.chunk[0, :n].tolist()
            for j in live:
                rid = self.requests[j].request_id
                requests[rid] = requests[rid].evolve(num_output_placeholders=ph[j], num_in_flight_tokens=inflight[j],
                                                     num_stale_output_tokens=stale[j], is_prefill_chunk=chunk[j])
        if self.prefix:  # the hashes of the full blocks of prompt + outputs, and the rest's ids
            if not hasattr(self, "id_bytes"):
                self.id_bytes = {}
            bs = self.config.block_size
            for j in live:
                t = self.requests[j].num_prompt_tokens + nout[j]
                full = t // bs
                requests[self.requests[j].request_id] = requests[self.requests[j].request_id].evolve(
                    block_hashes=self._hash_bytes(j, full), partial_block_token_ids=self._tokens(j, t)[full * bs:])
        running = sorted((j for j in live if status[j] == RUNNING), key=run_pos.__getitem__)
        waiting = sorted((j for j in live if status[j] != RUNNING), key=wkey.__getitem__)
        return SchedulerState(
            config=self.config, requests=requests,
            running=tuple(self.requests[j].request_id for j in running),
            waiting=tuple(self.requests[j].request_id for j in waiting),
            kv_cache=self._observe_pool(live) if self.prefix else BlockCounts(
                int(s.num_free_blocks[0]), {self.requests[j].request_id: blocks[j] for j in live if blocks[j] > 0}),
            finished_req_ids=tuple(self.finished_ids))

    def _tokens(self, j: int, n: int) -> tuple:
        r = self.requests[j]
        return tuple(r.prompt_token_ids[:n]) + (OUTPUT_TOKEN_ID,) * max(0, n - r.num_prompt_tokens)

    def _hash_bytes(self, j: int, n: int) -> tuple:
        """formats.md's hashes of request j's first n blocks (cached per hash id)."""
        out, parent, bs = [], None, self.config.block_size
        for i, hid in enumerate(self.ids[j][:n]):
            b = self.id_bytes.get(hid)
            if b is None:
                b = self.id_bytes[hid] = block_hash_bytes(parent, self._tokens(j, (i + 1) * bs)[i * bs:])
            out.append(b)
            parent = b
        return tuple(out)

    def _observe_pool(self, live: list[int]) -> BlockPool:
        """The block-level pool as the spec's BlockPool (formats.md kv_cache "blocks"):
        vLLM's block ids (slot + 1), the free queue, hashes as formats.md's bytes."""
        if not hasattr(self, "id_bytes"):
            self.id_bytes: dict[int, bytes] = {}
        p, c = self.state.pool, self.config
        ref, bhash, cstamp, fkey = (t[0].tolist() for t in (p.ref, p.bhash, p.cstamp, p.fkey))
        W = len(ref)
        byte_of: dict[int, bytes] = {}
        nblocks = self.state.num_blocks[0].tolist()
        ncached = p.ncached[0].tolist()
        req_to_blocks, num_cached = {}, {}
        for j in live:
            if nblocks[j] > 0:
                rid = self.requests[j].request_id
                req_to_blocks[rid] = tuple(b + 1 for b in p.table[0, j, :nblocks[j]].tolist())
                if ncached[j] > 0:  # the spec's map has no entry for "none cached yet"
                    num_cached[rid] = ncached[j]
        for j in range(len(self.requests)):  # the bytes of every hash id a request can have
            for hid, b in zip(self.ids[j], self._hash_bytes(j, len(self.ids[j]))):
                byte_of[hid] = b
        free = sorted((fkey[k], k + 1) for k in range(W) if fkey[k] < HELD)
        front = tuple(b for key, b in free if key < 0)
        fresh = [b for key, b in free if 0 < key < BACK]
        back = tuple(b for key, b in free if key >= BACK)
        next_fresh = fresh[0] if fresh else min(W + 1, c.num_gpu_blocks)
        block_hash = {k + 1: byte_of[bhash[k]] for k in range(W) if bhash[k] >= 0}
        cached: dict[bytes, tuple] = {}
        for stamp, k in sorted((cstamp[k], k) for k in range(W) if bhash[k] >= 0):
            cached[block_hash[k + 1]] = cached.get(block_hash[k + 1], ()) + (k + 1,)
        return BlockPool(c.num_gpu_blocks, front, next_fresh, back,
                         {k + 1: ref[k] for k in range(W) if ref[k] > 0}, block_hash, cached, req_to_blocks,
                         num_cached, has(c, UNHASHED_FREE_BLOCKS_FIRST))

    def close(self) -> None:
        pass
