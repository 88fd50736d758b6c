"""Reading and writing `schedspec.trace/1` files, plain (`.json`) or gzip (`.json.gz`).

Every place that reads or writes a trace file goes through this module, so a
compressed trace works wherever a plain one does.

Layout written (still one JSON document, readable by any JSON parser):

    {"format": "schedspec.trace/1", "scenario": "...", "implementation": "...",
    "steps": [
    {"step": 0, "scheduled": [...], ...},
    {"step": 1, ...}
    ],
    "summary": {...}}

The header comes first with `format` as its first key, so a reader can tell a
trace from its first few hundred bytes (`read_trace_header`; the output-path
check in reference/outputs.py relies on it); then one step per line, written as
the engine produces it, so a run never holds the whole trace in memory; then
the remaining top-level fields (`summary`, or `error`).

API:
    TraceWriter(path)          a sink for reference/engine.py's run_scenario
                               (`begin(header)`, `step(record)`, `end(trace)`);
                               writes to a temporary file in the same folder,
                               which `commit()` moves to `path`; use it as a
                               context manager (`with TraceWriter(p) as w:`),
                               which commits a finished trace on a clean exit
                               and discards it on an exception, so a failed or
                               rejected run leaves `path` as it was;
                               `step_text(text, count)` writes `count`
                               steps serialised beforehand (one string or
                               pieces).
    write_trace(trace, path)   a whole trace dict, in the same layout.
    read_trace(path) -> dict   plain or gzip (told by the file's first bytes).
    read_trace_header(path) -> dict
                               the top-level scalar fields before `steps`,
                               reading at most HEADER_BYTES (decompressed).
    open_text(path, mode)      a text stream, gzip when the name ends in `.gz`
                               (writing) or the file starts with gzip's magic
                               bytes (reading).
    is_gzip_path(path)         whether `path` is written compressed.
    Tee(*sinks)                one sink that feeds several.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Any, Protocol, Sequence

HEADER_BYTES = 4096
GZIP_MAGIC = b"\x1f\x8b"
# gzip level 6 (zlib's default) costs about 3x the time of level 1 for a trace
# barely 15 % smaller: traces are long runs of near-identical lines.
GZIP_LEVEL = 1
_HEADER_KEYS = ("format", "scenario", "implementation")


class TraceSink(Protocol):
    """What run_scenario hands a trace to, piece by piece."""

    def begin(self, header: dict[str, Any]) -> None: ...

    def step(self, record: dict[str, Any]) -> None: ...

    def end(self, trace: dict[str, Any]) -> None: ...


def is_gzip_path(path: str | Path) -> bool:
    return str(path).lower().endswith(".gz")


def _dumps(value: Any) -> str:
    # ensure_ascii as json.dump's default: the file stays 7-bit clean whatever
    # the ids hold.
    return json.dumps(value, separators=(", ", ": "))


def open_text(path: str | Path, mode: str = "r"):
    """A text stream on `path`: gzip when writing a `.gz` name, or reading a
    file that starts with gzip's magic bytes (whatever its name)."""
    if "w" in mode:
        if is_gzip_path(path):
            return io.TextIOWrapper(gzip.GzipFile(path, "wb", compresslevel=GZIP_LEVEL, mtime=0),
                                    encoding="utf-8", newline="\n")
        return open(path, "w", encoding="utf-8", newline="\n")
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == GZIP_MAGIC:
        return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8")
    return open(path, "r", encoding="utf-8")


class TraceWriter:
    """Writes a trace step by step (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._tmp: str | None = None
        self._out = None
        self._steps = 0
        self._header: dict[str, Any] | None = None
        self._ended = False

    def _open(self) -> None:
        folder = self.path.parent if str(self.path.parent) else Path(".")
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name[:100]}.", suffix=".part", dir=folder)
        # mkstemp makes the file private (0600); a trace gets the permissions
        # any file the user creates gets.
        mask = os.umask(0)
        os.umask(mask)
        try:
            os.fchmod(fd, 0o666 & ~mask)
        except OSError:
            os.close(fd)
            raise
        # binary: the text is ASCII (ensure_ascii), encoded per write, and a
        # writer of pre-rendered steps hands over many at once (step_text)
        if is_gzip_path(self.path):
            os.close(fd)
            self._out = gzip.GzipFile(self._tmp, "wb", compresslevel=GZIP_LEVEL, mtime=0)
        else:
            self._out = os.fdopen(fd, "wb")  # the file mkstemp made, not opened a second time

    def _write(self, text: str) -> None:
        self._out.write(text.encode("utf-8"))

    def begin(self, header: dict[str, Any]) -> None:
        if self._out is None:
            self._open()
        # format first (read_trace_header and the overwrite check look for it
        # there), then every other scalar field; objects such as summary go last.
        self._header = {k: header[k] for k in _HEADER_KEYS if k in header}
        self._header.update({k: v for k, v in header.items()
                             if k not in self._header and isinstance(v, (str, int, float, bool, type(None)))})
        body = ", ".join(f"{_dumps(k)}: {_dumps(v)}" for k, v in self._header.items())
        self._write("{" + body + ",\n\"steps\": [")

    def step(self, record: dict[str, Any]) -> None:
        self._write(("\n" if self._steps == 0 else ",\n") + _dumps(record))
        self._steps += 1

    def step_text(self, text: str | Sequence[str | bytes | memoryview], count: int) -> None:
        """`count` steps already serialised as `step` writes them (each step as
        `_dumps` makes it, ",\n" between two steps, nothing before the first
        or after the last), as one string or as pieces to write one after the
        other (strings, or their ASCII bytes): a writer of columnar records
        (gpu/trace_text.py) hands over many steps in one call, without joining
        them first."""
        if count:
            self._write("\n" if self._steps == 0 else ",\n")
            for piece in ([text] if isinstance(text, str) else text):
                if isinstance(piece, str):
                    self._write(piece)
                else:
                    self._out.write(piece)
            self._steps += count

    def end(self, trace: dict[str, Any]) -> None:
        """Finish the document with the fields of `trace` not written yet
        (`commit()` then moves it into place)."""
        if self._header is None:
            self.begin(trace)
        rest = {k: v for k, v in trace.items() if k not in self._header and k != "steps"}
        tail = "".join(f",\n{_dumps(k)}: {_dumps(v)}" for k, v in rest.items())
        self._write(("\n" if self._steps else "") + "]" + tail + "}\n")
        self._out.close()
        self._out = None
        self._ended = True

    def commit(self) -> Path:
        """Move the finished trace to `path`, replacing what was there."""
        if not self._ended:
            raise RuntimeError("TraceWriter.commit() before end()")
        os.replace(self._tmp, self.path)
        self._tmp = None
        return self.path

    def discard(self) -> None:
        """Drop what was written so far; `path` is left as it was."""
        if self._out is not None:
            try:
                self._out.close()
            except OSError:
                pass
            self._out = None
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass
            self._tmp = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and self._ended and self._tmp is not None:
            self.commit()
        else:
            self.discard()


class Tee:
    """One sink feeding several, in order; None entries are left out."""

    def __init__(self, *sinks: TraceSink | None):
        self.sinks = [s for s in sinks if s is not None]

    def begin(self, header: dict[str, Any]) -> None:
        for s in self.sinks:
            s.begin(header)

    def step(self, record: dict[str, Any]) -> None:
        for s in self.sinks:
            s.step(record)

    def end(self, trace: dict[str, Any]) -> None:
        for s in self.sinks:
            s.end(trace)


def write_trace(trace: dict[str, Any], path: str | Path) -> Path:
    """Write a whole trace dict (gzip when `path` ends in .gz); return the path."""
    with TraceWriter(path) as w:
        w.begin(trace)
        for record in trace.get("steps", ()):
            w.step(record)
        w.end(trace)
    return Path(path)


def read_trace(path: str | Path) -> dict[str, Any]:
    """The trace in `path`, plain or gzip.  Raises OSError, ValueError (not JSON,
    or not a trace object) like json.load."""
    with open_text(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith("schedspec.trace/"):
        raise ValueError(f"{path} is not a schedspec trace (no \"format\": \"schedspec.trace/...\")")
    return data


def _head_text(path: str | Path, limit: int) -> str:
    with open(path, "rb") as f:
        raw = f.read(limit)
        if raw[:2] == GZIP_MAGIC:
            # Inflate only up to `limit` bytes: a gzip bomb costs no more than that.
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = b""
            while len(out) < limit and raw:
                out += d.decompress(raw, limit - len(out))
                if d.eof or d.unconsumed_tail:
                    break
                raw = f.read(limit)
            raw = out
    return raw[:limit].decode("utf-8", errors="replace")


def read_trace_header(path: str | Path, limit: int = HEADER_BYTES) -> dict[str, Any]:
    """The top-level fields that come before `steps` and hold a scalar value
    (format, scenario, implementation, ...), from the first `limit` bytes of
    the file (decompressed).  {} when the file does not start like a JSON
    object.  Never reads the rest of the file."""
    text = _head_text(path, limit)
    dec = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if text[i:i + 1] != "{":
        return {}
    i += 1
    header: dict[str, Any] = {}
    while True:
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != '"':
            return header
        try:
            key, i = dec.raw_decode(text, i)
        except ValueError:
            return header
        i = _skip_ws(text, i)
        if text[i:i + 1] != ":":
            return header
        i = _skip_ws(text, i + 1)
        if text[i:i + 1] in ("[", "{", ""):
            return header  # steps, summary: not a header field
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return header
        header[key] = value
        i = _skip_ws(text, i)
        if text[i:i + 1] != ",":
            return header
        i += 1


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


__all__ = ["HEADER_BYTES", "Tee", "TraceSink", "TraceWriter", "is_gzip_path", "open_text",
           "read_trace", "read_trace_header", "write_trace"]
