"""Comparisons, mask logic and per-row mask reductions that are fast on the CPU.

On the CPU, torch writes a bool result one element at a time: no vector path
for a bool output.  Measured on (2048, 32) tensors, one thread, torch 2.13 CPU
(AVX-512): int32 `x > y` 30 µs, int8 `s >= 2` 34 µs, `m & a[:, None]` 68 µs;
numpy does the same in 9, 4 and 14 µs.  `mask.sum(1)` converts the bool mask to
int64 first (27 µs; 13 µs summed as int32), and `amax(1)` over its bytes is
45 µs.  A step of the torch scheduler makes a few dozen such masks over
(S, R), so on the CPU these go through numpy: views of the same memory, no
copies, and the same bool tensors as torch's operators give.  On any other
device they are torch's operators.  Arguments are tensors or Python ints; the
tensors may broadcast, as with the operators.
"""

from __future__ import annotations

import numpy as np
import torch


def _np(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def _cpu(a, b) -> bool:
    t = a if isinstance(a, torch.Tensor) else b
    return t.device.type == "cpu"


def gt(a, b) -> torch.Tensor:
    """a > b"""
    return torch.from_numpy(np.greater(_np(a), _np(b))) if _cpu(a, b) else a > b


def ge(a, b) -> torch.Tensor:
    """a >= b"""
    return torch.from_numpy(np.greater_equal(_np(a), _np(b))) if _cpu(a, b) else a >= b


def lt(a, b) -> torch.Tensor:
    """a < b"""
    return torch.from_numpy(np.less(_np(a), _np(b))) if _cpu(a, b) else a < b


def le(a, b) -> torch.Tensor:
    """a <= b"""
    return torch.from_numpy(np.less_equal(_np(a), _np(b))) if _cpu(a, b) else a <= b


def eq(a, b) -> torch.Tensor:
    """a == b"""
    return torch.from_numpy(np.equal(_np(a), _np(b))) if _cpu(a, b) else a == b


def both(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a & b for bool masks that broadcast ((S, R) with (S, 1), say)."""
    return torch.from_numpy(np.logical_and(a.numpy(), b.numpy())) if a.device.type == "cpu" else a & b


def within(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """lo <= x <= hi"""
    if x.device.type != "cpu":
        return (x >= lo) & (x <= hi)
    v = x.numpy()
    return torch.from_numpy(np.logical_and(np.greater_equal(v, lo), np.less_equal(v, hi)))


def count_rows(mask: torch.Tensor) -> torch.Tensor:
    """`mask.sum(1)` of an (S, R) bool mask, as int32 (a count is at most R)."""
    return mask.contiguous().view(torch.uint8).sum(1, dtype=torch.int32)


def any_rows(mask: torch.Tensor) -> torch.Tensor:
    """`mask.any(1)` of an (S, R) bool mask (all False when R = 0)."""
    return count_rows(mask) > 0
