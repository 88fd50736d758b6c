"""The native trace renderer (gpu/trace_render.c): compiled once per source
text with the system C compiler, loaded with ctypes, called per slice of records.

`render(...)` takes what gpu/trace_text.py's numpy renderer takes and returns the
same text; `available()` says whether the library could be had, and `why_not()`
why not.  Nothing here is needed for a correct trace: without a C compiler (or
with SCHEDSPEC_TRACE_RENDERER=numpy) the numpy renderer writes the same bytes,
about ten times slower.

The library is kept in $SCHEDSPEC_CACHE/native (default ~/.cache/schedspec/native),
named by the hash of the source and of the compiler command, so an edited source
or another compiler builds anew; it is built under a temporary name and moved
into place, so processes building it at once (the test shards) do not clash.
When the cache folder cannot be written, the library is built in a temporary
folder for this process.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("trace_render.c")
# the record fields in the order of the C enum (GRANT ... STOPPED)
FIELDS = ("grant", "num_computed_tokens", "status", "run_pos", "wait_key", "admitted", "preempt_order",
          "sampled", "aborted", "hit_tokens", "app_key", "stopped")
RENDERER_ENV = "SCHEDSPEC_TRACE_RENDERER"  # auto (default), numpy, or native (an error when it cannot be had)


class _Column(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("itemsize", ctypes.c_int64)]


class _Codes(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("waiting", "running", "preempted", "stopped", "length_capped")]


_lib = None
_why_not: str | None = None
_error: Exception | None = None
_tried = False


def _cache_dir() -> Path:
    env = os.environ.get("SCHEDSPEC_CACHE", "").strip()
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec") / "native"


def _compiler() -> list[str] | None:
    cc = os.environ.get("CC", "").strip()
    if cc:
        return shlex.split(cc)
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return [found]
    return None


def _build() -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc, clang or $CC) on PATH")
    flags = ["-O2", "-std=c99", "-shared", "-fPIC"]
    source = SOURCE.read_bytes()
    tag = hashlib.sha256(source + "\0".join(cc + flags + [platform.machine()]).encode()).hexdigest()[:16]
    name = f"trace_render-{tag}.so"
    for folder in (_cache_dir(), None):
        try:
            if folder is None:
                folder = Path(tempfile.mkdtemp(prefix="schedspec-native-"))
            target = folder / name
            if not target.exists():
                folder.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
                os.close(fd)
                try:
                    done = subprocess.run(cc + flags + ["-o", tmp, str(SOURCE)], capture_output=True, text=True,
                                          timeout=120)
                    if done.returncode != 0:
                        first = (done.stderr.strip().splitlines() or ["no message"])[0]
                        raise RuntimeError(f"{' '.join(cc)} failed on {SOURCE.name}: {first}")
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            lib = ctypes.CDLL(str(target))
            if folder != _cache_dir():  # a temporary folder: the loaded library stays mapped
                shutil.rmtree(folder, ignore_errors=True)
            break
        except OSError:
            if folder is not None and folder != _cache_dir():
                raise
            continue  # the cache folder cannot be written: a temporary folder
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.schedspec_record_bound.argtypes = [i64, i64]
    lib.schedspec_record_bound.restype = i64
    lib.schedspec_render.argtypes = [i64, p, p, i64, i64, i64, ctypes.POINTER(_Column), p, i64, p, p, p,
                                     p, p, p, i64, _Codes, p, i64, p]
    lib.schedspec_render.restype = i64
    return lib


def _load():
    """The library, or None for the numpy renderer; decided once (`reset`).  A
    bad choice, or `native` that cannot be had, raises on every call."""
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
        _lib = _build()
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        if chosen == "native":
            _error = RuntimeError(f"{RENDERER_ENV}=native: the native trace renderer cannot be built: {e}")
            raise _error from e
        _why_not = str(e)
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


def _column(a: np.ndarray | None) -> tuple[_Column, np.ndarray | None]:
    if a is None:
        return _Column(None, 0), None
    if a.dtype.kind not in "biu" or a.dtype.itemsize not in (1, 2, 4, 8) or (
            a.dtype.kind == "u" and a.dtype.itemsize > 1):
        a = a.astype(np.int64)
    a = np.ascontiguousarray(a)
    return _Column(a.ctypes.data, a.dtype.itemsize), a


def record_bound(R: int, max_id_len: int) -> int:
    """The most bytes the renderer writes for one record of R slots."""
    return int(_load().schedspec_record_bound(R, max_id_len))


def render(rec: dict[str, np.ndarray], first_step: int, scal: np.ndarray, tt: np.ndarray, ss: np.ndarray,
           abort_rank: np.ndarray, prefix_rows: np.ndarray, async_rows: np.ndarray, id_pool: np.ndarray,
           id_off: np.ndarray, id_len: np.ndarray, max_id_len: int, codes: tuple[int, int, int, int, int],
           out: np.ndarray) -> tuple[int, np.ndarray]:
    """Render records (tt[m], ss[m]) into `out` (uint8, at least len(tt) *
    record_bound bytes): (bytes written, each record's end; a record left out
    ends where the one before it does).  Ids: request code s * R + r is
    id_pool[id_off[code]:][:id_len[code]], its JSON string (id_len < 0: a
    padding slot), in code order, the pool ending in 16 spare bytes.  The shapes are checked here: the C code reads what it is told."""
    lib = _load()
    T, S, R = rec["status"].shape
    keep = []  # the arrays ctypes points into live until the call returns
    cols = (_Column * len(FIELDS))()
    for k, name in enumerate(FIELDS):
        a = rec.get(name)
        if a is not None and a.shape != (T, S, R):
            raise ValueError(f"rec[{name!r}]: shape {a.shape}, not {(T, S, R)}")
        cols[k], a = _column(a)
        keep.append(a)
    scal = np.ascontiguousarray(scal, dtype=np.int64)
    applied = rec.get("app_key") is not None
    if scal.shape[:2] != (T, S) or scal.shape[2] < (5 if applied else 3):
        raise ValueError(f"scal: shape {scal.shape} for records {(T, S, R)}")
    tt = np.ascontiguousarray(tt, dtype=np.int64)
    ss = np.ascontiguousarray(ss, dtype=np.int64)
    M = len(tt)
    if len(ss) != M or (M and (tt.min() < 0 or tt.max() >= T or ss.min() < 0 or ss.max() >= S)):
        raise ValueError("tt, ss: records outside the chunk")
    abort_rank = np.ascontiguousarray(abort_rank, dtype=np.int64)
    prefix_rows = np.ascontiguousarray(prefix_rows, dtype=np.uint8)
    async_rows = np.ascontiguousarray(async_rows, dtype=np.uint8)
    if abort_rank.shape != (S, R) or prefix_rows.shape != (S,) or async_rows.shape != (S,):
        raise ValueError("abort_rank, prefix_rows, async_rows: not one row per scenario")
    if id_off.shape != (S * R,) or id_len.shape != (S * R,) or id_pool.dtype != np.uint8 or not (
            id_pool.flags.c_contiguous and id_pool.nbytes >= (id_off[-1] + max(id_len[-1], 0) if S * R else 0) + 16):
        raise ValueError("id_pool, id_off, id_len: one id per request slot, one after the other, "
                         "and 16 spare bytes after the last")
    if out.dtype != np.uint8 or not out.flags.c_contiguous or out.nbytes < M * record_bound(R, max_id_len):
        raise ValueError(f"out: a contiguous uint8 array of at least {M * record_bound(R, max_id_len)} bytes")
    ends = np.empty(M, dtype=np.int64)
    n = lib.schedspec_render(M, tt.ctypes.data, ss.ctypes.data, S, R, first_step, cols, scal.ctypes.data,
                             scal.shape[2], abort_rank.ctypes.data, prefix_rows.ctypes.data,
                             async_rows.ctypes.data, id_pool.ctypes.data, id_off.ctypes.data, id_len.ctypes.data,
                             max_id_len, _Codes(*codes), out.ctypes.data, out.nbytes, ends.ctypes.data)
    if n < 0:
        raise RuntimeError("the native trace renderer ran out of room or memory")
    return int(n), ends


__all__ = ["FIELDS", "RENDERER_ENV", "available", "choice", "record_bound", "render", "reset", "why_not"]
