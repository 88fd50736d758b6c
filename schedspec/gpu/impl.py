"""`--impl torch`: the batched scheduler of gpu/step.py at S = 1 behind the
implementation protocol of reference/impl.py.

It is the same tensor code as `run_batch`, not a second implementation: the
protocol's calls map onto step.py's functions (finish_requests -> abort,
add_request -> arrive, schedule, update_from_output -> update).  Requests arrive
one at a time here, so the request slots grow (doubling) and the priority ranks
are recomputed on the host at each arrival.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

import torch

from schedspec.spec.config import ConfigError, SchedulerConfig, validate_config
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerOutput, SchedulerState
from .batch import build_batch, config_row, request_ranks
from .device import resolve_device
from .limits import limit_violation
from .state import I64, PREEMPTED, RUNNING, WAITING, Decision, grow, initial_state
from .step import abort, arrive, finish, schedule, update, waiting_key


class TorchScheduler:
    name = "torch"

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
        self.batch = build_batch([config_row(config)], [{k: [] for k in (
            "valid", "num_prompt_tokens", "max_tokens", "output_len", "arrival_step", "abort_step",
            "queue_rank", "victim_rank")}], self.device)
        self.state = initial_state(self.batch)
        self.step = 0
        self._decision: Decision | None = None
        self._active = torch.ones(1, dtype=torch.bool, device=self.device)

    def add_request(self, request: Request) -> None:
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
        mask = torch.zeros((1, R), dtype=torch.bool, device=dev)
        mask[0, j] = True
        self.state = arrive(self.batch, self.state, mask)

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
            if status == RequestStatus.FINISHED_ABORTED:
                self.state, _ = abort(self.state, self._mask(done), self.step)
            else:
                self.state = finish(self.state, self._mask(done), int(status), self.step)
        return tuple(done)

    def schedule(self) -> SchedulerOutput:
        decision, self.state = schedule(self.batch, self.state, self._active)
        self._decision = decision
        ids = [r.request_id for r in self.requests]
        n = len(ids)
        grant = decision.num_scheduled_tokens[0, :n].tolist()
        admitted = decision.admitted[0, :n].tolist()
        preempt = decision.preempt_order[0, :n].tolist()
        run_pos = self.state.run_pos[0, :n].tolist()
        granted = sorted((j for j in range(n) if grant[j] > 0), key=run_pos.__getitem__)
        return SchedulerOutput(
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
            if tokens and rid in self.slot:
                sampled[0, self.slot[rid]] = True
                eos[0, self.slot[rid]] = tokens[0] == EOS_TOKEN_ID
        before = self.state.status[0].tolist()
        self.state = update(self.batch, self.state, sampled, eos, self.step)
        after = self.state.status[0].tolist()
        self.step += 1
        finished = []
        for rid, _ in output.num_scheduled_tokens:
            j = self.slot.get(rid)
            if j is not None and before[j] <= PREEMPTED < after[j]:
                finished.append((rid, RequestStatus(after[j])))
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
        running = sorted((j for j in live if status[j] == RUNNING), key=run_pos.__getitem__)
        waiting = sorted((j for j in live if status[j] != RUNNING), key=wkey.__getitem__)
        return SchedulerState(
            config=self.config, requests=requests,
            running=tuple(self.requests[j].request_id for j in running),
            waiting=tuple(self.requests[j].request_id for j in waiting),
            kv_cache=BlockCounts(int(s.num_free_blocks[0]),
                                 {self.requests[j].request_id: blocks[j] for j in live if blocks[j] > 0}))

    def close(self) -> None:
        pass
