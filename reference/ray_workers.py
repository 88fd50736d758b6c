"""The same jobs as workers.py, on a Ray cluster: one actor per worker, each
setting up once (e.g. loading vLLM) and then answering chunks of items.

Ray is an optional extra (`pip install 'schedspec[ray]'`); this module imports
it only when a campaign asks for `--ray`.  Ray places the actors, moves the
items and results, and reports a dead actor as RayActorError; what is left here
is the campaign's rule for failures: a chunk whose actor died or went past its
time is split into single items, and a single item that kills a worker again
is charged to that item (a `WorkerFailure`), as the local pool does.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from .workers import Job, SetupError, WorkerFailure, WorkerInfo, one_line, resolve, setup_report

#: Items per task: enough to make Ray's per-task cost small against a scenario's milliseconds.
CHUNK = 8


class RayUnavailable(SetupError):
    """Ray is not installed, or no cluster answers at the address."""


class CampaignActor:
    """One worker: `setup` once, then `run` on each item of a chunk.  A failure
    to set up is kept and reported by `ready()`, so that it reaches the user as
    setup's own message rather than as Ray's actor-death report."""

    def __init__(self, job: Job, sys_path: list[str]):
        # Modules the user named by path (module:Class in the current folder) import as they do locally.
        for p in reversed(sys_path):
            if p not in sys.path and os.path.isdir(p):
                sys.path.insert(0, p)
        self.job = job
        self.error: str | None = None
        self.report: Any = None
        try:
            self.context = resolve(job.setup)(*job.setup_args)
            self.report = setup_report(self.context)
            self.run = resolve(job.run)
        except Exception as e:  # noqa: BLE001 - reported by ready()
            self.error = str(e) or one_line(e)

    def ready(self) -> tuple[str | None, Any]:
        return self.error, self.report

    def run_chunk(self, chunk: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        out = []
        for index, item in chunk:
            try:
                out.append((index, self.run(self.context, item, lambda what: None)))
            except Exception as e:  # noqa: BLE001 - charged to the item
                out.append((index, WorkerFailure("raised", one_line(e))))
        return out


def connect(address: str):
    """`ray.init` on an existing cluster ("auto" or HOST:PORT); RayUnavailable when it cannot."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray: Ray is not installed; install it with pip install 'schedspec[ray]'") from None
    if not ray.is_initialized():
        reachable(address)
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                     configure_logging=False, include_dashboard=False)
        except Exception as e:  # noqa: BLE001 - ConnectionError and Ray's own kinds
            raise RayUnavailable(f"--ray {address}: no Ray cluster answers there ({one_line(e)[:200]})") from None
    return ray


def reachable(address: str, timeout: float = 5.0) -> None:
    """HOST:PORT answers a TCP connection (Ray itself retries an unreachable head
    for minutes before it gives up); "auto" is left to Ray."""
    import socket

    if address == "auto":
        return
    host, sep, port = address.rpartition(":")
    if host.startswith("ray://"):
        host = host[len("ray://"):]
    if not sep or not port.isdigit():
        raise RayUnavailable(f"--ray {address}: give auto or HOST:PORT of the cluster's head")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise RayUnavailable(f"--ray {address}: no Ray head answers there ({e.strerror or e})") from None


def cluster_cpus(address: str) -> int:
    ray = connect(address)
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


class RayPool:
    """Up to `workers` Ray actors, made at the first `run` and kept until `close`."""

    def __init__(self, job: Job, workers: int, address: str, info: WorkerInfo):
        self.job, self.workers, self.info = job, max(1, workers), info
        self.ray = connect(address)
        self.Actor = self.ray.remote(num_cpus=1, max_restarts=0)(CampaignActor)
        self.actors: list[Any] = []  # set up and idle between runs
        self.setup_failures = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self) -> None:
        for actor in self.actors:
            self.kill(actor)
        self.actors = []

    def ready(self, actors: list) -> list:
        """Waits for `actors` to set up (together: vLLM's load is the slow part)."""
        from ray.exceptions import RayActorError

        for actor in actors:
            try:
                error, report = self.ray.get(actor.ready.remote())
            except RayActorError as e:
                for a in actors:
                    self.kill(a)
                raise SetupError(f"a Ray worker died while setting up ({one_line(e)[:200]})") from None
            if error is not None:
                for a in actors:
                    self.kill(a)
                raise SetupError(error)
            self.info.setups.append(report)
        return actors

    def new_actor(self):
        return self.ready([self.Actor.remote(self.job, list(sys.path))])[0]

    def run(self, items: Sequence[tuple[int, Any]]) -> Iterator[tuple[int, Any]]:
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        ray, job, info = self.ray, self.job, self.info
        todo: deque[list[tuple[int, Any]]] = deque(list(items[i:i + CHUNK]) for i in range(0, len(items), CHUNK))
        if not todo:
            return
        want = min(self.workers, len(todo))
        if len(self.actors) < want:
            self.actors += self.ready([self.Actor.remote(job, list(sys.path))
                                       for _ in range(want - len(self.actors))])
        idle: list[Any] = list(self.actors)
        self.actors = []
        running: dict[Any, tuple[Any, list, float]] = {}  # task ref -> (actor, chunk, deadline)

        def give(actor) -> None:
            if not todo:
                idle.append(actor)
                return
            chunk = todo.popleft()
            # No heartbeat crosses Ray: every chunk is allowed one long phase (a shrink).
            deadline = time.monotonic() + job.item_timeout * len(chunk) + job.long_timeout
            running[actor.run_chunk.remote(chunk)] = (actor, chunk, deadline)

        def lost(actor, chunk: list, kind: str, detail: str) -> Iterator[tuple[int, Any]]:
            info.restarts += 1
            self.kill(actor)
            if len(chunk) > 1:
                # Which item did it is not known: each goes again alone, first in line.
                todo.extendleft([x] for x in reversed(chunk))
            else:
                yield chunk[0][0], WorkerFailure(kind, detail)
            if todo:
                give(self.new_actor())

        try:
            while idle and todo:
                give(idle.pop())
            while running:
                soonest = min(d for _, _, d in running.values())
                done, _ = ray.wait(list(running), num_returns=1,
                                   timeout=max(0.0, min(soonest - time.monotonic(), 60.0)))
                for ref in done:
                    actor, chunk, _ = running.pop(ref)
                    try:
                        results = ray.get(ref, timeout=0)
                    except (RayActorError, RayTaskError, GetTimeoutError) as e:
                        yield from lost(actor, chunk, "crashed", f"the Ray worker died ({one_line(e)[:200]})")
                        continue
                    give(actor)
                    yield from results
                now = time.monotonic()
                for ref, (actor, chunk, deadline) in list(running.items()):
                    if now > deadline:
                        running.pop(ref)
                        yield from lost(actor, chunk, "hung", f"no result within {job.item_timeout:g} s per item; "
                                        "the Ray worker was stopped")
                while idle and todo:
                    give(idle.pop())
        except BaseException:
            for actor, _, _ in running.values():
                self.kill(actor)
            running.clear()
            raise
        finally:
            self.actors = idle + [actor for actor, _, _ in running.values()]


__all__ = ["CHUNK", "CampaignActor", "RayPool", "RayUnavailable", "cluster_cpus", "connect", "reachable"]
