"""Run many scenarios as one torch batch and write each one's trace, in exactly
the format `reference.engine.run_scenario` writes (formats.md, schedspec.trace/1).

The host does what needs Python objects: it validates each scenario (the spec's
config and front-end checks, then gpu/limits.py), turns `priority` and
`arrival_time` into ranks, pads the scenarios into one `Batch`, and turns the
per-step records into trace text.  The device steps every scenario at once
(gpu/step.py) and hands a few tensors per step to the host, in chunks, so there
is one host copy per chunk of steps rather than one per step and field; each
chunk becomes the JSON text of its trace steps column by column
(gpu/trace_text.py), with no Python object per step.  `run_batch_traces`
returns that text (`TorchTrace`: written to disk or compared as it is),
`stream_batch_traces` hands each trace over as soon as its scenario has run,
`write_batch_traces` writes the trace files as the run goes, and `run_batch`
parses the text into trace dicts.  A batch with an async scenario steps
through `engine_step_async`, and its records carry which batch was applied.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from schedspec.reference.engine import error_trace
from schedspec.reference.scenario import Scenario
from schedspec.reference.trace_io import TraceWriter
from schedspec.spec.config import ConfigError, SchedulerConfig, step_budget
from schedspec.spec.input_processor import checked_lengths
from schedspec.spec.versions import (LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL, RESUMED_SENT_AS_NEW,
                                     UNHASHED_FREE_BLOCKS_FIRST, has)
from .device import resolve_device
from .hashes import hash_ids, is_private, private_hash_rows
from .limits import MAX_FLOAT32_DIV_LEN, limit_violation, unmodelled_in_requests
from .state import (ABORTED, I32, I64, LENGTH_CAPPED, NEVER, PREEMPTED, RUNNING, STOPPED, WAITING, Batch,
                    initial_state, select)
from .step import engine_step, engine_step_async, pending, waiting_key
from .trace_text import IdTables, TorchTrace, quote, render_chunk, trace_header

NAME = "torch"
_REASON = {STOPPED: "stopped", LENGTH_CAPPED: "length", ABORTED: "aborted"}
_CHUNK_BYTES = 32 << 20  # step records held on the device before a host copy
_RECORD_BYTES = 31  # bytes per request slot of one step's record


class FrontRequest(NamedTuple):
    """What the batch needs of a request the front end accepted (spec/request.py's
    Request carries these under the same names; the rest, hashes and features,
    torch refuses or computes itself)."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int
    arrival_time: float


def request_ranks(requests: Sequence[FrontRequest]) -> tuple[list[int], list[int]]:
    """(queue_rank, victim_rank) per request: the priority heap order
    (priority, arrival_time, request_id) as a rank (ids compare as strings, so
    "r10" < "r2"), and the dense rank of (priority, arrival_time) that picks a
    priority preemption victim."""
    n = len(requests)
    keys = [(r.priority, r.arrival_time, r.request_id) for r in requests]
    queue_rank, victim_rank = [0] * n, [0] * n
    # One sort: in heap order, (priority, arrival_time) changes exactly where its dense rank steps.
    dense, last = -1, None
    for rank, i in enumerate(sorted(range(n), key=keys.__getitem__)):
        queue_rank[i] = rank
        if keys[i][:2] != last:
            dense, last = dense + 1, keys[i][:2]
        victim_rank[i] = dense
    return queue_rank, victim_rank


def config_row(config: SchedulerConfig) -> dict[str, Any]:
    """The per-scenario tensor values of a validated config."""
    seqs = config.max_num_seqs if config.max_num_active_seqs is None else config.max_num_active_seqs
    return {
        # the token budget and the input budget act as one (gpu/step.py)
        "token_budget": step_budget(config),
        "max_num_active_reqs": seqs,
        # the cap in force with more than one eligible request: none with chunked
        # prefill off from 0.34.0 (spec/config.py long_prefill_threshold)
        "long_prefill_token_threshold": 0 if not config.enable_chunked_prefill and
        has(config, LONG_PREFILL_THRESHOLD_NEEDS_CHUNKED_PREFILL) else config.long_prefill_token_threshold,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "resumed_as_new": has(config, RESUMED_SENT_AS_NEW),
        "priority_policy": config.policy == "priority",
        "block_size": config.block_size,
        # of the total that includes the null block (K:210)
        "watermark_blocks": int(config.watermark * config.num_gpu_blocks),
        "reserve_full_isl": config.scheduler_reserve_full_isl,
        "max_model_len": config.max_model_len,
        "num_usable_blocks": config.num_gpu_blocks - 1,  # block 0 is the null block, never free (P:164)
    }


_SCENARIO_DTYPES = {"token_budget": I64, "max_num_active_reqs": I64, "long_prefill_token_threshold": I64,
                    "enable_chunked_prefill": torch.bool, "resumed_as_new": torch.bool, "priority_policy": torch.bool,
                    "block_size": I64,
                    "watermark_blocks": I64, "reserve_full_isl": torch.bool, "max_model_len": I64,
                    "num_usable_blocks": I64}
_REQUEST_DTYPES = {"valid": torch.bool, "num_prompt_tokens": I32, "max_tokens": I32, "output_len": I32,
                   "arrival_step": I32, "abort_step": I32, "queue_rank": I64, "victim_rank": I64}
_REQUEST_PAD = {"valid": False, "num_prompt_tokens": 1, "max_tokens": 1, "output_len": 0,
                "arrival_step": NEVER, "abort_step": NEVER, "queue_rank": 0, "victim_rank": 0}


def num_hash_blocks(config: SchedulerConfig, prompt_lens: Sequence[int], max_tokens: Sequence[int],
                    max_steps: int) -> list[int]:
    """Per request, the block positions it can ever use (`hash_block_rows` of one scenario)."""
    return hash_block_rows(np.array([[config.block_size]]), np.array([[config.max_model_len]]),
                           np.array([[max_steps]]), np.array([list(prompt_lens)], dtype=np.int64).reshape(1, -1),
                           np.array([list(max_tokens)], dtype=np.int64).reshape(1, -1))[0].tolist()


def hash_block_rows(block_size: np.ndarray, max_model_len: np.ndarray, max_steps: np.ndarray,
                    prompt_lens: np.ndarray, max_tokens: np.ndarray) -> np.ndarray:
    """Per request, the block positions it can ever use: its tokens are at most
    its prompt plus one output per step, below max_model_len (one spare
    position).  Per-scenario values (S, 1), per-request ones (S, R)."""
    bs = np.minimum(block_size, max_model_len)
    return -(-np.minimum(prompt_lens + np.minimum(max_tokens, max_steps), max_model_len) // bs) + 1


def prefix_columns(prepared: Sequence["_Prepared"], R: int, device) -> dict[str, Any]:
    """The Batch fields of the block-level pool (gpu/pool.py) for these scenarios."""
    # Every scenario of the batch runs on the block-level pool, so H covers the
    # block tables of the scenarios without prefix caching too.
    S = len(prepared)
    prompt, max_tokens = np.zeros((S, R), dtype=np.int64), np.zeros((S, R), dtype=np.int64)
    ar = np.zeros((S, R), dtype=np.int64)
    for s, p in enumerate(prepared):
        k = len(p.ids)
        prompt[s, :k], max_tokens[s, :k], ar[s, :k] = (p.columns["num_prompt_tokens"], p.columns["max_tokens"],
                                                       p.abort_rank)
    def per_scenario(values) -> np.ndarray:
        return np.array(list(values), dtype=np.int64)[:, None]

    nb = hash_block_rows(per_scenario(p.config.block_size for p in prepared),
                         per_scenario(p.config.max_model_len for p in prepared),
                         per_scenario(p.scenario.max_steps for p in prepared), prompt, max_tokens)
    nb *= np.arange(R) < np.array([len(p.ids) for p in prepared])[:, None]  # padding slots: no blocks
    H = max([int(nb.max()) if nb.size else 0] + [p.hashes.shape[1] for p in prepared if p.hashes is not None]
            + [1])
    bh = np.full((S, R, H), -1, dtype=np.int32)  # int32: the largest tensor of a batch (limits.py)
    num_hashes = [p.num_hashes for p in prepared]
    for s, p in enumerate(prepared):
        if p.hashes is not None:  # prefix groups or explicit token ids (hashes.py)
            bh[s, : p.hashes.shape[0], : p.hashes.shape[1]] = p.hashes
    private = np.array([p.prefix_caching and p.hashes is None for p in prepared], dtype=bool)
    if private.any():  # every block its request's own: the whole batch's at once
        ids, counts = private_hash_rows(nb[private])
        bh[private, :, : ids.shape[2]] = ids
        num_hashes += counts.tolist()
    return {"block_hashes": torch.from_numpy(bh).to(device), "abort_rank": torch.from_numpy(ar).to(device),
            "unhashed_first": torch.tensor([has(p.config, UNHASHED_FREE_BLOCKS_FIRST) for p in prepared],
                                           dtype=torch.bool, device=device),
            "num_hashes": max(num_hashes + [1])}


def build_batch(configs: Sequence[dict[str, Any]], requests: Sequence[dict[str, list]], device,
                prefix: dict[str, Any] | None = None) -> Batch:
    """A Batch from per-scenario config rows and per-scenario request columns
    (and, with prefix caching, `prefix_columns`)."""
    R = max([len(r["valid"]) for r in requests] + [1])
    cols = {}
    for name, dtype in _SCENARIO_DTYPES.items():
        cols[name] = torch.tensor([c[name] for c in configs], dtype=dtype, device=device)
    for name, dtype in _REQUEST_DTYPES.items():
        pad = _REQUEST_PAD[name]
        rows = [r[name] + [pad] * (R - len(r[name])) for r in requests]
        cols[name] = torch.tensor(rows, dtype=dtype, device=device).reshape(len(requests), R)
    longest = max([c["max_model_len"] for c in configs] + [0])
    div_dtype = torch.float32 if longest <= MAX_FLOAT32_DIV_LEN else torch.float64
    return Batch(**cols, **(prefix or {}), block_size_f=cols["block_size"].to(div_dtype), longest_model_len=longest)


class _Prepared:
    """One accepted scenario: its requests, ids and the host-side trace parts."""

    def __init__(self, scenario: Scenario, config: SchedulerConfig, requests: list[FrontRequest]):
        self.scenario = scenario
        self.config = config
        self.ids = [r.request_id for r in requests]
        L = config.max_model_len
        by_id = {rid: i for i, rid in enumerate(self.ids)}
        abort_step = [NEVER] * len(requests)
        self.abort_rank = [0] * len(requests)  # position in the scenario's abort list
        for j, a in enumerate(scenario.aborts):
            i = by_id[a.id]
            if a.step < abort_step[i]:  # a later abort of the same request does nothing
                abort_step[i] = min(a.step, NEVER)
                self.abort_rank[i] = j
        queue_rank, victim_rank = request_ranks(requests)
        self.columns = {
            "valid": [True] * len(requests),
            "num_prompt_tokens": [r.num_prompt_tokens for r in requests],
            "max_tokens": [min(r.max_tokens, L) for r in requests],
            # an output_len no request can reach is "never"
            "output_len": [s.output_len if s.output_len is not None and s.output_len <= L else 0
                           for s in scenario.requests],
            "arrival_step": [min(s.arrival_step, NEVER) for s in scenario.requests],
            "abort_step": abort_step,
            "queue_rank": queue_rank,
            "victim_rank": victim_rank,
        }
        self.index = -1  # the scenario's place among the scenarios of the call
        self.parts: list[memoryview] = []  # the trace text of the steps (ASCII bytes), a piece per chunk
        self.num_listed = 0
        self.path: str | os.PathLike | None = None  # write_batch_traces: the trace file
        self.writer: TraceWriter | None = None  # ... written as the run goes, when a file descriptor was free
        self.prefix_caching = bool(config.enable_prefix_caching)
        self.async_scheduling = bool(config.async_scheduling)
        # block hash ids (gpu/hashes.py): here for prefix groups and explicit
        # token ids; a private scenario's are numbered with the batch's (prefix_columns)
        self.hashes, self.num_hashes = None, 0
        if self.prefix_caching and not is_private(scenario):
            nb = num_hash_blocks(config, self.columns["num_prompt_tokens"], self.columns["max_tokens"],
                                 scenario.max_steps)
            self.hashes, self.num_hashes = hash_ids(scenario, config.block_size, nb)

    def take(self, piece: memoryview, count: int, transient: bool) -> None:
        """A chunk's text of this scenario's steps (`count` of them): to its file
        when it is being written, else kept (a copy when `transient`: the
        renderer reuses that buffer)."""
        if self.writer is not None:
            self.writer.step_text([piece[2:]], count)  # the writer puts the separator before it
        else:
            self.parts.append(bytes(piece) if transient else piece)
        self.num_listed += count

    @functools.cached_property
    def quoted(self) -> list[str]:
        """Each id as JSON text, made once, when the first trace text is."""
        return [quote(rid) for rid in self.ids]


def prepare(scenario: Scenario, configs: dict | None = None) -> _Prepared | str:
    """The scenario ready for a batch, or the error message of its error trace.
    `configs`: the accepted configs (or their error messages) by config, kept by
    the caller across the scenarios of one batch, which mostly share a handful of
    configs."""
    config = configs.get(scenario.config) if configs is not None else None
    if config is None:
        try:
            config = scenario.scheduler_config()
        except ConfigError as e:
            config = str(e)
        if configs is not None:
            configs[scenario.config] = config
    if isinstance(config, str):
        return config
    beyond = limit_violation(config, scenario.max_steps)
    if beyond:
        return beyond
    unmodelled = unmodelled_in_requests(scenario.requests)  # refused, never ignored
    if unmodelled:
        return unmodelled
    # The front end's checks that apply to what is left (spec/input_processor.py
    # `make_request` runs them first; hashes come from gpu/hashes.py).
    requests = []
    for i, r in enumerate(scenario.requests):
        try:
            max_tokens = checked_lengths(config, r.prompt_len, r.max_tokens)
        except ConfigError as e:
            return f"requests[{i}].{e}"
        requests.append(FrontRequest(r.id, r.prompt_len, max_tokens, r.priority, r.arrival_time))
    return _Prepared(scenario, config, requests)


# The per-step record: these tensors (S, R) of each step, copied into buffers
# (T, S, R) that hold a chunk of steps and are reused chunk after chunk (fresh
# memory per chunk, as stacking the steps' own tensors made, cost a page fault
# per 4 kB of records).
# `hit_tokens` with prefix caching; `app_key` (the grant order of the batch
# applied) and `stopped` (the requests its update stopped) in a batch with async
# scheduling, where the batch applied is not always the one scheduled.
_RECORD_FIELDS = ("grant", "num_computed_tokens", "status", "run_pos", "wait_key", "admitted",
                  "preempt_order", "sampled", "aborted", "hit_tokens", "app_key", "stopped")
def _summary(p: _Prepared, final: dict[str, list], num_steps: int) -> dict[str, Any]:
    requests, unfinished, done = {}, [], 0
    for j, rid in enumerate(p.ids):
        status = final["status"][j]
        reason = _REASON.get(status)
        if reason is None:
            unfinished.append(rid)
        else:
            done += 1
        first = final["first_token_step"][j]
        finish = final["finish_step"][j]
        requests[rid] = {"first_token_step": first if first >= 0 else None,
                         "finish_step": finish if finish >= 0 else None,
                         "finish_reason": reason,
                         "num_output_tokens": final["num_output_tokens"][j],
                         "num_preemptions": final["num_preemptions"][j]}
    return {"steps": num_steps, "finished": done, "unfinished": unfinished, "requests": requests}


def run_batch(scenarios: Sequence[Scenario], *, device=None,
              progress: Callable[[int, int], None] | None = None, record_steps: bool = True) -> list[dict]:
    """One trace per scenario, in order, from one batched run of all of them.
    A scenario vLLM would reject, or one beyond gpu/limits.py, gets an error trace.

    `record_steps=False` leaves the per-step records out (`"steps": []`; the
    summary, including `summary.steps`, is complete): for sweeps and benchmarks,
    where even the trace text would cost more than the stepping.

    The dicts are parsed from `run_batch_traces`'s text; a caller that writes
    or compares traces should take the text instead."""
    return [t.to_dict() for t in run_batch_traces(scenarios, device=device, progress=progress,
                                                  record_steps=record_steps)]


def run_batch_traces(scenarios: Sequence[Scenario], *, device=None,
                     progress: Callable[[int, int], None] | None = None,
                     record_steps: bool = True) -> list[TorchTrace]:
    """`run_batch` as TorchTrace objects (gpu/trace_text.py): each scenario's
    steps as trace text, made from the records column by column, never as one
    dict per step; `to_dict()`, `write(path)` and `steps_text()` on each."""
    traces: list[TorchTrace | None] = [None] * len(scenarios)

    def keep(i: int, trace: TorchTrace) -> None:
        traces[i] = trace

    stream_batch_traces(scenarios, keep, device=device, progress=progress, record_steps=record_steps)
    return traces


def stream_batch_traces(scenarios: Sequence[Scenario], on_trace: Callable[[int, TorchTrace], None], *,
                        device=None, progress: Callable[[int, int], None] | None = None,
                        record_steps: bool = True) -> None:
    """`run_batch_traces`, each trace handed to `on_trace(i, trace)` (i: the
    scenario's index in `scenarios`) as soon as it is complete, rather than
    all of them at the end: the error traces first, then each scenario's
    trace when its run ends (sub-batch by sub-batch, a scenario that finishes
    early when its batch rows are compacted).  The batch keeps no reference to
    a trace it has handed over, so a caller that drops each one holds the text
    of the scenarios still running, not of the whole batch.  `on_trace` runs
    inside the batch's run (torch's inference mode, Python's cyclic garbage
    collector paused); an exception from it ends the run."""
    def done(p: _Prepared, summary: dict[str, Any]) -> None:
        parts, p.parts = p.parts, []
        on_trace(p.index, TorchTrace(p.scenario.name, NAME, parts, p.num_listed, summary))

    _run_all(scenarios, on_trace, done, device, progress, record_steps)


def write_batch_traces(scenarios: Sequence[Scenario], paths: Sequence[str | os.PathLike], *, device=None,
                       progress: Callable[[int, int], None] | None = None) -> list[tuple[int, str | None]]:
    """Run the batch and write scenario i's trace to `paths[i]` (gzip when the
    name ends in .gz), byte for byte what `TorchTrace.write` writes, as the run
    goes: each chunk of steps goes from the renderer's buffer to the files
    (no copy of the text, and no more than a chunk of it held), and each file
    is moved into place (trace_io.py's TraceWriter) once its scenario has run.
    A rejected scenario's error trace is written too.  Returns (steps listed,
    the error or None) per scenario.

    A file being written holds a file descriptor: the soft limit on them is
    raised towards the hard one for the run (and put back after); where a
    sub-batch has more scenarios than descriptors to spare, the rest keep
    their text and are written when they end, as `stream_batch_traces` would.
    On an exception the unfinished files are removed (a path keeps what it had);
    the files already moved into place stay."""
    if len(paths) != len(scenarios):
        raise ValueError(f"write_batch_traces: {len(paths)} paths for {len(scenarios)} scenarios")
    results: list[tuple[int, str | None] | None] = [None] * len(scenarios)

    def rejected(i: int, trace: TorchTrace) -> None:
        trace.write(paths[i])
        results[i] = (0, trace.error)

    def done(p: _Prepared, summary: dict[str, Any]) -> None:
        if p.writer is not None:
            w, p.writer = p.writer, None
            w.end({**trace_header(p.scenario.name, NAME), "summary": summary})
            w.commit()
        else:
            TorchTrace(p.scenario.name, NAME, p.parts, p.num_listed, summary).write(p.path)
            p.parts = []
        results[p.index] = (p.num_listed, None)

    # a sub-batch has fewer than 2 * _GROUP_MIN scenarios, or is the whole batch
    with _descriptor_limit(min(len(scenarios), 2 * _GROUP_MIN) + 4 * _SPARE_DESCRIPTORS):
        _run_all(scenarios, rejected, done, device, progress, True, paths)
    return results


def _run_all(scenarios, rejected, ran, device, progress, record_steps: bool, paths=None) -> None:
    """Prepare and run `scenarios`: `rejected(i, error trace)` for each one
    prepare() turns down, `ran(p, summary)` for each one that has run."""
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    prepared: list[_Prepared] = []
    configs: dict = {}
    # The host makes and holds many objects meanwhile (the prepared requests, the
    # summaries, the text pieces and the object arrays that place them), none in
    # a cycle; the cyclic collector would rescan them again and again, so it
    # pauses meanwhile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i, sc in enumerate(scenarios):
            p = prepare(sc, configs)
            if isinstance(p, str):
                rejected(i, TorchTrace.from_dict(error_trace(sc, NAME, p)))
            else:
                p.index = i
                p.path = paths[i] if paths is not None else None
                prepared.append(p)
        if prepared:
            with torch.inference_mode():
                _run_groups(prepared, dev, progress, record_steps, ran)
    except BaseException:
        for p in prepared:
            if p.writer is not None:
                p.writer.discard()
                p.writer = None
        raise
    finally:
        if collecting:
            gc.enable()


_SPARE_DESCRIPTORS = 64  # left for what else the process opens while trace files are open


def _free_descriptors() -> int:
    """File descriptors this process can still open, less a margin; 0 where
    that cannot be told (no `resource` module, no /proc/self/fd)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, soft - used - _SPARE_DESCRIPTORS)


@contextlib.contextmanager
def _descriptor_limit(wanted: int):
    """The soft limit on open files raised to `wanted` (at most the hard
    limit) meanwhile, when it is lower."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        yield
        return
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft == resource.RLIM_INFINITY or new <= soft:
        yield
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_writers(prepared: list[_Prepared]) -> None:
    """Open the trace files of a sub-batch about to run, as many as there are
    descriptors to spare; the others keep their text until they end."""
    room = _free_descriptors()
    for p in prepared:
        if p.path is None:
            continue
        if room <= 0:
            return
        w = TraceWriter(p.path)
        w.begin(trace_header(p.scenario.name, NAME))
        p.writer = w
        room -= 1


def _run_groups(prepared: list[_Prepared], dev: torch.device, progress, record_steps: bool, ran) -> None:
    # On the CPU, one intra-op thread: the step is some hundred small tensor
    # ops, and torch's thread pool costs more than it gains on them; on a
    # busy machine (other processes on the cores) two threads made
    # run_batch 15-25x slower than one (benchmarks/torch_vs_spec.py numbers).
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    try:
        groups = _groups(prepared)
        total = sum(max(p.scenario.max_steps for p in g) for g in groups)
        done = 0
        for group in groups:
            report = None
            if progress is not None:
                report = (lambda step, _h, base=done: progress(base + step, total))
            _run(group, dev, report, record_steps, ran)
            done += max(p.scenario.max_steps for p in group)
    finally:
        torch.set_num_threads(threads)


_GROUP_MIN = 2048  # scenarios per sub-batch, at least: below it a step costs its per-op overhead
_SPLIT_MIN = 256  # scenarios with and without prefix caching, each, above which they run apart


def _groups(prepared: list[_Prepared]) -> list[list[_Prepared]]:
    """Sub-batches: with and without prefix caching apart when both are many,
    each cut by `_by_size`.

    In a batch where some scenario has prefix caching, every scenario runs on
    the block-level pool, whose block tables and hash ids are (S, R, H) for the
    batch's largest H; the scenarios without it need none of that (the counting
    model), so once both kinds are numerous they run as two batches, which
    roughly halves a campaign's peak memory and steps the counting ones faster."""
    with_pc = [p for p in prepared if p.prefix_caching]
    without = [p for p in prepared if not p.prefix_caching]
    if len(with_pc) < _SPLIT_MIN or len(without) < _SPLIT_MIN:
        return _by_size(prepared)
    return _by_size(with_pc) + _by_size(without)


def _by_size(prepared: list[_Prepared]) -> list[list[_Prepared]]:
    """Sub-batches of similar request counts, when the batch is big enough.

    Every scenario is padded to the batch's largest request count R, and a
    step's tensor work is S x R; sorting by request count and cutting into
    sub-batches of at least _GROUP_MIN scenarios pads each to its own R.
    Smaller batches stay whole: there a step's cost is mostly per-op overhead,
    which sub-batches would pay once each.  Results do not depend on the
    grouping (scenarios are independent); traces go back in the caller's order."""
    num_groups = len(prepared) // _GROUP_MIN
    if num_groups <= 1:
        return [prepared]
    ranked = sorted(prepared, key=lambda p: (len(p.ids), p.scenario.max_steps))
    size = -(-len(ranked) // num_groups)
    return [ranked[k:k + size] for k in range(0, len(ranked), size)]


def _run(prepared: list[_Prepared], dev: torch.device, progress, record_steps: bool, ran) -> None:
    """Step one sub-batch to its end: each scenario's records become its trace
    text chunk by chunk (`_Records`), and `ran(p, summary)` is told of each
    scenario once it has run."""
    if any(p.path is not None for p in prepared):  # write_batch_traces
        _open_writers(prepared)
    batch, asy = _build(prepared, dev)
    state = initial_state(batch)
    max_steps = torch.tensor([p.scenario.max_steps for p in prepared], dtype=I64, device=dev)
    horizon = max(p.scenario.max_steps for p in prepared)
    records = _Records(list(prepared))
    steps_done = torch.zeros(len(prepared), dtype=I64, device=dev)
    # steps at which some scenario has an abort or an arrival (the others skip that work)
    abort_steps = {x for p in prepared for x in p.columns["abort_step"]}
    arrival_steps = {x for p in prepared for x in p.columns["arrival_step"]}
    step = 0
    while True:
        active = pending(batch, state) & (step < max_steps)
        num_active = int(active.sum())
        if num_active == 0:
            break
        if num_active <= active.shape[0] // 2:
            # Finished scenarios never change again: drop their rows (and the
            # padding slots no remaining scenario uses) so the work shrinks with them.
            batch, state, max_steps, active, steps_done = _drop_finished(records, batch, state, max_steps, active,
                                                                         steps_done, ran)
        if asy:
            state, decision, aborted, sampled, stopped, called, app_step, app_key = engine_step_async(
                batch, state, step, active, step in abort_steps, step in arrival_steps)
        else:
            state, decision, aborted, sampled = engine_step(batch, state, step, active, step in abort_steps,
                                                            step in arrival_steps)
        steps_done += active
        step += 1
        if progress is not None:
            progress(step, horizon)
        if not record_steps:
            continue
        fields = (decision.num_scheduled_tokens, state.num_computed_tokens, state.status, state.run_pos,
                  waiting_key(batch, state), decision.admitted, decision.preempt_order, sampled, aborted,
                  decision.hit_tokens)
        rec = {name: t for name, t in zip(_RECORD_FIELDS, fields) if t is not None}
        cols = [state.num_free_blocks, decision.num_running, active]
        if asy:
            rec["app_key"], rec["stopped"] = app_key, stopped
            cols += [called, app_step]
        records.record(rec, cols)
    records.flush()
    _finish(records.owners, range(len(records.owners)), state, steps_done, ran)


def _build(prepared: list[_Prepared], dev: torch.device) -> tuple[Batch, bool]:
    """The sub-batch's `Batch`, and whether it steps with async scheduling."""
    extra = {}
    if any(p.prefix_caching for p in prepared):
        extra = prefix_columns(prepared, max([len(p.ids) for p in prepared] + [1]), dev)
    asy = any(p.async_scheduling for p in prepared)
    if asy:  # the whole batch steps through the async engine step (gpu/step.py)
        extra["async_sched"] = torch.tensor([p.async_scheduling for p in prepared], dtype=torch.bool, device=dev)
    return build_batch([config_row(p.config) for p in prepared], [p.columns for p in prepared], dev, extra), asy


def _drop_finished(records: _Records, batch: Batch, state, max_steps: torch.Tensor, active: torch.Tensor,
                   steps_done: torch.Tensor, ran):
    """The batch rows of the scenarios still `active` only: the others' summaries
    go to `ran`, and the per-row tensors keep the remaining rows.  Returns
    (batch, state, max_steps, active, steps_done)."""
    records.flush()
    S = active.shape[0]
    rows = active.nonzero()[:, 0]
    keep = rows.cpu().tolist()
    kept = set(keep)
    final_rows = [i for i in range(S) if i not in kept]
    _finish(records.owners, final_rows, state, steps_done, ran)
    owners = [records.owners[i] for i in keep]
    records.rows_changed(owners)
    num_slots = max(len(p.ids) for p in owners)
    batch, state = select(batch, rows, num_slots), select(state, rows, num_slots)
    return (batch, state, max_steps.index_select(0, rows), active.index_select(0, rows),
            steps_done.index_select(0, rows))


class _Records:
    """A sub-batch's per-step records, held on the device a chunk of steps at a
    time, then turned into the trace text of the scenarios of its rows."""

    def __init__(self, owners: list[_Prepared]) -> None:
        self.owners = owners  # the scenario of each batch row
        self.bufs: dict[str, torch.Tensor] = {}  # the chunk's records, (T, S, R) per field; "scalars" (T, S, columns)
        self.used, self.first = 0, 0  # steps in bufs, the step number of the first
        self.text = None  # what the trace text of the batch's rows needs (their ids, flags), made at the first flush

    def rows_changed(self, owners: list[_Prepared]) -> None:
        """The batch's rows are now those of `owners` (after a flush)."""
        self.owners = owners
        self.text = None

    def _text_tables(self, R: int):
        owners = self.owners
        return (IdTables([p.quoted for p in owners], [p.abort_rank for p in owners], R),
                np.array([p.prefix_caching for p in owners], dtype=bool),
                np.array([p.async_scheduling for p in owners], dtype=bool))

    def flush(self) -> None:
        """The records held become trace text (given to each row's scenario)."""
        if not self.used:
            return
        used, bufs = self.used, self.bufs
        # on the CPU the arrays are the buffers themselves: render_chunk keeps no reference to them
        rec = {name: b[:used].cpu().numpy() for name, b in bufs.items() if name != "scalars"}
        if self.text is None:
            self.text = self._text_tables(rec["status"].shape[2])
        # the text goes to open trace files straight from the renderer's buffer
        owners = self.owners
        direct = any(p.writer is not None for p in owners)
        for row, piece, count in render_chunk(rec, self.first, bufs["scalars"][:used].cpu().numpy(), *self.text,
                                              transient=direct):
            owners[row].take(piece, count, direct)
        self.first += used
        self.used = 0

    def record(self, rec: dict[str, torch.Tensor], cols: list[torch.Tensor]) -> None:
        """One step's records: `rec` (S, R) per field, `cols` (S,) per scalar column."""
        bufs = self.bufs
        if (bufs.keys() - {"scalars"} != rec.keys()
                or any(bufs[k].shape[1:] != t.shape or bufs[k].dtype != t.dtype for k, t in rec.items())
                or bufs["scalars"].shape[2] != len(cols)):
            self.flush()  # the first record, or the rows changed: buffers of the new shape
            steps = max(1, -(-_CHUNK_BYTES // (_RECORD_BYTES * rec["status"].numel())))
            bufs = {k: torch.empty((steps, *t.shape), dtype=t.dtype, device=t.device) for k, t in rec.items()}
            bufs["scalars"] = torch.empty((steps, cols[0].shape[0], len(cols)), dtype=I64, device=cols[0].device)
            self.bufs = bufs
        used = self.used
        for k, t in rec.items():
            bufs[k][used].copy_(t)
        row = bufs["scalars"][used]
        for j, c in enumerate(cols):
            row[:, j].copy_(c)
        self.used = used + 1
        if self.used == bufs["status"].shape[0]:
            self.flush()


def _finish(owners: list[_Prepared], rows, state, steps_done, ran) -> None:
    """The scenarios in batch rows `rows` have run: their summaries from their
    final state, each given to `ran(p, summary)`."""
    rows = list(rows)
    if not rows:
        return
    idx = torch.tensor(rows, dtype=I64, device=state.status.device)
    final = {name: getattr(state, name).index_select(0, idx).cpu().tolist()
             for name in ("status", "first_token_step", "finish_step", "num_output_tokens", "num_preemptions")}
    num_steps = steps_done.index_select(0, idx).cpu().tolist()
    for k, s in enumerate(rows):
        p = owners[s]
        ran(p, _summary(p, {name: v[k][: len(p.ids)] for name, v in final.items()}, num_steps[k]))


def run_one(scenario: Scenario, device=None) -> dict:
    """run_batch of one scenario."""
    return run_batch([scenario], device=device)[0]
