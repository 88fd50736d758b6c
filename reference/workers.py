"""Where a campaign's work runs: in this process, on a pool of local processes,
or on a Ray cluster, behind one interface.

A `Job` names two functions by "module:function" text (workers import them; a
function object would tie this base layer to the layers above it):

    setup(*setup_args) -> context       once per worker: load the implementations
    run(context, item, heartbeat)       once per item: its result, a picklable value

`run_job(job, items, ...)` yields `(index, outcome)` as results arrive (in any
order), where `outcome` is `run`'s result or a `WorkerFailure` naming the item
during which a worker died (`crashed`), went silent past its time (`hung`) or
raised out of `run` (`raised`).  A dead or hung worker is replaced and the
campaign goes on; results already sent are never lost.  Ordering, merging and
storing results is the caller's business (reference/campaign.py), so the same
campaign gives the same report whatever runs it.

Why not `concurrent.futures.ProcessPoolExecutor`: one dead worker breaks that
pool and fails every pending future, and no single task can be stopped when it
hangs.  Here each worker has its own pipe and runs one item at a time (the next
one waits in the pipe, so no round trip leaves it idle); results come back in
the order sent, so a crash or a hang is charged to exactly the item running,
the ones waiting go back in line, and only that worker is replaced.

Why not a maintained pool (measured with pebble 5.2.3 and loky 3.7.0, spawn, 2
workers, a setup run once per worker as their initializer):
- loky: a worker that dies (`os._exit(5)`) fails its item and every item still
  pending with TerminatedWorkerError (4 of 7 lost), and there is no per-item
  timeout (a hung item still ran after 5 s; only the whole executor can be stopped).
- pebble charges a crash (ProcessExpired, exit code 5) and a hang (`timeout=2`,
  counted from the item's start) to their item and loses none, as here, but:
  one worker dying in setup while no item runs (a transient failure, e.g. out of
  memory while loading vLLM) breaks the pool, and every pending item fails with
  BrokenProcessPool "All workers expired" (4 of 4 lost, in each of 3 runs; here the
  worker is replaced and all 4 finish); a setup that raises loses its one-line
  reason to the same error (pebble logs it with a traceback); a setup that hangs
  is never stopped (nothing after 30 s; here SETUP_TIMEOUT); an item's timeout is
  fixed when it is sent, so `heartbeat` cannot give a shrink its longer time
  (every scenario would get scenario_timeout + shrink_seconds before it counts
  as hung); and setup reports nothing back (the campaign's load time per worker).

Across machines the same job runs on Ray actors (`ray_address`):
Ray places, starts and restarts them; nothing of a scheduler or RPC is
rebuilt here.

`heartbeat(what)` lets `run` say it has entered a long phase (e.g. shrinking a
divergence): the item's deadline restarts with `long_timeout`.
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from multiprocessing.connection import wait as wait_ready
from typing import Any

#: Seconds an item may run before its worker counts as hung (a schedspec
#: scenario takes milliseconds; vLLM's, tens of milliseconds).
DEFAULT_ITEM_TIMEOUT = 300.0
#: A worker that dies while loading twice in a row is a broken setup, not bad luck.
MAX_SETUP_FAILURES = 2
#: Seconds a worker may take to set up (vLLM: about 12 s; a cold disk: a minute).
SETUP_TIMEOUT = 600.0
#: Items a local worker holds at once: the one it runs and the next, already in its pipe.
HELD_PER_WORKER = 2


class SetupError(RuntimeError):
    """A worker could not set up (e.g. the implementation does not load): the
    message is setup's own, one line."""


@dataclasses.dataclass(frozen=True)
class Job:
    """What every worker runs: `setup` and `run` as "module:function"."""

    setup: str
    setup_args: tuple
    run: str
    item_timeout: float = DEFAULT_ITEM_TIMEOUT
    long_timeout: float = DEFAULT_ITEM_TIMEOUT


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    """An item whose worker crashed, hung or raised; `detail` says how."""

    kind: str  # "crashed" | "hung" | "raised"
    detail: str


@dataclasses.dataclass
class WorkerInfo:
    """What each worker's setup reported (e.g. its load time), by worker number."""

    setups: list[Any] = dataclasses.field(default_factory=list)
    restarts: int = 0


def resolve(target: str) -> Callable:
    """The function "module:function" names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__


def setup_report(setup_result: Any) -> Any:
    """What a worker reports of its context: `context.report()` when it has one."""
    report = getattr(setup_result, "report", None)
    return report() if callable(report) else None


def open_pool(job: Job, *, workers: int = 1, ray_address: str | None = None, info: WorkerInfo | None = None,
              items_hint: int | None = None):
    """A pool that runs `job`, kept across `run(items)` calls (a search judges
    candidates in rounds; each worker sets up once).  `workers` 1 without Ray:
    this process (nothing isolated: a crash is this process's).  Use as a
    context manager; closing stops the workers."""
    info = info if info is not None else WorkerInfo()
    if ray_address is not None:
        from .ray_workers import RayPool

        return RayPool(job, workers, ray_address, info)
    if workers <= 1 or (items_hint is not None and items_hint <= 1):
        return InlinePool(job, info)
    return ProcessPool(job, workers if items_hint is None else min(workers, items_hint), info)


def run_job(job: Job, items: Sequence[tuple[int, Any]], *, workers: int = 1, ray_address: str | None = None,
            info: WorkerInfo | None = None) -> Iterator[tuple[int, Any]]:
    """Runs `job` on every `(index, item)`; yields `(index, outcome)` as each
    arrives.  Raises SetupError when workers cannot set up."""
    if not items:
        return
    with open_pool(job, workers=workers, ray_address=ray_address, info=info, items_hint=len(items)) as pool:
        yield from pool.run(items)


# --- in this process ------------------------------------------------------------------------------


class InlinePool:
    """The job in this process: set up at the first item."""

    def __init__(self, job: Job, info: WorkerInfo):
        self.job, self.info, self.context, self.fn = job, info, None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        close = getattr(self.context, "close", None)
        if callable(close):
            close()

    def run(self, items: Sequence[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        if items and self.fn is None:
            try:
                self.context = resolve(self.job.setup)(*self.job.setup_args)
            except Exception as e:  # noqa: BLE001 - said as the campaign's one-line error
                raise SetupError(str(e) or one_line(e)) from None
            self.info.setups.append(setup_report(self.context))
            self.fn = resolve(self.job.run)
        for index, item in items:
            yield index, self.fn(self.context, item, lambda what: None)


# --- on local processes ---------------------------------------------------------------------------


def worker_main(conn, job: Job) -> None:
    """A local worker: set up, then answer one item at a time until told to stop.
    Ctrl-C is the parent's to handle: it stops the workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        context = resolve(job.setup)(*job.setup_args)
        run = resolve(job.run)
    except BaseException as e:  # noqa: BLE001 - sent to the parent as a setup failure
        conn.send(("setup_error", str(e) or one_line(e)))
        return
    conn.send(("ready", setup_report(context)))
    while True:
        msg = conn.recv()
        if msg is None:
            return
        index, item = msg

        def heartbeat(what: str, index=index) -> None:
            conn.send(("long", index))

        try:
            result = run(context, item, heartbeat)
        except Exception as e:  # noqa: BLE001 - charged to the item, the worker goes on
            conn.send(("raised", index, one_line(e) + " | " + traceback.format_exc(limit=-3).replace("\n", " ")))
            continue
        conn.send(("done", index, result))


@dataclasses.dataclass
class LocalWorker:
    process: Any
    conn: Any
    ready: bool = False
    held: deque = dataclasses.field(default_factory=deque)  # indices sent, oldest (the one running) first
    deadline: float = float("inf")


class ProcessPool:
    """Up to `n` worker processes, started at the first `run` and kept until `close`."""

    def __init__(self, job: Job, n: int, info: WorkerInfo):
        self.job, self.n, self.info = job, max(1, n), info
        # spawn, not fork: the parent may hold torch's or vLLM's threads, which fork does not copy safely.
        self.ctx = multiprocessing.get_context("spawn")
        self.pool: list[LocalWorker] = []
        self.setup_failures = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> LocalWorker:
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=worker_main, args=(child, self.job), daemon=True)
        p.start()
        child.close()
        return LocalWorker(p, parent, deadline=time.monotonic() + SETUP_TIMEOUT)

    @staticmethod
    def stop(w: LocalWorker) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join(5)
        w.conn.close()

    def close(self) -> None:
        for w in self.pool:
            try:
                w.conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 2.0
        for w in self.pool:
            w.process.join(max(0.0, deadline - time.monotonic()))
            self.stop(w)
        self.pool = []

    def run(self, items: Sequence[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        rnd = _Round(deque(items), dict(items), len(items))
        try:
            while len(self.pool) < min(self.n, max(1, rnd.remaining)):
                self.pool.append(self.start())
            for w in self.pool:
                if w.ready and not w.held:
                    self.give(w, rnd)
            while rnd.remaining:
                timeout = max(0.0, min(w.deadline for w in self.pool) - time.monotonic())
                ready = wait_ready([w.conn for w in self.pool] + [w.process.sentinel for w in self.pool],
                                   timeout=min(timeout, 60.0))
                for w in list(self.pool):
                    yield from self.serve(w, ready, rnd)
        except BaseException:
            self.close()  # an interrupted round leaves workers holding items: start afresh
            raise

    def give(self, w: LocalWorker, rnd: "_Round") -> None:
        """Tops the worker up to HELD_PER_WORKER items (the next one waits in its
        pipe while it runs one: no idle round trip); the oldest one's clock runs."""
        while rnd.todo and len(w.held) < HELD_PER_WORKER:
            index, item = rnd.todo.popleft()
            try:
                w.conn.send((index, item))
            except OSError:  # it died after its last answer: the wait below sees it; the item waits
                rnd.todo.appendleft((index, item))
                break
            w.held.append(index)
        w.deadline = time.monotonic() + self.job.item_timeout if w.held else float("inf")

    def serve(self, w: LocalWorker, ready: list, rnd: "_Round") -> Iterator[tuple[int, Any]]:
        """What worker `w` said, or its death or silence past its deadline: yields the
        results it brings."""
        lost: str | None = None
        if w.conn in ready:
            lost = yield from self.receive(w, rnd)
        elif w.process.sentinel in ready and not w.process.is_alive():
            lost = "crashed"
        elif time.monotonic() > w.deadline:
            lost = "hung"
        if lost is not None:
            yield from self.replace(w, lost, rnd)

    def receive(self, w: LocalWorker, rnd: "_Round") -> Generator[tuple[int, Any], None, str | None]:
        """One message of `w`: yields the result it carries; returns "crashed" when the
        pipe closed instead."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            msg = None
        if msg is None:
            return "crashed"
        if msg[0] == "setup_error":
            raise SetupError(msg[1])
        if msg[0] == "ready":
            w.ready, self.setup_failures = True, 0
            self.info.setups.append(msg[1])
            self.give(w, rnd)
        elif msg[0] == "long":
            w.deadline = time.monotonic() + self.job.long_timeout
        else:
            kind, index, payload = msg
            rnd.remaining -= 1
            w.held.popleft()  # results come back in the order sent
            self.give(w, rnd)
            yield index, (payload if kind == "done" else WorkerFailure("raised", payload))
        return None

    def replace(self, w: LocalWorker, lost: str, rnd: "_Round") -> Iterator[tuple[int, Any]]:
        """`w` crashed or hung: stop it, charge the item it ran, put the others it held
        back in line, and start a replacement while there is work left."""
        if lost == "crashed":
            w.process.join(5)  # its pipe closes a moment before its exit code is known
        code = w.process.exitcode
        self.stop(w)
        if not w.ready:
            self.setup_failures += 1
            if self.setup_failures >= MAX_SETUP_FAILURES:
                raise SetupError(f"a worker took more than {SETUP_TIMEOUT:g} s to set up" if lost == "hung"
                                 else f"a worker died while setting up (exit code {code})")
        elif w.held:
            # The oldest item sent was the one running; the others go back in line, first.
            rnd.remaining -= 1
            running = w.held.popleft()
            rnd.todo.extendleft((i, rnd.items_by_index[i]) for i in reversed(w.held))
            detail = (f"no result within {self.job.item_timeout:g} s; the worker was stopped"
                      if lost == "hung" else f"the worker process died (exit code {code})")
            yield running, WorkerFailure(lost, detail)
        self.pool.remove(w)
        if rnd.todo or not self.pool:  # a replacement only when there is work left for it
            self.info.restarts += 1
            self.pool.append(self.start())


@dataclasses.dataclass
class _Round:
    """One `ProcessPool.run` call's items: those not sent yet, and how many still lack a result."""

    todo: deque
    items_by_index: dict[int, Any]
    remaining: int

__all__ = ["DEFAULT_ITEM_TIMEOUT", "InlinePool", "Job", "ProcessPool", "SetupError", "WorkerFailure", "WorkerInfo",
           "default_workers", "one_line", "open_pool", "resolve", "run_job", "setup_report"]
