"""vLLM's schedulers under the monitor: `ShadowScheduler`, `ShadowAsyncScheduler`,
and `install()`, which puts every scheduler of the process under it.

Turn it on for a real engine with one argument, vLLM's `scheduler_cls`:

    LLM(model=..., scheduler_cls="schedspec.monitor.shadow.ShadowAsyncScheduler")
    vllm serve MODEL --scheduler-cls schedspec.monitor.shadow.ShadowAsyncScheduler

(`ShadowScheduler` where async scheduling is off).  The policy and the folder for
state vectors come from the environment: SCHEDSPEC_MONITOR_POLICY (`count`, the
default, `log` or `raise`) and SCHEDSPEC_MONITOR_VECTORS (a folder; with
SCHEDSPEC_MONITOR_RECORD=all every checked call is written there, not only
divergences).  In an engine
nothing but the scheduler's own methods touches it between calls, so each call
starts from the previous call's post-state.  By default that is the spec's own,
and after each call the monitor reads from vLLM only what the call changed
(SCHEDSPEC_MONITOR_CHECK=incremental, monitor/incremental.py), with a full lift
and comparison every SCHEDSPEC_MONITOR_FULL_EVERY calls (256) and before any
divergence is reported; SCHEDSPEC_MONITOR_CHECK=full lifts and compares the
whole post-state after every call.  SCHEDSPEC_MONITOR_RELIFT=1 lifts every
pre-state afresh as well, with the full check (what `install()` does, for code
that edits the scheduler's internals by hand, such as vLLM's tests).  The
process's monitor is `default_monitor()`; `summary()` gives its figures.

Importing this module imports vLLM: whichever release of spec/versions.py
RELEASES the interpreter has (`schedspec peer-tests --version X` runs release X's
interpreter).  The shadow classes subclass that release's Scheduler and
AsyncScheduler, and the lift gives the spec config that release's vllm_version,
so its version gates apply.  Where a release's methods differ, a "Bridge" below
says how, with the release's source lines; each is checked per release in
tests/test_peer_tests_versions.py.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import Any, Mapping

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from .monitor import FULL_EVERY, POST_ATTR, Monitor, add_request_check, finish_check, schedule_check, update_check
from .replay import LOG_ATTR

RELEASE = vllm.__version__  # the release shadowed here (and modelled by the spec: lift_config)
PREEMPTED_ATTR = "schedspec_preempted"  # the ids `_preempt_request` was called with, in order

_default: Monitor | None = None
_installed: dict[str, Any] = {}  # method name -> vLLM's own function, while install() is in force


def default_monitor() -> Monitor:
    """The process's monitor, made on first use from the environment."""
    global _default
    if _default is None:
        _default = monitor_from_environment(os.environ)
    return _default


def monitor_from_environment(env: Mapping[str, str]) -> Monitor:
    """The monitor the SCHEDSPEC_MONITOR_* variables describe (the module's docstring);
    a bad value is a ValueError naming its variable."""
    relift = env.get("SCHEDSPEC_MONITOR_RELIFT", "0") == "1"
    check = env.get("SCHEDSPEC_MONITOR_CHECK", "full" if relift else "incremental")
    every = env.get("SCHEDSPEC_MONITOR_FULL_EVERY", str(FULL_EVERY))
    if not every.isdigit():  # its bound is the Monitor's to check
        raise ValueError(f"SCHEDSPEC_MONITOR_FULL_EVERY: {every!r} is not a whole number of calls >= 1")
    try:
        return Monitor(env.get("SCHEDSPEC_MONITOR_POLICY", "count"), env.get("SCHEDSPEC_MONITOR_VECTORS") or None,
                       relift=relift, record_all=env.get("SCHEDSPEC_MONITOR_RECORD") == "all", check=check,
                       full_every=int(every))
    except ValueError as e:  # the Monitor's own message names its argument: named here by its variable
        argument, _, why = str(e).partition(":")
        raise ValueError(f"{ENV_OF.get(argument, argument)}:{why}") from None


ENV_OF = {"policy": "SCHEDSPEC_MONITOR_POLICY", "check": "SCHEDSPEC_MONITOR_CHECK",
          "full_every": "SCHEDSPEC_MONITOR_FULL_EVERY", "record_all": "SCHEDSPEC_MONITOR_RECORD"}


def set_default_monitor(monitor: Monitor) -> None:
    global _default
    _default = monitor


def preempted_list(sched: Any) -> list[str]:
    lst = sched.__dict__.get(PREEMPTED_ATTR)
    if lst is None:
        lst = sched.__dict__[PREEMPTED_ATTR] = []
    return lst


# Bridge (in-flight counters): a request's num_in_flight_tokens (tokens scheduled
# whose output has not come back) and num_stale_output_tokens (those of them
# scheduled before its last preemption) exist from 0.28.0 (0.28.0 v1/request.py:
# 155-163, kept at scheduler.py:1369, 1393, 1802-1807).  The spec keeps them in
# every release, and they are nonzero after any schedule() until its
# update_from_output, so 0.20.0 and 0.25.0 lift (as 0) a value the spec does not
# hold.  There the monitor keeps them itself on vLLM's request objects, by
# 0.28.0's four lines, from the calls vLLM's scheduler makes (the release never
# reads them): + the grant after schedule(), - the grant in update_from_output
# (the stale share in lockstep), stale = in flight at a preemption.
GHOST_COUNTERS = "num_in_flight_tokens" not in Request.__init__.__code__.co_names


def ghost_scheduled(sched: Any, out: Any) -> None:
    requests = sched.requests
    for rid, n in out.num_scheduled_tokens.items():
        r = requests.get(rid)
        if r is not None:
            r.num_in_flight_tokens = getattr(r, "num_in_flight_tokens", 0) + n


def ghost_updated(sched: Any, scheduler_output: Any) -> None:
    requests = sched.requests
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        r = requests.get(rid)
        if r is not None:
            r.num_in_flight_tokens = getattr(r, "num_in_flight_tokens", 0) - n
            if getattr(r, "num_stale_output_tokens", 0) > 0:
                r.num_stale_output_tokens -= n


def ghost_preempted(request: Any) -> None:
    request.num_stale_output_tokens = getattr(request, "num_in_flight_tokens", 0)


def monitored(name: str, fn):
    """vLLM's method `fn`, checked by the default monitor."""

    if name == "_preempt_request":
        @functools.wraps(fn)
        def preempt(self, request, *args, **kwargs):
            # vLLM keeps the ids preempted in a step in a set; the order is the spec's output.
            preempted_list(self).append(request.request_id)
            if GHOST_COUNTERS:
                ghost_preempted(request)
            return fn(self, request, *args, **kwargs)
        return preempt

    if name == "schedule":
        # Bridge (throttle_prefills): schedule() takes it from 0.25.0 (0.25.0
        # scheduler.py `def schedule(self, throttle_prefills: bool = False)`);
        # 0.20.0's `schedule(self)` takes nothing, so nothing is throttled there.
        @functools.wraps(fn)
        def schedule(self, *args, **kwargs):
            throttle = kwargs.get("throttle_prefills", args[0] if args else False)
            if GHOST_COUNTERS:
                def original():
                    out = fn(self, *args, **kwargs)
                    ghost_scheduled(self, out)
                    return out
            else:
                original = functools.partial(fn, self, *args, **kwargs)
            return schedule_check(default_monitor(), self, original, bool(throttle), preempted_list(self))
        return schedule

    if name == "update_from_output":
        @functools.wraps(fn)
        def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
            if GHOST_COUNTERS:
                def original():
                    result = fn(self, scheduler_output, model_runner_output, *args, **kwargs)
                    ghost_updated(self, scheduler_output)
                    return result
            else:
                original = functools.partial(fn, self, scheduler_output, model_runner_output, *args, **kwargs)
            return update_check(default_monitor(), self, original, scheduler_output, model_runner_output)
        return update_from_output

    if name == "add_request":
        @functools.wraps(fn)
        def add_request(self, request, *args, **kwargs):
            return add_request_check(default_monitor(), self, lambda: fn(self, request, *args, **kwargs), request)
        return add_request

    if name == "finish_requests":
        @functools.wraps(fn)
        def finish_requests(self, request_ids, finished_status, *args, **kwargs):
            answer = []  # vLLM's own answer, handed back to the caller whatever the monitor saw

            def original():
                answer.append(fn(self, request_ids, finished_status, *args, **kwargs))
                return finished_requests(answer[0])

            judged = finish_check(default_monitor(), self, original, request_ids, finished_status)
            return answer[0] if answer else judged
        return finish_requests

    raise ValueError(f"no monitor for {name}")


def finished_requests(done: Any) -> Any:
    """Bridge (finish_requests' answer): the monitor reads the finished requests'
    `request_id`s.  From 0.28.0 vLLM answers with the requests themselves (0.28.0
    scheduler.py `-> list[Request]`); 0.20.0 and 0.25.0 answer (request_id,
    client_index) pairs (0.25.0 scheduler.py `-> list[tuple[str, int]]`), given
    to the monitor as objects with that request_id (reference/vllm_adapter.py
    finished_ids bridges the same).  The caller gets vLLM's own answer."""
    if not done or not isinstance(done[0], tuple):
        return done
    return [SimpleNamespace(request_id=d[0]) if isinstance(d, tuple) else d for d in done]


def forgetting(fn):
    """A scheduler method the monitor does not check: calling it forgets the last
    lifted post-state, so the next checked call lifts its pre-state afresh, and
    ends the record of the run as a scenario (no scenario event says what it did)."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        self.__dict__.pop(POST_ATTR, None)
        run = self.__dict__.get(LOG_ATTR)
        if run is not None:
            run.stop(f"{fn.__name__}() was called, which no scenario event stands for")
        return fn(self, *args, **kwargs)
    return method


METHODS = ("_preempt_request", "schedule", "update_from_output", "add_request", "finish_requests")
# Public methods that only read the scheduler (S:3050-3064, 3287-3323, 3393-3480).
READ_ONLY = {"get_request_counts", "has_unfinished_requests", "get_kv_cache_usage", "has_request", "get_num_unfinished_requests",
             "has_finished_requests", "has_requests", "make_stats", "make_spec_decoding_stats",
             "get_kv_connector", "get_ec_connector", "get_kv_event_publisher_config", "get_grammar_bitmask"}


def other_methods(cls: type) -> list[str]:
    """The public methods of `cls` that the monitor neither checks nor knows to be reads."""
    names = set()
    for klass in cls.__mro__:
        for name, value in vars(klass).items():
            if not name.startswith("_") and callable(value) and not isinstance(value, type):
                names.add(name)
    return sorted(names - set(METHODS) - READ_ONLY)


def _block_size_as_hash_block_size(self) -> int:
    return self.block_size


# Bridge (hash_block_size): the monitor reads a scheduler's hash block size
# (monitor.py add_request_check, scope.py); the attribute is set by
# Scheduler.__init__ from 0.28.0, and 0.20.0 and 0.25.0 hash in whole blocks
# (0.25.0 v1/core/kv_cache_utils.py get_request_block_hasher takes block_size).
# There it is given as a read-only property returning the block size; a release
# that has the attribute is left as it is.
RELEASE_ATTRIBUTES = {} if "hash_block_size" in Scheduler.__init__.__code__.co_names else {
    "hash_block_size": property(_block_size_as_hash_block_size)}
_added: list[str] = []  # attributes install() gave vLLM's Scheduler


class ShadowScheduler(Scheduler):
    """vLLM's synchronous Scheduler, every call checked against the spec."""


class ShadowAsyncScheduler(AsyncScheduler):
    """vLLM's AsyncScheduler, every call checked against the spec."""


for _cls, _base in ((ShadowScheduler, Scheduler), (ShadowAsyncScheduler, AsyncScheduler)):
    for _name, _value in RELEASE_ATTRIBUTES.items():
        setattr(_cls, _name, _value)
    for _name in METHODS:
        setattr(_cls, _name, monitored(_name, getattr(_base, _name)))
    for _name in other_methods(_base):
        setattr(_cls, _name, forgetting(getattr(_base, _name)))


def install(policy: str = "count", vectors_dir: str | None = None, relift: bool = True,
            record_all: bool = False) -> Monitor:
    """Put every vLLM scheduler of this process under a new monitor: vLLM's own
    classes are patched, so schedulers built by any code (vLLM's tests, an
    engine) are checked.  `uninstall()` restores them."""
    monitor = Monitor(policy, vectors_dir, relift, record_all)
    set_default_monitor(monitor)
    if not _installed:
        for name in METHODS:
            original = Scheduler.__dict__[name]
            _installed[name] = original
            setattr(Scheduler, name, monitored(name, original))
        for name, value in RELEASE_ATTRIBUTES.items():
            if name not in Scheduler.__dict__:
                setattr(Scheduler, name, value)
                _added.append(name)
    return monitor


def uninstall() -> None:
    for name, original in _installed.items():
        setattr(Scheduler, name, original)
    _installed.clear()
    for name in _added:
        delattr(Scheduler, name)
    _added.clear()


__all__ = ["GHOST_COUNTERS", "METHODS", "RELEASE", "RELEASE_ATTRIBUTES", "ShadowAsyncScheduler", "ShadowScheduler",
           "ENV_OF", "default_monitor", "finished_requests", "monitor_from_environment", "ghost_preempted", "ghost_scheduled", "ghost_updated", "install",
           "monitored", "set_default_monitor", "uninstall"]
