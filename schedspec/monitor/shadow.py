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
starts from the previous call's lifted post-state; SCHEDSPEC_MONITOR_RELIFT=1 lifts
every pre-state afresh instead (what `install()` does, for code that edits the
scheduler's internals by hand, such as vLLM's tests).  The process's monitor is
`default_monitor()`; `summary()` gives its figures.

Importing this module imports vLLM.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from .monitor import POST_ATTR, Monitor, add_request_check, finish_check, schedule_check, update_check

PREEMPTED_ATTR = "schedspec_preempted"  # the ids `_preempt_request` was called with, in order

_default: Monitor | None = None
_installed: dict[str, Any] = {}  # method name -> vLLM's own function, while install() is in force


def default_monitor() -> Monitor:
    """The process's monitor, made on first use from the environment."""
    global _default
    if _default is None:
        _default = Monitor(os.environ.get("SCHEDSPEC_MONITOR_POLICY", "count"),
                           os.environ.get("SCHEDSPEC_MONITOR_VECTORS") or None,
                           relift=os.environ.get("SCHEDSPEC_MONITOR_RELIFT", "0") == "1",
                           record_all=os.environ.get("SCHEDSPEC_MONITOR_RECORD") == "all")
    return _default


def set_default_monitor(monitor: Monitor) -> None:
    global _default
    _default = monitor


def preempted_list(sched: Any) -> list[str]:
    lst = sched.__dict__.get(PREEMPTED_ATTR)
    if lst is None:
        lst = sched.__dict__[PREEMPTED_ATTR] = []
    return lst


def monitored(name: str, fn):
    """vLLM's method `fn`, checked by the default monitor."""

    if name == "_preempt_request":
        @functools.wraps(fn)
        def preempt(self, request, *args, **kwargs):
            # vLLM keeps the ids preempted in a step in a set; the order is the spec's output.
            preempted_list(self).append(request.request_id)
            return fn(self, request, *args, **kwargs)
        return preempt

    if name == "schedule":
        @functools.wraps(fn)
        def schedule(self, *args, **kwargs):
            throttle = kwargs.get("throttle_prefills", args[0] if args else False)
            return schedule_check(default_monitor(), self, lambda: fn(self, *args, **kwargs), bool(throttle),
                                  preempted_list(self))
        return schedule

    if name == "update_from_output":
        @functools.wraps(fn)
        def update_from_output(self, scheduler_output, model_runner_output, *args, **kwargs):
            return update_check(default_monitor(), self,
                                lambda: fn(self, scheduler_output, model_runner_output, *args, **kwargs),
                                scheduler_output, model_runner_output)
        return update_from_output

    if name == "add_request":
        @functools.wraps(fn)
        def add_request(self, request, *args, **kwargs):
            return add_request_check(default_monitor(), self, lambda: fn(self, request, *args, **kwargs), request)
        return add_request

    if name == "finish_requests":
        @functools.wraps(fn)
        def finish_requests(self, request_ids, finished_status, *args, **kwargs):
            return finish_check(default_monitor(), self,
                                lambda: fn(self, request_ids, finished_status, *args, **kwargs),
                                request_ids, finished_status)
        return finish_requests

    raise ValueError(f"no monitor for {name}")


def forgetting(fn):
    """A scheduler method the monitor does not check: calling it forgets the last
    lifted post-state, so the next checked call lifts its pre-state afresh."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        self.__dict__.pop(POST_ATTR, None)
        return fn(self, *args, **kwargs)
    return method


METHODS = ("_preempt_request", "schedule", "update_from_output", "add_request", "finish_requests")
# Public methods that only read the scheduler (S:2920-2930, 3147-3183, 3259-3346).
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


class ShadowScheduler(Scheduler):
    """vLLM's synchronous Scheduler, every call checked against the spec."""


class ShadowAsyncScheduler(AsyncScheduler):
    """vLLM's AsyncScheduler, every call checked against the spec."""


for _cls, _base in ((ShadowScheduler, Scheduler), (ShadowAsyncScheduler, AsyncScheduler)):
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
    return monitor


def uninstall() -> None:
    for name, original in _installed.items():
        setattr(Scheduler, name, original)
    _installed.clear()


__all__ = ["METHODS", "ShadowAsyncScheduler", "ShadowScheduler", "default_monitor", "install", "monitored",
           "set_default_monitor", "uninstall"]
