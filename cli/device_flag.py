"""`--device cpu|cuda` on the commands that run an implementation (`run`, `check`,
`diff`, `sweep`): one flag, one check, one error message everywhere; with
them, the torch implementation's environment ($SCHEDSPEC_TRACE_RENDERER).

The flag only means something to the torch implementation; giving it with
another one, or asking for CUDA on a machine without it, is a user error
(one line, exit 2), never a silent fallback.  Without the flag the torch
implementation picks cuda when available, else cpu (gpu/device.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from schedspec.reference.errors import UsageError

TORCH_IMPL = "torch"
DEVICE_CHOICES = ("cpu", "cuda")


def add_device_argument(parser) -> None:
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=None,
                        help="where --impl torch runs (default: cuda when available, else cpu)")


def device_for(device: str | None, impl_names: Iterable[str]) -> str | None:
    """The device to pass to `load_impl("torch", device=...)`, checked: None
    when the flag was not given.  With torch among the implementations, a bad
    $SCHEDSPEC_TRACE_RENDERER (or `native` where the C renderer is not
    built) is a usage error here, not a crash of every scenario later."""
    names = list(impl_names)
    if TORCH_IMPL in names:
        check_trace_renderer()
    if device is None:
        return None
    if TORCH_IMPL not in names:
        raise UsageError(f"--device {device}: only --impl torch runs on a device, not "
                         f"{' or '.join(repr(n) for n in names)}")
    try:
        from schedspec.gpu.device import resolve_device
    except ImportError as e:
        raise UsageError(f"--device {device}: the torch implementation cannot be imported ({e})") from None
    try:
        resolve_device(device)
    except ValueError as e:
        msg = (str(e).splitlines() or ["not available"])[0].removeprefix(f"device {device!r}: ")
        raise UsageError(msg if msg.startswith("--device") else f"--device {device}: {msg}") from None
    return device


def check_trace_renderer() -> None:
    """$SCHEDSPEC_TRACE_RENDERER as a one-line usage error (gpu/trace_native.py)."""
    from schedspec.gpu import trace_native

    try:
        if trace_native.choice() == "native":
            trace_native.available()
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None


def impl_device(name: str, device: str | None) -> str | None:
    """The device keyword for loading implementation `name` (only torch takes one)."""
    return device if name == TORCH_IMPL else None


__all__ = ["DEVICE_CHOICES", "add_device_argument", "check_trace_renderer", "device_for", "impl_device"]
