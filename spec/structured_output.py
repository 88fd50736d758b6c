"""Structured output, as the scheduler sees it (S = vllm/v1/core/sched/scheduler.py,
RQ = vllm/v1/request.py; modelled from 0.33.0).  A request with a grammar starts in
WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR (RQ:120-121) while its grammar compiles outside
the scheduler (the structured-output manager's thread pool).  The waiting loop skips
it, keeping its place, until the compilation has finished (S:1118-1121, S:3685-3697);
then it is promoted to WAITING and scheduled as any other request.  A grammar that
failed to compile is noted when the loop reaches the request (S:3690-3695), and the
next update_from_output finishes the request with FINISHED_ERROR (S:2619-2641).

When a compilation finishes is the environment's choice: `grammar_compiled` is that
event, between scheduler calls.  The grammar itself never changes a decision here:
it accepts every token the model samples (a rejection, S:2488-2499, is not modelled).
"""

from __future__ import annotations

from typing import Iterable

from .request import WAITING, RequestStatus
from .state import SchedulerState, Working

# Request.grammar: "" no structured output; else where its compilation stands.
COMPILING, COMPILED, FAILED = "compiling", "compiled", "failed"
WAITING_FOR_GRAMMAR = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR


def waits_for_grammar(w: Working, rid: str) -> bool:
    """Guard: the request's grammar still compiles, or failed: the waiting loop skips it
    this step (`_handle_blocked_waiting_request`, S:3685-3697)."""
    r = w.requests[rid]
    return r.status == WAITING_FOR_GRAMMAR and (r.grammar == COMPILING or r.grammar == FAILED)


def grammar_reached(w: Working, rid: str) -> None:
    """The loop reached the request (S:3685-3697), skipped or not: a failed grammar is
    noted once for update_from_output; a compiled one promotes it to WAITING."""
    r = w.requests[rid]
    if r.status != WAITING_FOR_GRAMMAR or r.grammar == COMPILING:
        return
    if r.grammar != FAILED:
        w.request(rid).status = WAITING
    elif rid not in w.grammar_compile_error_reqs:  # a dict keyed by id (S:3691)
        w.grammar_compile_error_reqs += (rid,)


def grammar_compiled(state: SchedulerState, request_ids: Iterable[str], failed: bool = False) -> SchedulerState:
    """The environment: these requests' grammars finished compiling (`failed`: with an
    error), as the future `structured_output_request.grammar` reads.  Unknown ids,
    requests without a grammar or with a finished compilation are left alone."""
    w = Working(state)
    for rid in request_ids:
        r = w.requests.get(rid)
        if r is not None and r.grammar == COMPILING:
            w.request(rid).grammar = FAILED if failed else COMPILED
    return w.freeze()


def take_grammar_errors(w: Working) -> tuple[str, ...]:
    """The requests whose grammar failed, noted since the last update_from_output,
    which finishes them; the note is emptied (S:2619-2620)."""
    errors, w.grammar_compile_error_reqs = w.grammar_compile_error_reqs, ()
    return tuple(rid for rid in errors if rid in w.requests)
