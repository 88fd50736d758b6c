"""The native trace renderer: the C extension module schedspec.gpu.trace_render
(gpu/trace_render.c), built when schedspec is installed, called per chunk of
records.

`render(...)` takes what gpu/trace_text.py's numpy renderer takes and returns the
same text; `available()` says whether the extension could be had, and `why_not()`
why not.  Nothing here is needed for a correct trace: without the extension (an
install without a C compiler; or SCHEDSPEC_TRACE_RENDERER=numpy) the numpy
renderer writes the same bytes, slower (a traced run about `SLOWDOWN` times),
and under `auto` a warning says so once and how to get the extension.

The extension's functions parse their arguments and check every array against
its buffer's shape and item format (gpu/trace_render.c), so a call that does
not match the C code is a TypeError or ValueError, never a bad read; the
wrapper here only hands it contiguous arrays of the types it takes.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import numpy as np

EXTENSION = f"{__package__}.trace_render"
SOURCE = Path(__file__).with_name("trace_render.c")
# the record fields in the order of the C enum (GRANT ... STOPPED)
FIELDS = ("grant", "num_computed_tokens", "status", "run_pos", "wait_key", "admitted", "preempt_order",
          "sampled", "aborted", "hit_tokens", "app_key", "stopped")
RENDERER_ENV = "SCHEDSPEC_TRACE_RENDERER"  # auto (default), numpy, or native (an error when it cannot be had)
# A traced torch run with the numpy renderer against one with the extension:
# 1.7x (S = 1024) and 2.1x (S = 8192) in benchmarks/torch_vs_spec.py --workload
# decode --write-traces, both flags on; the rendering alone 4x (gpu/README.md,
# "The renderer as an install-time extension")
SLOWDOWN = 2
HOW_TO_BUILD = ("install schedspec where a C compiler is on PATH (from a checkout: pip install -e .) "
                "and check the build's output for schedspec.gpu.trace_render")

_lib = None
_why_not: str | None = None
_error: Exception | None = None
_tried = False


def _import():
    """The extension module; ImportError when it is not built.  Warns when the
    source beside it is newer than the module (edited since the last build)."""
    lib = importlib.import_module(EXTENSION)
    built = Path(getattr(lib, "__file__", "") or "")
    if SOURCE.exists() and built.is_file() and SOURCE.stat().st_mtime > built.stat().st_mtime:
        warnings.warn(f"{SOURCE.name} is newer than the built {built.name}: the traces are rendered by the "
                      "old build; rebuild it (from a checkout: pip install -e .)", RuntimeWarning, stacklevel=3)
    return lib


def _load():
    """The extension, or None for the numpy renderer; decided once (`reset`).  A
    bad choice, or `native` that cannot be had, raises on every call.  Under
    `auto` a missing extension is a warning, once."""
    global _lib, _why_not, _tried, _error
    if _tried:
        if _error is not None:
            raise _error
        return _lib
    _tried = True
    try:
        chosen = choice()
    except ValueError as e:
        _error = e
        raise
    if chosen == "numpy":
        _why_not = f"{RENDERER_ENV}=numpy"
        return None
    try:
        _lib = _import()
    except ImportError as e:
        reason = f"the C extension {EXTENSION} is not built ({e})"
        if chosen == "native":
            _error = RuntimeError(f"{RENDERER_ENV}=native: the native trace renderer cannot be had: {reason}; "
                                  f"{HOW_TO_BUILD}")
            raise _error from e
        _why_not = reason
        warnings.warn(f"{reason}: traced torch runs use the numpy renderer, the same traces about {SLOWDOWN}x "
                      f"slower. To get it, {HOW_TO_BUILD}; {RENDERER_ENV}=numpy silences "
                      "this warning", RuntimeWarning, stacklevel=3)
    return _lib


def choice() -> str:
    """The renderer asked for in $SCHEDSPEC_TRACE_RENDERER: auto (the default),
    numpy or native; ValueError naming the variable for anything else."""
    value = os.environ.get(RENDERER_ENV, "").strip().lower() or "auto"
    if value not in ("auto", "numpy", "native"):
        raise ValueError(f"{RENDERER_ENV}={value}: not one of auto, numpy, native")
    return value


def available() -> bool:
    """Whether the native renderer runs (built and loaded on the first call)."""
    return _load() is not None


def why_not() -> str | None:
    """Why the numpy renderer runs instead (None when the native one does)."""
    _load()
    return _why_not


def reset() -> None:
    """Forget the choice, so that the next call reads the environment again (tests)."""
    global _lib, _why_not, _tried, _error
    _lib, _why_not, _tried, _error = None, None, False, None


def _column(a: np.ndarray | None) -> np.ndarray | None:
    """A record column as the extension reads it: C-contiguous signed integers
    (or bool) of 1, 2, 4 or 8 bytes; anything else as int64."""
    if a is None:
        return None
    if a.dtype.kind not in "bi" or a.dtype.itemsize not in (1, 2, 4, 8):
        a = a.astype(np.int64)
    return np.ascontiguousarray(a)


def record_bound(R: int, max_id_len: int) -> int:
    """The most bytes the renderer writes for one record of R slots."""
    return int(_load().record_bound(R, max_id_len))


def render(rec: dict[str, np.ndarray], first_step: int, scal: np.ndarray, tt: np.ndarray, ss: np.ndarray,
           abort_rank: np.ndarray, prefix_rows: np.ndarray, async_rows: np.ndarray, id_pool: np.ndarray,
           id_off: np.ndarray, id_len: np.ndarray, codes: tuple[int, int, int, int, int],
           out: np.ndarray) -> tuple[int, np.ndarray]:
    """Render records (tt[m], ss[m]) into `out` (uint8, at least len(tt) *
    record_bound(R, longest id) bytes): (bytes written, each record's end; a
    record left out ends where the one before it does).  Ids: request code
    s * R + r is id_pool[id_off[code]:][:id_len[code]], its JSON string
    (id_len < 0: a padding slot), the pool ending in 16 spare bytes.  The
    extension checks every shape and index (ValueError naming the argument)."""
    lib = _load()
    i64 = np.int64
    ends = np.empty(len(tt), dtype=i64)
    n = lib.render(columns=tuple(_column(rec.get(name)) for name in FIELDS),
                   scal=np.ascontiguousarray(scal, dtype=i64), tt=np.ascontiguousarray(tt, dtype=i64),
                   ss=np.ascontiguousarray(ss, dtype=i64), abort_rank=np.ascontiguousarray(abort_rank, dtype=i64),
                   prefix_rows=np.ascontiguousarray(prefix_rows, dtype=np.uint8),
                   async_rows=np.ascontiguousarray(async_rows, dtype=np.uint8), id_pool=id_pool,
                   id_off=np.ascontiguousarray(id_off, dtype=i64), id_len=np.ascontiguousarray(id_len, dtype=i64),
                   first_step=first_step, codes=codes, out=out, ends=ends)
    return n, ends


__all__ = ["EXTENSION", "FIELDS", "HOW_TO_BUILD", "RENDERER_ENV", "SLOWDOWN", "available", "choice", "record_bound",
           "render", "reset", "why_not"]
