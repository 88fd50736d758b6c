"""argparse types for numeric flags: a nonsense value is one argparse error line
(`run: argument --step-ms: must be a finite number, got nan`), before any work."""

from __future__ import annotations

import argparse
import math

from schedspec.reference.errors import shown

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
