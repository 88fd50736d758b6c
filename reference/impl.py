"""The implementation protocol: what the engine, the differential tester and the
property checker need from any scheduler (the spec, the torch one, vLLM's, yours).

An implementation is a stateful object with vLLM's four scheduler calls plus
`observe()`, which reports its state as the spec's `SchedulerState` (requests with
their counters, running and waiting in order, KV blocks).  Plug in your own with
`--impl package.module:ClassName`; the class is built with no arguments.
"""

from __future__ import annotations

import importlib
from typing import Iterable, Mapping, Protocol, Sequence, runtime_checkable

from ..spec import scheduler as spec_scheduler
from ..spec.config import SchedulerConfig, validate_config
from ..spec.request import Request, RequestStatus
from ..spec.state import SchedulerOutput, SchedulerState


class ImplementationError(RuntimeError):
    """An implementation could not be loaded or broke the protocol."""


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

    def schedule(self) -> SchedulerOutput:
        output, self.state = spec_scheduler.schedule(self.state)
        return output

    def update_from_output(self, output, sampled_token_ids):
        finished, self.state = spec_scheduler.update_from_output(self.state, output, sampled_token_ids)
        return finished

    def observe(self) -> SchedulerState:
        return self.state

    def close(self) -> None:
        pass


BUILTIN_IMPLS = {"spec": "schedspec.reference.impl:SpecScheduler",
                 "vllm": "schedspec.reference.vllm_adapter:VllmScheduler",
                 "torch": "schedspec.gpu.impl:TorchScheduler"}


def load_impl(name: str, device: str | None = None) -> SchedulerImpl:
    """`spec`, `vllm`, `torch`, or `module:Class` for your own; `device` only for torch."""
    if device is not None and name != "torch":
        raise ImplementationError(f"implementation {name!r} takes no device; --device is for --impl torch")
    target = BUILTIN_IMPLS.get(name, name)
    if ":" not in target:
        raise ImplementationError(
            f"unknown implementation {name!r}; use one of {', '.join(BUILTIN_IMPLS)} or module:Class")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        hint = " (install it with `schedspec install-vllm`)" if name == "vllm" else ""
        raise ImplementationError(f"cannot import implementation {name!r}: {e}{hint}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ImplementationError(f"{module_name} has no class {cls_name}")
    if device is None:
        impl = cls()
    else:
        try:
            impl = cls(device=device)
        except ValueError as e:  # e.g. CUDA asked for and not available
            raise ImplementationError(str(e)) from None
    missing = [m for m in ("reset", "add_request", "finish_requests", "schedule",
                           "update_from_output", "observe") if not callable(getattr(impl, m, None))]
    if missing:
        raise ImplementationError(f"{target} lacks {', '.join(missing)} of the implementation protocol")
    if not hasattr(impl, "name"):
        impl.name = name
    return impl
