"""The symbolic scheduler state: a fixed set of request slots with z3 fields.

A `SymState` mirrors `spec.state.SchedulerState`: each slot is one request that
may or may not be present, with its queue (running or waiting) and its position
in that queue as symbolic integers, so a step only rewrites fields and
positions and never moves data between slots.  That makes steps composable
(bounded model checking unrolls them) and lets a later extension add fields
(prefix-cache hits, async placeholders) without changing the layout.

Names follow vLLM and the spec: `num_computed_tokens`, `num_output_tokens`, ...
Request ids are represented by their rank in string order (`rid_rank`), arrival
times by their rank (ties kept), which preserves every comparison the spec
makes (queue_key, priority_key).

`from_concrete` builds the z3 constants <-> concrete values substitution the
agreement tests use; `config_constraints` is vLLM's acceptance of a config
(spec/config.py `validate_config`) over the symbolic config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import z3

from schedspec.spec.config import PRIORITY, SchedulerConfig
from schedspec.spec.request import RequestStatus
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState

from .release import DEFAULT, Release

# The small sets the symbolic config draws block_size and watermark from.
BLOCK_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
# watermark -> (numerator, denominator) of int(watermark * num_gpu_blocks) (K:210).
WATERMARKS = {0.0: (0, 1), 0.1: (1, 10), 0.3: (3, 10)}

WAITING = int(RequestStatus.WAITING)
RUNNING = int(RequestStatus.RUNNING)
PREEMPTED = int(RequestStatus.PREEMPTED)


def cdiv_const(x, b: int):
    return x if b == 1 else (x + (b - 1)) / b


@dataclass(frozen=True)
class SymConfig:
    """A symbolic SchedulerConfig: `token_budget` is max_num_scheduled_tokens or,
    when null, max_num_batched_tokens (any value covers both);
    `max_num_active_reqs` likewise."""

    max_num_batched_tokens: Any
    token_budget: Any
    max_num_seqs: Any
    max_num_active_reqs: Any
    enable_chunked_prefill: Any  # Bool
    long_prefill_token_threshold: Any
    is_priority: Any  # Bool: policy == "priority"
    watermark_index: Any  # index into WATERMARKS
    scheduler_reserve_full_isl: Any  # Bool
    max_model_len: Any
    block_size: Any
    num_gpu_blocks: Any
    block_sizes: tuple[int, ...] = BLOCK_SIZES
    release: Release = DEFAULT  # the vLLM release whose rules the encodings apply to this config

    @staticmethod
    def fresh(prefix: str = "c", block_sizes: tuple[int, ...] = BLOCK_SIZES, *, release: Release) -> "SymConfig":
        I, B = z3.Int, z3.Bool
        return SymConfig(
            I(f"{prefix}.max_num_batched_tokens"), I(f"{prefix}.token_budget"), I(f"{prefix}.max_num_seqs"),
            I(f"{prefix}.max_num_active_reqs"), B(f"{prefix}.enable_chunked_prefill"),
            I(f"{prefix}.long_prefill_token_threshold"), B(f"{prefix}.is_priority"),
            I(f"{prefix}.watermark_index"), B(f"{prefix}.scheduler_reserve_full_isl"),
            I(f"{prefix}.max_model_len"), I(f"{prefix}.block_size"), I(f"{prefix}.num_gpu_blocks"),
            block_sizes, release)

    def cdiv(self, x):
        """cdiv(x, block_size) over the block-size set: division by constants only."""
        out = cdiv_const(x, self.block_sizes[-1])
        for b in reversed(self.block_sizes[:-1]):
            out = z3.If(self.block_size == b, cdiv_const(x, b), out)
        return out

    @property
    def watermark_blocks(self):
        out = z3.IntVal(0)
        for i, (_, (num, den)) in enumerate(WATERMARKS.items()):
            if num:
                out = z3.If(self.watermark_index == i, (self.num_gpu_blocks * num) / den, out)
        return out

    @property
    def num_usable_blocks(self):
        return self.num_gpu_blocks - 1

    def constraints(self):
        """What the modelled release accepts (spec/config.py validate_config;
        proofs/release.py says what its proofs leave out)."""
        c = self
        threshold_check = c.release.checks_config("long_prefill_token_threshold_at_most_max_model_len")
        lacking = c.release.fields_lacking()  # a field the release lacks has its older meaning
        return z3.And(
            c.max_num_active_reqs == c.max_num_seqs if "max_num_active_seqs" in lacking else True,
            c.watermark_index == 0 if "watermark" in lacking else True,
            c.max_num_batched_tokens >= 1, c.token_budget >= 1, c.max_num_seqs >= 1,
            c.max_num_active_reqs >= 1, c.max_num_active_reqs <= c.max_num_seqs,
            c.long_prefill_token_threshold >= 0, c.max_model_len >= 1,
            z3.Or([c.block_size == b for b in c.block_sizes]),
            c.watermark_index >= 0, c.watermark_index < len(WATERMARKS),
            z3.Or(c.enable_chunked_prefill, c.max_num_batched_tokens >= c.max_model_len),
            c.max_num_batched_tokens >= c.max_num_seqs,
            c.long_prefill_token_threshold <= c.max_model_len if threshold_check else True,
            c.num_gpu_blocks - 1 >= c.cdiv(c.max_model_len),
        )

    def leaves(self) -> list:
        return [getattr(self, f.name) for f in fields(self) if f.name not in ("block_sizes", "release")]


@dataclass(frozen=True)
class SymSlot:
    """One request slot.  `running` is its queue (False = waiting) when present;
    `pos` its 0-based position there.  `output_len` is the fake model's EOS
    position (0 = never), part of the scenario rather than of vLLM's state."""

    present: Any
    running: Any
    pos: Any
    rid_rank: Any
    num_prompt_tokens: Any
    max_tokens: Any
    output_len: Any
    priority: Any
    arrival: Any
    status: Any  # RequestStatus value: WAITING, RUNNING or PREEMPTED
    num_computed_tokens: Any
    num_output_tokens: Any
    num_preemptions: Any
    num_blocks: Any

    @staticmethod
    def fresh(prefix: str) -> "SymSlot":
        return SymSlot(z3.Bool(f"{prefix}.present"), z3.Bool(f"{prefix}.running"),
                       *(z3.Int(f"{prefix}.{f.name}") for f in fields(SymSlot)[2:]))

    @property
    def num_tokens(self):
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def in_running(self):
        return z3.And(self.present, self.running)

    @property
    def in_waiting(self):
        return z3.And(self.present, z3.Not(self.running))

    def evolve(self, **changes) -> "SymSlot":
        return replace(self, **changes)

    def leaves(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]


def key_lt(a: SymSlot, b: SymSlot):
    """a.queue_key < b.queue_key: (priority, arrival_time, request_id) (RQ:409-419)."""
    return z3.Or(a.priority < b.priority,
                 z3.And(a.priority == b.priority,
                        z3.Or(a.arrival < b.arrival, z3.And(a.arrival == b.arrival, a.rid_rank < b.rid_rank))))


def priority_key_le(a: SymSlot, b: SymSlot):
    """a.priority_key <= b.priority_key: (priority, arrival_time) (S:948-952)."""
    return z3.Or(a.priority < b.priority, z3.And(a.priority == b.priority, a.arrival <= b.arrival))


@dataclass(frozen=True)
class SymState:
    config: SymConfig
    slots: tuple[SymSlot, ...]
    num_free_blocks: Any

    @staticmethod
    def fresh(num_slots: int, prefix: str, config: SymConfig) -> "SymState":
        return SymState(config,
                        tuple(SymSlot.fresh(f"{prefix}.{i}") for i in range(num_slots)),
                        z3.Int(f"{prefix}.num_free_blocks"))

    @staticmethod
    def empty(config: SymConfig, num_slots: int) -> "SymState":
        F, Z = z3.BoolVal(False), z3.IntVal(0)
        slot = SymSlot(F, F, Z, Z, Z, Z, Z, Z, Z, z3.IntVal(WAITING), Z, Z, Z, Z)
        return SymState(config, tuple(slot for _ in range(num_slots)), config.num_usable_blocks)

    @property
    def num_running(self):
        return z3.Sum([z3.If(s.in_running, 1, 0) for s in self.slots])

    @property
    def num_waiting(self):
        return z3.Sum([z3.If(s.in_waiting, 1, 0) for s in self.slots])

    def leaves(self) -> list:
        out = self.config.leaves() + [self.num_free_blocks]
        for s in self.slots:
            out += s.leaves()
        return out


def fixed_roles(state: SymState, running_slots, waiting_slots):
    """Symmetry reduction for one-step claims: slots `running_slots` may only be
    running and `waiting_slots` only waiting (any state with at most that many of
    each is a relabelling of one of these)."""
    out = []
    for i in running_slots:
        out.append(z3.Implies(state.slots[i].present, state.slots[i].running))
    for i in waiting_slots:
        out.append(z3.Implies(state.slots[i].present, z3.Not(state.slots[i].running)))
    return z3.And(out)


# --- concrete <-> symbolic ------------------------------------------------------------------


def dense_rank(values) -> dict:
    return {v: i for i, v in enumerate(sorted(set(values)))}


def config_values(config: SchedulerConfig) -> dict[str, Any]:
    if config.block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size {config.block_size} is outside the encoding's set {BLOCK_SIZES}")
    if config.watermark not in WATERMARKS:
        raise ValueError(f"watermark {config.watermark} is outside the encoding's set {tuple(WATERMARKS)}")
    return dict(
        max_num_batched_tokens=config.max_num_batched_tokens, token_budget=config.token_budget,
        max_num_seqs=config.max_num_seqs, max_num_active_reqs=config.max_num_active_reqs,
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        is_priority=config.policy == PRIORITY, watermark_index=list(WATERMARKS).index(config.watermark),
        scheduler_reserve_full_isl=config.scheduler_reserve_full_isl, max_model_len=config.max_model_len,
        block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks)


_VALS: dict = {}


def const_val(v):
    key = (type(v) is bool, v)
    if key not in _VALS:
        _VALS[key] = z3.BoolVal(v) if isinstance(v, bool) else z3.IntVal(v)
    return _VALS[key]


def slot_assignment(state: SchedulerState, running_slots, waiting_slots, extra_ids=()) -> dict[str, int]:
    """request id -> slot index: running requests in running order into
    `running_slots`, waiting ones in queue order into `waiting_slots`."""
    if len(state.running) > len(running_slots) or len(state.waiting) > len(waiting_slots):
        raise ValueError("state does not fit the slots")
    out = {rid: running_slots[i] for i, rid in enumerate(state.running)}
    out.update({rid: waiting_slots[i] for i, rid in enumerate(state.waiting)})
    return out


def config_substitution(sym: SymConfig, config: SchedulerConfig) -> list[tuple]:
    """Pairs (z3 constant, value) that make `sym` the concrete `config`."""
    return [(getattr(sym, f), const_val(v)) for f, v in config_values(config).items()]


def substitution(sym: SymState, state: SchedulerState, slot_of: dict[str, int],
                 output_len: dict[str, int | None], all_ids=(), all_arrivals=()) -> list[tuple]:
    """Pairs (z3 constant, value) that make `sym` the concrete `state`.
    `all_ids` / `all_arrivals` extend the rank domains (e.g. with a request about
    to be added)."""
    pairs = config_substitution(sym.config, state.config)
    pairs.append((sym.num_free_blocks, z3.IntVal(state.num_free_blocks)))
    rid_rank = dense_rank(list(state.requests) + list(all_ids))
    arr_rank = dense_rank([r.arrival_time for r in state.requests.values()] + list(all_arrivals))
    pos = {rid: i for i, rid in enumerate(state.running)}
    pos.update({rid: i for i, rid in enumerate(state.waiting)})
    by_slot = {i: rid for rid, i in slot_of.items()}
    for i, s in enumerate(sym.slots):
        rid = by_slot.get(i)
        if rid is None or rid not in state.requests:
            vals = dict(present=False, running=False, pos=0, rid_rank=0, num_prompt_tokens=1, max_tokens=1,
                        output_len=0, priority=0, arrival=0, status=WAITING, num_computed_tokens=0,
                        num_output_tokens=0, num_preemptions=0, num_blocks=0)
        else:
            r = state.requests[rid]
            vals = dict(present=True, running=rid in state.running, pos=pos[rid], rid_rank=rid_rank[rid],
                        num_prompt_tokens=r.num_prompt_tokens, max_tokens=r.max_tokens,
                        output_len=output_len.get(rid) or 0, priority=r.priority,
                        arrival=arr_rank[r.arrival_time], status=int(r.status),
                        num_computed_tokens=r.num_computed_tokens, num_output_tokens=r.num_output_tokens,
                        num_preemptions=r.num_preemptions, num_blocks=state.num_blocks(rid))
        for f, v in vals.items():
            pairs.append((getattr(s, f), const_val(v)))
    return pairs


class Evaluator:
    """Evaluates many z3 terms under one substitution in a single pass: they are
    packed as the arguments of one uninterpreted function application, so the
    shared term graph is substituted and simplified once."""

    def __init__(self, terms: list):
        self.terms = [z3.If(t, 1, 0) if z3.is_bool(t) else t for t in terms]
        self.is_bool = [z3.is_bool(t) for t in terms]
        self.pack = z3.Function("pack", *([z3.IntSort()] * len(terms)), z3.IntSort())
        self.app = self.pack(*self.terms) if terms else None

    def __call__(self, pairs: list[tuple]) -> list:
        # The C API directly: z3.substitute's per-pair Python checks and one wrapper
        # object per argument cost more than the evaluation itself.
        n = len(pairs)
        src = (z3.Ast * n)()
        dst = (z3.Ast * n)()
        for i, (a, b) in enumerate(pairs):
            src[i] = a.as_ast()
            dst[i] = b.as_ast()
        ctx = self.app.ctx
        sub = z3.Z3_substitute(ctx.ref(), self.app.as_ast(), n, src, dst)
        out = z3.Z3_simplify(ctx.ref(), sub)
        text = z3.Z3_ast_to_string(ctx.ref(), out)
        tokens = text.replace("(- ", "(-").replace("(", " ").replace(")", " ").split()
        if tokens[0] != "pack" or len(tokens) != len(self.terms) + 1:
            raise ValueError(f"the terms did not all evaluate to values: {text[:300]}")
        vals = []
        for k, tok in enumerate(tokens[1:]):
            v = int(tok)
            vals.append(bool(v) if self.is_bool[k] else v)
        return vals


def concrete_state(data: dict, release: Release) -> tuple[SchedulerState, dict[str, int | None]]:
    """The `SchedulerState` (and fake-model output lengths) of a model dump
    (proofs/obligations.py model_state) of `release`'s encoding; ids "q<rank>"."""
    from schedspec.spec.config import FCFS
    from schedspec.spec.request import Request

    cfg = data["config"]
    wm = list(WATERMARKS)[cfg["watermark_index"]]
    config = SchedulerConfig(
        max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_scheduled_tokens=cfg["token_budget"],
        max_num_seqs=cfg["max_num_seqs"],
        # A field the release lacks is left at its older meaning (constraints() pins the value).
        max_num_active_seqs=None if "max_num_active_seqs" in release.fields_lacking() else cfg["max_num_active_reqs"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=PRIORITY if cfg["is_priority"] else FCFS, watermark=wm,
        scheduler_reserve_full_isl=cfg["scheduler_reserve_full_isl"], max_model_len=cfg["max_model_len"],
        block_size=cfg["block_size"], num_gpu_blocks=cfg["num_gpu_blocks"], vllm_version=release.version)
    reqs, blocks, out_len, running, waiting = {}, {}, {}, [], []
    width = max([len(str(r["rid_rank"])) for r in data["requests"]] + [1])
    for r in data["requests"]:
        rid = f"q{r['rid_rank']:0{width}d}"
        reqs[rid] = Request(rid, r["num_prompt_tokens"], r["max_tokens"], r["priority"], float(r["arrival"]),
                            RequestStatus(r["status"]), r["num_computed_tokens"], r["num_output_tokens"],
                            r["num_preemptions"])
        if r["num_blocks"]:
            blocks[rid] = r["num_blocks"]
        out_len[rid] = r["output_len"] or None
        (running if r["running"] else waiting).append((r["pos"], rid))
    return (SchedulerState(config=config, requests=reqs, running=tuple(x for _, x in sorted(running)), waiting=tuple(x for _, x in sorted(waiting)), kv_cache=BlockCounts(data["num_free_blocks"], blocks)), out_len)
