"""gpu/state.py `select`, which drops finished scenarios and unused request slots
from a running batch: the rows and slots it keeps, as dense tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schedspec.gpu.state import select


@dataclass(frozen=True)
class Rows:
    per_scenario: torch.Tensor  # (S,)
    per_request: torch.Tensor  # (S, R)
    per_block: torch.Tensor  # (S, R, H)


def test_select_keeps_rows_and_slots_densely():
    S, R, H = 6, 5, 4
    x = Rows(torch.arange(S), torch.arange(S * R).view(S, R), torch.arange(S * R * H).view(S, R, H))
    rows = torch.tensor([4, 1, 3])
    y = select(x, rows, 3)
    assert torch.equal(y.per_scenario, x.per_scenario[rows])
    assert torch.equal(y.per_request, x.per_request[rows][:, :3])
    assert torch.equal(y.per_block, x.per_block[rows][:, :3])
    # dense, not a narrowed view: flat reads of the block hashes (gpu/pool.py `cache`,
    # every step) would otherwise copy the whole tensor each time
    assert all(t.is_contiguous() for t in (y.per_scenario, y.per_request, y.per_block))
    assert y.per_block.view(-1)[5].item() == x.per_block[4, 1, 1].item()
