"""Async scheduling: output that was in flight when its request was preempted
(stale output; RQ:169-180, S = vllm/v1/core/sched/scheduler.py).  It is
either delivered when it returns (appended: it can finish the waiting request,
and progress and placeholders stay) or, in *drop mode*, discarded.
reset_prefix_cache(reset_running_requests=True) preempts in drop mode
(S:3333-3344); schedule() preempts in delivery mode unless a KV connector needs
the KV delivered (S:991).  Each function here is called at one site of scheduler.py.
"""

from __future__ import annotations

from .request import Request


def make_stale(r: Request, drop: bool) -> None:
    """At a preemption, working copy `r`'s tokens in flight become stale (S:1889).  A
    drop-mode share not yet drained stays dropped: its positions have been
    resampled; schedule() itself preempts in drop mode only for a KV connector
    that needs the KV delivered (`drop`, S:988-992, 1886-1888)."""
    r.drop_stale_output = drop or (r.drop_stale_output and r.num_stale_output_tokens > 0)
    r.num_stale_output_tokens = r.num_in_flight_tokens


def pending(r: Request) -> bool:
    """Stale output in flight that will be appended: resuming now could resample a
    position it fills, so the waiting loop skips the request (S:1123-1128)."""
    return r.num_stale_output_tokens > 0 and not r.drop_stale_output


def drain(r: Request, n: int) -> bool:
    """A returning batch that granted `n` tokens to working copy `r` while its output
    was stale: they leave flight and the stale count (S:2362-2369).  Whether its
    tokens are appended; in drop mode they are discarded (S:2383-2385)."""
    r.num_in_flight_tokens -= n
    r.num_stale_output_tokens -= n
    return not r.drop_stale_output
