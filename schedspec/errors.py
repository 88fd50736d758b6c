"""The one rule of the command line: a user error is one line on stderr and exit 2."""

from __future__ import annotations

import sys


class UsageError(Exception):
    """Anything the user can fix: a bad file, a bad flag, a rejected config."""


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    print(f"schedspec: error: {message}", file=sys.stderr)
    raise SystemExit(code)


class Progress:
    """A one-line progress bar on stderr, shown only on a terminal or when forced,
    and only for runs long enough to need one."""

    def __init__(self, label: str, total: int, *, enabled: bool | None = None, min_total: int = 200):
        if enabled is None:
            enabled = sys.stderr.isatty() and total >= min_total
        self.enabled = enabled
        self.label = label
        self.total = max(total, 1)
        self._last = -1

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        total = total or self.total
        pct = int(100 * done / max(total, 1))
        if pct == self._last and done != total:
            return
        self._last = pct
        width = 30
        fill = width * done // max(total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
