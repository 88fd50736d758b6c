"""vLLM's schedulers under the monitor: `ShadowScheduler`, `ShadowAsyncScheduler`,
and `install()`, which puts every scheduler of the process under it.

Turn it on for a real engine with one argument, vLLM's `scheduler_cls`:

    LLM(model=..., scheduler_cls="schedspec.monitor.shadow.ShadowAsyncScheduler")
    vllm serve MODEL --scheduler-cls schedspec.monitor.shadow.ShadowAsyncScheduler

(`ShadowScheduler` where async scheduling is off).  The policy and the folder for
state vectors come from the environment: SCHEDSPEC_MONITOR_POLICY (`count`, the
default, `log` or `raise`) and SCHEDSPEC_MONITOR_VECTORS (a folder).  The
process's monitor is `default_monitor()`; `summary()` gives its figures.

Importing this module imports vLLM.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from .monitor import Monitor, add_request_check, finish_check, schedule_check, update_check

PREEMPTED_ATTR = "schedspec_preempted"  # the ids `_preempt_request` was called with, in order

_default: Monitor | None = None
_installed: dict[str, Any] = {}  # method name -> vLLM's own function, while install() is in force


def default_monitor() -> Monitor:
    """The process's monitor, made on first use from the environment."""
    global _default
    if _default is None:
        _default = Monitor(os.environ.get("SCHEDSPEC_MONITOR_POLICY", "count"),
                           os.environ.get("SCHEDSPEC_MONITOR_VECTORS") or None)
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


METHODS = ("_preempt_request", "schedule", "update_from_output", "add_request", "finish_requests")


class ShadowScheduler(Scheduler):
    """vLLM's synchronous Scheduler, every call checked against the spec."""


class ShadowAsyncScheduler(AsyncScheduler):
    """vLLM's AsyncScheduler, every call checked against the spec."""


for _name in METHODS:
    setattr(ShadowScheduler, _name, monitored(_name, getattr(Scheduler, _name)))
    setattr(ShadowAsyncScheduler, _name, monitored(_name, getattr(AsyncScheduler, _name)))


def install(policy: str = "count", vectors_dir: str | None = None) -> Monitor:
    """Put every vLLM scheduler of this process under a new monitor: vLLM's own
    classes are patched, so schedulers built by any code (vLLM's tests, an
    engine) are checked.  `uninstall()` restores them."""
    monitor = Monitor(policy, vectors_dir)
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
