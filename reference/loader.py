"""The loader of implementations: `--impl spec|vllm|torch|module:Class`.

The built-in names are module:Class strings like any user's, so this base layer
names the layers above it only as text and imports them only when asked.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import sys
import time

from .errors import shown


class ImplementationError(RuntimeError):
    """An implementation could not be loaded or broke the protocol."""


BUILTIN_IMPLS = {"spec": "schedspec.reference.impl:SpecScheduler",
                 "vllm": "schedspec.reference.vllm_adapter:VllmScheduler",
                 "torch": "schedspec.gpu.impl:TorchScheduler"}


_IMPL_FORM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def _import(module_name: str, name: str):
    """Import `module_name` as `python -m` would see it: when it is not found on
    sys.path, the current directory is tried too (the `schedspec` script's
    sys.path[0] is its own bin folder, not the folder it runs in)."""
    top = module_name.partition(".")[0]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != top or os.getcwd() in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e2:
            if e2.name == top:
                sys.path.remove(os.getcwd())
            raise


#: `vllm==X`: vLLM release X, which the process must already be running
#: (cli/vllm_version.py re-executes a command under X's interpreter).
RELEASE_PREFIX = "vllm=="


def split_release(name: str) -> tuple[str, str | None]:
    """`vllm==0.30.0` -> ("vllm", "0.30.0"); any other name -> (name, None)."""
    if name.startswith(RELEASE_PREFIX):
        return "vllm", name[len(RELEASE_PREFIX):]
    return name, None


def check_impl_name(name: str) -> None:
    """ImplementationError unless `name` is a built-in name, vllm==X or
    module:Class (a cheap check, before workers start and import it)."""
    base, _ = split_release(name)
    if not _IMPL_FORM.match(BUILTIN_IMPLS.get(base, base)):
        raise ImplementationError(
            f"--impl {shown(name)}: unknown implementation; use one of {', '.join(BUILTIN_IMPLS)} or "
            "module:Class (a dotted module path and a class name)")


@functools.cache
def impl_class(name: str):
    """The class `name` names (`--impl`'s forms), imported but not built, for
    what it declares of itself (e.g. `unmodelled_features`, reference/impl.py);
    None where it cannot be had, which `load_impl` reports when it loads it."""
    try:
        check_impl_name(name)
    except ImplementationError:
        return None
    base, _ = split_release(name)
    module_name, _, cls_name = BUILTIN_IMPLS.get(base, base).partition(":")
    try:
        module = _import(module_name, name)
    except Exception:  # noqa: BLE001 - a missing or broken module: load_impl says what
        return None
    cls = getattr(module, cls_name, None)
    return cls if inspect.isclass(cls) else None


def load_impl(name: str, device: str | None = None, status=None) :
    """`spec`, `vllm`, `torch`, or `module:Class` for your own; `device` only for torch.

    `status(message)`, when given, is told before a load known to be slow
    (vLLM: about 20 s).  The returned object carries `load_seconds`, the time
    its import and construction took, so timing summaries can count it apart.
    """
    if device is not None and name != "torch":
        raise ImplementationError(f"implementation '{shown(name)}' takes no device; --device is for --impl torch")
    check_impl_name(name)
    base, release = split_release(name)
    target = BUILTIN_IMPLS.get(base, base)
    module_name, _, cls_name = target.partition(":")
    if base == "vllm" and status is not None:
        status("loading vLLM (about 20 s) ...")
    t0 = time.perf_counter()
    try:
        module = _import(module_name, name)
    except ImportError as e:
        hint = (" (install it with `schedspec install-vllm`)" if base == "vllm"
                else " (looked on sys.path and in the current folder)" if isinstance(e, ModuleNotFoundError)
                else "")
        raise ImplementationError(f"--impl {shown(name)}: cannot import {module_name}: {shown(e, 200)}{hint}") from None
    except Exception as e:  # noqa: BLE001 - the user's module may raise anything at import
        raise ImplementationError(f"--impl {shown(name)}: importing {module_name} failed: "
                                  f"{type(e).__name__}: {shown(e, 200)}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise ImplementationError(f"--impl {shown(name)}: {module_name} has no class {cls_name}")
    if not inspect.isclass(cls):
        raise ImplementationError(f"--impl {shown(name)}: {module_name}.{cls_name} is a "
                                  f"{type(cls).__name__}, not a class")
    try:
        impl = cls() if device is None else cls(device=device)
    except ValueError as e:  # e.g. CUDA asked for and not available
        raise ImplementationError(f"--impl {shown(name)}: {shown(e, 200)}") from None
    except Exception as e:  # noqa: BLE001 - a user class whose constructor fails
        raise ImplementationError(f"--impl {shown(name)}: {module_name}.{cls_name}() failed: "
                                  f"{type(e).__name__}: {shown(e, 200)}") from None
    missing = [m for m in ("reset", "add_request", "finish_requests", "schedule",
                           "update_from_output", "observe") if not callable(getattr(impl, m, None))]
    if missing:
        raise ImplementationError(f"--impl {shown(name)}: {target} lacks {', '.join(missing)} of the "
                                  "implementation protocol")
    if release is not None and getattr(impl, "vllm_version", release) != release:
        close = getattr(impl, "close", None)
        if callable(close):
            close()
        raise ImplementationError(f"--impl {name}: this interpreter ({sys.executable}) has vLLM "
                                  f"{impl.vllm_version}; run schedspec from vLLM {release}'s environment")
    try:
        if not hasattr(impl, "name") or release is not None:
            impl.name = name
        impl.load_seconds = time.perf_counter() - t0
    except AttributeError:  # __slots__ or a read-only property: timing is optional
        pass
    return impl
