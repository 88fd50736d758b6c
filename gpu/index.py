"""Element reads and writes at scattered (row, column[, slot]) positions, done
through the tensor's flat view (a copy, for reading a non-contiguous one).

`t[s, b]` and `t[s, b] = v` with index tensors go through torch's general
advanced-indexing path, which on the CPU costs several times an
`index_select` / `scatter_` of the same elements on the flattened tensor
(4 000 entries of a (2048, 512) int32 tensor, one thread: a read 33 µs against
7.5 µs, a write 37 µs against 8 µs).  The pool and the step touch a few
thousand scattered entries of (S, W) and (S, R, H) tensors several times a
step, so they use these.  A tensor written here must be contiguous (the
Pool's are): `put` and `add` raise on one that is not, rather than write a copy.

As with `t[idx] = v`, a position written twice in one `put` call keeps one of
the values, unspecified which: callers write distinct positions, or use `add`.
"""

from __future__ import annotations

import numpy as np
import torch


def flat(t: torch.Tensor, *idx: torch.Tensor) -> torch.Tensor:
    """The flat positions of elements (idx[0], idx[1], ...) of contiguous `t`."""
    pos = idx[0].long()
    for d, i in enumerate(idx[1:], start=1):
        pos = pos * t.shape[d] + i
    return pos


def take(t: torch.Tensor, *idx: torch.Tensor) -> torch.Tensor:
    """t[idx[0], idx[1], ...] for 1-D index tensors of one length."""
    return t.reshape(-1).index_select(0, flat(t, *idx))


def put(t: torch.Tensor, idx: tuple[torch.Tensor, ...], value) -> None:
    """t[idx] = value in place; `value` a tensor of t's dtype, one per
    position, or a Python scalar."""
    pos = flat(t, *idx)
    if isinstance(value, torch.Tensor):
        t.view(-1).scatter_(0, pos, value.to(t.dtype))
    else:
        t.view(-1).scatter_(0, pos, value)


def add(t: torch.Tensor, idx: tuple[torch.Tensor, ...], value: torch.Tensor) -> None:
    """t[idx] += value in place, repeated positions summed."""
    t.view(-1).index_add_(0, flat(t, *idx), value.to(t.dtype))


def argsort(key: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`torch.argsort(key, dim=dim)`, unstable: for keys whose order among equal
    values is never read.  On the CPU through numpy, whose sort of integer keys
    is vectorised (int64, one thread: a (2048, 32) row-wise sort 240 µs against
    torch's 1 190 µs; 4 096 keys 30 µs against 153 µs)."""
    if key.device.type != "cpu":
        return torch.argsort(key, dim=dim)
    return torch.from_numpy(np.argsort(key.contiguous().numpy(), axis=dim))


def argsort_members(key: torch.Tensor, member: torch.Tensor, last: int) -> torch.Tensor:
    """`argsort` along the last dim of `key` with every non-member's key taken as
    `last` (above every member's).  On the CPU the select is numpy's too: half
    of torch's arithmetic select of int64 (2048, 32) keys."""
    if key.device.type != "cpu":
        return torch.argsort(torch.where(member, key, last), dim=-1)
    return torch.from_numpy(np.argsort(np.where(member.numpy(), key.numpy(), last), axis=-1))


def nonzero(mask: torch.Tensor) -> torch.Tensor:
    """The flat positions of the true elements of bool `mask`, ascending (int64):
    `mask.reshape(-1).nonzero()[:, 0]`.  On the CPU through numpy (a (2048, 32)
    mask, one thread: 13 µs against torch's 84 µs)."""
    if mask.device.type != "cpu":
        return mask.reshape(-1).nonzero()[:, 0]
    return torch.from_numpy(np.flatnonzero(mask.contiguous().numpy()))


def nonzero_rc(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`mask.nonzero(as_tuple=True)` of a 2-D bool mask: rows and columns of its
    true elements in row-major order (int64), as `nonzero`."""
    if mask.device.type != "cpu":
        return mask.nonzero(as_tuple=True)
    row, col = np.divmod(nonzero(mask).numpy(), mask.shape[1])
    return torch.from_numpy(row), torch.from_numpy(col)
