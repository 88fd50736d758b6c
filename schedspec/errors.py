"""The one rule of the command line: a user error is one line on stderr and exit 2.

Also the two things every command shares with it: `shown` (any text the user
gave, made safe to print on one line) and `Progress` (a progress display on
stderr that never gets in the way of that one line).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import NoReturn


class UsageError(Exception):
    """Anything the user can fix: a bad file, a bad flag, a rejected config."""


def shown(text: object, limit: int = 80) -> str:
    """`text` for a one-line message or a table cell: control characters
    (newlines, terminal escape codes, ...) escaped as Python writes them in a
    string literal, and cut to `limit` characters with the length said."""
    s = str(text)
    cut = len(s) > limit
    if cut:
        s = s[:limit]
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1] if ch not in "'\"" else ch)
    if cut:
        out.append(f"... ({len(str(text))} characters)")
    return "".join(out)


def fail(message: str, code: int = 2) -> NoReturn:
    # The message may quote user text: keep it one line whatever it holds.
    one_line = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)
    print(f"schedspec: error: {one_line}", file=sys.stderr)
    raise SystemExit(code)


def status(message: str) -> None:
    """A plain status line on stderr (e.g. "loading vLLM ...")."""
    print(f"schedspec: {message}", file=sys.stderr, flush=True)


STATUS_EVERY_S = 5.0


class Progress:
    """Progress of one long piece of work, on stderr.

    On a terminal: a rich progress bar, for work of at least `min_total`
    units.  Elsewhere (a pipe, a log file, CI): a plain status line every
    STATUS_EVERY_S seconds, and nothing at all for work that ends sooner.
    `enabled=False` shows nothing; `enabled=True` shows the bar whatever
    the total.  SCHEDSPEC_PROGRESS=0 in the environment turns every display off.

        progress = Progress("diff", total)
        for i, ... in enumerate(work, 1):
            progress(i)            # or progress(i, new_total)
        progress.close()
    """

    def __init__(self, label: str, total: int, *, enabled: bool | None = None, min_total: int = 200):
        self.label = label
        self.total = max(int(total), 1)
        off = os.environ.get("SCHEDSPEC_PROGRESS", "") == "0"
        tty = sys.stderr.isatty()
        if enabled is None:
            enabled = not off and (not tty or self.total >= min_total)
        elif off:
            enabled = False
        self.enabled = bool(enabled)
        self._bar = None
        self._task = None
        self._tty = tty
        self._t0 = time.monotonic()
        self._next_status = self._t0 + STATUS_EVERY_S
        self._done = 0

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                   TextColumn, TimeElapsedColumn, TimeRemainingColumn)

        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 console=Console(file=sys.stderr), transient=True,
                                 redirect_stdout=False, redirect_stderr=False)
        self._bar.start()
        self._task = self._bar.add_task(shown(self.label, 60), total=self.total, completed=self._done)

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        if total:
            self.total = max(int(total), 1)
        self._done = done
        if self._tty:
            if self._bar is None:
                self._start_bar()
            self._bar.update(self._task, completed=done, total=self.total)
            return
        now = time.monotonic()
        if now >= self._next_status:
            self._next_status = now + STATUS_EVERY_S
            pct = 100.0 * done / self.total
            print(f"schedspec: {shown(self.label, 60)}: {done}/{self.total} ({pct:.0f} %), "
                  f"{now - self._t0:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Take the bar off the screen, e.g. before printing a result line.  A
        later update shows it again, so close() may be called mid-way and at the end."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


# argparse types for numeric flags: a nonsense value is one argparse error line
# (`run: argument --step-ms: must be a finite number, got nan`), before any work.
def int_arg(lo: int | None = None, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            v = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {shown(text, 40)!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {_range(lo, hi)}, got {shown(text, 40)}")
        return v

    parse.__name__ = "int"
    return parse


def float_arg(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            v = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {shown(text, 40)!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {shown(text, 40)}")
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {_range(lo, hi, lo_open)}, got {shown(text, 40)}")
        return v

    parse.__name__ = "float"
    return parse


def _range(lo, hi, lo_open: bool = False) -> str:
    n = lambda x: str(int(x)) if float(x).is_integer() else f"{x:g}"  # noqa: E731
    if lo is not None and hi is not None:
        return f"{'more than' if lo_open else 'at least'} {n(lo)} and at most {n(hi)}"
    if lo is not None:
        return f"{'more than' if lo_open else 'at least'} {n(lo)}"
    return f"at most {n(hi)}"
