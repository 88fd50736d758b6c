"""Progress of long work on stderr: a bar on a terminal, a status line elsewhere,
never in the way of the one-line error (errors.py)."""

from __future__ import annotations

import os
import sys
import time

from .errors import shown

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
