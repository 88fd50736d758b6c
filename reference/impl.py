"""The implementation protocol: what the engine, the differential tester and the
property checker need from any scheduler (the spec, the torch one, vLLM's, yours).

An implementation is a stateful object with vLLM's four scheduler calls plus
`observe()`, which reports its state as the spec's `SchedulerState` (requests with
their counters, running and waiting in order, KV blocks).  Plug in your own with
`--impl package.module:ClassName`; the class is built with no arguments
(reference/loader.py).

Optional: `load_state(state)` (the `StateLoadable` protocol) sets the
implementation to any given `SchedulerState`, config included, as if it had
got there by its own calls.  Replaying state vectors (reference/vectors.py,
`schedspec vectors check`) needs it; nothing else does, and an
implementation without it is told so in one line.
"""

from __future__ import annotations

import inspect
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.config import SchedulerConfig, validate_config
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.state import SchedulerOutput, SchedulerState


@runtime_checkable
class SchedulerImpl(Protocol):
    name: str

    def reset(self, config: SchedulerConfig) -> None:
        """Start empty with `config`; raise ConfigError (or ValueError) to reject it."""

    def add_request(self, request: Request) -> None: ...

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> Sequence[str]:
        """Finish (abort) requests; return the ids that were actually finished."""

    def schedule(self) -> SchedulerOutput: ...

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, Sequence[int]]
    ) -> Sequence[tuple[str, RequestStatus]]:
        """Apply the model's output; return (id, status) of requests it finished."""

    def observe(self) -> SchedulerState: ...

    def close(self) -> None: ...


@runtime_checkable
class DraftTaking(Protocol):
    """The part of the protocol speculative decoding needs (synchronous engine):
    the drafter's proposals after a step, by request id.  An implementation
    without it is refused scenarios with num_speculative_tokens > 0."""

    def update_draft_token_ids(self, draft_token_ids: Mapping[str, Sequence[int]]) -> None: ...


@runtime_checkable
class GrammarTaking(Protocol):
    """The part of the protocol structured output needs: the requests whose grammar
    finished compiling (`failed`: with an error), between scheduler calls.  An
    implementation without it is refused scenarios with grammar_compile_steps."""

    def grammar_compiled(self, request_ids: Sequence[str], failed: bool = False) -> None: ...


# KV connector hits (spec/kv_connector.py) need nothing more of the protocol: a request
# carries its `kv_connector_tokens`.  An implementation that does not model them says so
# with a class attribute `models_kv_connector_hits = False`, and is refused scenarios
# that use them (reference/engine.py); without it, it is taken to model them.
# Asynchronous loads (kv_connector_load_steps) need update_from_output to take a third
# argument, `finished_recving`: the requests whose load the worker reports finished
# (vLLM's kv_connector_output.finished_recving); one without it is refused such scenarios.
# Likewise sends (kv_connector_send_steps) need `finished_sending`, the requests whose KV
# the worker reports sent (kv_connector_output.finished_sending).
# Encoder inputs (spec/encoder_inputs.py) need nothing more either: a request carries its
# `mm_features`, an output its `scheduled_encoder_inputs` and `free_encoder_mm_hashes`.  An
# implementation without them says so with `models_encoder_inputs = False`, and is refused
# scenarios with encoder inputs; one that leaves those outputs empty diverges.
# A class attribute `unmodelled_features` (a frozenset of reference/generator.py FEATURES)
# names the features an implementation does not model: random campaigns against it draw
# none of them (generator.py `features_for`); it is read from the class, not built
# (reference/loader.py `impl_class`).  Without it, every feature is taken to be modelled.


def takes_finished_recving(impl: object) -> bool:
    """Whether `impl`'s update_from_output takes `finished_recving` (asynchronous KV loads)."""
    return "finished_recving" in inspect.signature(impl.update_from_output).parameters


def takes_finished_sending(impl: object) -> bool:
    """Whether `impl`'s update_from_output takes `finished_sending` (KV connector sends)."""
    return "finished_sending" in inspect.signature(impl.update_from_output).parameters


@runtime_checkable
class StateLoadable(Protocol):
    """The optional part of the protocol: set the implementation to `state`
    (a whole SchedulerState: config, requests, queues, KV pool, finished ids),
    replacing whatever it held.  Calls that follow behave as from that state."""

    def load_state(self, state: SchedulerState) -> None: ...


class SpecScheduler:
    """The executable specification behind the implementation protocol."""

    name = "spec"

    def __init__(self) -> None:
        self.state: SchedulerState | None = None

    def reset(self, config: SchedulerConfig) -> None:
        validate_config(config)
        self.state = SchedulerState(config)

    def add_request(self, request: Request) -> None:
        self.state = spec_scheduler.add_request(self.state, request)

    def finish_requests(self, request_ids, status):
        done, self.state = spec_scheduler.finish_requests(self.state, request_ids, status)
        return done

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        output, self.state = spec_scheduler.schedule(self.state, throttle_prefills)
        return output

    def update_from_output(self, output, sampled_token_ids, finished_recving=(), finished_sending=()):
        finished, self.state = spec_scheduler.update_from_output(self.state, output, sampled_token_ids,
                                                                 finished_recving, finished_sending)
        return finished

    def update_draft_token_ids(self, draft_token_ids):
        self.state = spec_scheduler.update_draft_token_ids(self.state, draft_token_ids)

    def grammar_compiled(self, request_ids, failed=False):
        self.state = spec_scheduler.grammar_compiled(self.state, request_ids, failed)

    def observe(self) -> SchedulerState:
        return self.state

    def load_state(self, state: SchedulerState) -> None:
        # A state is a value, so holding it is enough.  Its config is not held to
        # vLLM's start-up checks: a state lifted from a scheduler built directly
        # (vLLM's tests) may break them and still be replayed.
        self.state = state

    def close(self) -> None:
        pass
