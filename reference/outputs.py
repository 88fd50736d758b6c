"""Output paths: checked before any work starts, and never a file we did not write.

Every command that writes a file passes the path through one of these checks
*before* it runs a scenario, a campaign or a proof, so that a typo in an output
path costs nothing and nothing the user owns is replaced.  Each check raises
`UsageError` (one line, exit 2) and returns the `Path` to write.

API (used by the commands in cli/, the trace writer and the plotter):

    check_output_path(path, kind, inputs=(), ours=is_schedspec_trace) -> Path
        One output file.  `kind` names the flag in messages ("--trace-out").
        Refuses: an empty path; a folder that does not exist or cannot be
        written; a name longer than the file system allows; an existing path
        that is not a regular file (a folder, /dev/full, a fifo, /proc/...);
        an existing file for which `ours(path)` is false; any of `inputs`.
    check_trace_path(path, kind="--trace-out", inputs=()) -> Path
        check_output_path with ours=is_schedspec_trace.
    check_plot_path(path, kind="--plot", inputs=()) -> Path
        plot_format(path) must succeed, then check_output_path with
        ours=is_schedspec_plot.
    check_output_dir(path, kind) -> Path
        A folder that receives several files (diff -o, prove -o): it may
        exist (then it must be a writable folder) or be created (then its
        parent must exist and be writable).  Creates nothing.
    plot_format(path) -> "png" | "pdf" | "svg"
        The format by the suffix, case-insensitive.  Any other suffix, and no
        suffix at all, is a one-line error: a plot is written under exactly
        the name the user gave, never under a name we made up.
    plot_metadata(fmt) -> dict
        Pass as `savefig(..., metadata=plot_metadata(fmt))`: it embeds
        PLOT_MARKER where is_schedspec_plot looks for it.
    is_schedspec_trace(path) / is_schedspec_plot(path) -> bool
        Read at most HEADER_BYTES from the start (traces, decompressed when the
        file is gzip) or from the start and the end (plots), never the whole file.

How "ours" is told:
- a trace is ours when the first HEADER_BYTES (after gunzip for `.json.gz` or
  any gzip file) contain `"format": "schedspec.trace/` -- so a trace writer
  must write the `format` key first;
- a plot is ours when PLOT_MARKER occurs in its first or last HEADER_BYTES:
  PNG keeps it in a tEXt chunk before the image data, SVG in <metadata> at the
  top, PDF in the Info dictionary just before the cross-reference table at the
  end.  A plot drawn by an older schedspec without the marker is refused like
  any other file; delete it or choose another name.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterable

from .errors import UsageError, shown

HEADER_BYTES = 4096
PLOT_FORMATS = ("png", "pdf", "svg")
PLOT_MARKER = "schedspec-plot/1"

_TRACE_RE = re.compile(rb'"format"\s*:\s*"schedspec\.trace/')


def _head(path: Path, n: int = HEADER_BYTES) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _tail(path: Path, n: int = HEADER_BYTES) -> bytes:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - n))
        return f.read(n)


def _gunzip_head(raw_path: Path, n: int = HEADER_BYTES) -> bytes:
    # Decompress only as much as needed: a gzip bomb must not cost more than n bytes.
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = b""
    with open(raw_path, "rb") as f:
        while len(out) < n:
            chunk = f.read(HEADER_BYTES)
            if not chunk:
                break
            out += d.decompress(chunk, n - len(out))
            if d.eof:
                break
    return out[:n]


def is_schedspec_trace(path: str | Path) -> bool:
    p = Path(path)
    try:
        if not p.is_file():
            return False
        head = _head(p)
        if head[:2] == b"\x1f\x8b":
            head = _gunzip_head(p)
    except (OSError, zlib.error, EOFError, gzip.BadGzipFile):
        return False
    return bool(_TRACE_RE.search(head))


def is_schedspec_plot(path: str | Path) -> bool:
    p = Path(path)
    marker = PLOT_MARKER.encode()
    try:
        if not p.is_file():
            return False
        return marker in _head(p) or marker in _tail(p)
    except OSError:
        return False


def plot_metadata(fmt: str) -> dict[str, str]:
    """matplotlib savefig metadata that marks the file as written by schedspec."""
    from schedspec import __version__

    value = f"{PLOT_MARKER} (schedspec {__version__}, matplotlib)"
    if fmt == "png":
        return {"Software": value}
    return {"Creator": value}


def plot_format(path: str | Path, kind: str = "--plot") -> str:
    name = str(path)
    if name == "":
        raise UsageError(f"{kind}: empty path; give a file name ending in .png, .pdf or .svg")
    suffix = Path(name).suffix.lower().lstrip(".")
    if not suffix:
        raise UsageError(f"{kind} {shown(name)}: no file type; end the name in .png, .pdf or .svg")
    if suffix not in PLOT_FORMATS:
        raise UsageError(f"{kind} {shown(name)}: unsupported plot format .{shown(suffix, 20)}; "
                         "use .png, .pdf or .svg")
    return suffix


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def _check_names(path: Path, kind: str, given: str) -> None:
    for part in path.parts:
        if len(os.fsencode(part)) > 255:
            raise UsageError(f"{kind} {shown(given)}: a name in the path is longer than 255 bytes")


def _check_writable_folder(folder: Path, kind: str, given: str) -> None:
    if not folder.exists():
        raise UsageError(f"{kind} {shown(given)}: folder {shown(str(folder))} does not exist")
    if not folder.is_dir():
        raise UsageError(f"{kind} {shown(given)}: {shown(str(folder))} is not a folder")
    # os.access says yes to root on a read-only mount or /proc; creating a
    # file is the only answer that holds everywhere.
    try:
        fd, probe = tempfile.mkstemp(prefix=".schedspec-probe-", dir=folder)
    except OSError as e:
        raise UsageError(f"{kind} {shown(given)}: cannot write in folder {shown(str(folder))} "
                         f"({e.strerror or e})") from None
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass


def check_output_path(path: str | Path, kind: str, inputs: Iterable[str | Path] = (),
                      ours: Callable[[Path], bool] = is_schedspec_trace) -> Path:
    given = str(path)
    if given == "" or given.strip() == "":
        raise UsageError(f"{kind}: empty path; give a file name")
    out = Path(given)
    _check_names(out, kind, given)
    for inp in inputs:
        if inp is not None and _same_file(out, Path(inp)):
            raise UsageError(f"{kind} {shown(given)} is an input of this command; choose another file")
    try:
        st = out.stat() if out.exists() else None
    except OSError as e:
        raise UsageError(f"{kind} {shown(given)}: {e.strerror or e}") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{kind} {shown(given)} is a folder; give a file name")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{kind} {shown(given)} exists and is not a regular file; not writing to it")
        if not ours(out):
            what = "trace" if ours is is_schedspec_trace else "plot" if ours is is_schedspec_plot else "output"
            raise UsageError(f"{kind} {shown(given)} exists and is not a schedspec {what}; "
                             "not overwriting it (remove it or choose another name)")
        if not os.access(out, os.W_OK):
            raise UsageError(f"{kind} {shown(given)}: file is not writable")
    _check_writable_folder(out.parent if str(out.parent) else Path("."), kind, given)
    return out


def check_trace_path(path: str | Path, kind: str = "--trace-out", inputs: Iterable[str | Path] = ()) -> Path:
    return check_output_path(path, kind, inputs, ours=is_schedspec_trace)


def check_plot_path(path: str | Path, kind: str = "--plot", inputs: Iterable[str | Path] = ()) -> Path:
    plot_format(path, kind)
    return check_output_path(path, kind, inputs, ours=is_schedspec_plot)


def check_output_dir(path: str | Path, kind: str) -> Path:
    given = str(path)
    if given.strip() == "":
        raise UsageError(f"{kind}: empty path; give a folder")
    out = Path(given)
    _check_names(out, kind, given)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{kind} {shown(given)} exists and is not a folder")
        _check_writable_folder(out, kind, given)
    else:
        _check_writable_folder(out.parent if str(out.parent) else Path("."), kind, given)
    return out


__all__ = ["HEADER_BYTES", "PLOT_FORMATS", "PLOT_MARKER", "check_output_dir", "check_output_path",
           "check_plot_path", "check_trace_path", "is_schedspec_plot", "is_schedspec_trace",
           "plot_format", "plot_metadata"]
