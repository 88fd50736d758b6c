"""The one rule of the command line: a user error is one line on stderr and exit 2.

Also `shown`: any text the user gave, made safe to print on one line.
"""

from __future__ import annotations

import sys
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
