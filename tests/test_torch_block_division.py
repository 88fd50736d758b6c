"""The torch step's block floors and ceilings divide in floating point
(gpu/step.py `floor_div`, `ceil_div`; the argument in gpu/limits.py): exact
against integer division over the dividends the step can form, float32 up to
MAX_FLOAT32_DIV_LEN and float64 beyond it, and the batch picks the dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from schedspec.gpu.batch import build_batch, config_row, prepare
from schedspec.gpu.limits import MAX_FLOAT32_DIV_LEN, MAX_MODEL_LEN
from schedspec.gpu.step import ceil_div, floor_div
from schedspec.reference.scenario import RequestSpec, Scenario

F32_BOUND = 3 * MAX_FLOAT32_DIV_LEN  # the step's dividends: |t| < 3 * max_model_len


def _check(ts: list[int], ds: list[int], dtype: torch.dtype) -> None:
    t = torch.tensor(ts, dtype=torch.int32)[:, None]
    d = torch.tensor(ds, dtype=torch.int64).to(dtype)[None, :]
    floors = floor_div(t, d).tolist()
    ceils = ceil_div(t, d).tolist()
    for i, a in enumerate(ts):
        for j, b in enumerate(ds):
            assert floors[i][j] == a // b, (a, b, dtype)
            assert ceils[i][j] == -(-a // b), (a, b, dtype)


def _near_multiples(bound: int, ds: list[int]) -> list[int]:
    """Dividends on each side of multiples of each divisor, up to the bound."""
    out = {0, 1, -1, bound - 1, -(bound - 1)}
    for b in ds:
        for k in (1, 2, 3, (bound - 1) // b, (bound - 1) // b - 1):
            for e in (-1, 0, 1):
                t = k * b + e
                if abs(t) < bound:
                    out.update((t, -t))
    return sorted(out)


DIVISORS = [1, 2, 3, 7, 16, 17, 1000, 4093, 2**20, 2**22 - 1, 2**22, 2**23 + 1, 2**24 - 1, 2**24, 2**24 + 1,
            2**30, 2**31 + 1, 2**53 + 1, 2**62]


def test_float32_exact_near_every_multiple():
    _check(_near_multiples(F32_BOUND, DIVISORS), DIVISORS, torch.float32)


def test_float64_exact_over_int32():
    _check(_near_multiples(2**31, DIVISORS), DIVISORS, torch.float64)


@settings(max_examples=300, deadline=None)
@given(t=st.integers(-(F32_BOUND - 1), F32_BOUND - 1), d=st.integers(1, 2**62))
def test_float32_exact_on_drawn_values(t, d):
    _check([t], [d], torch.float32)


def test_float32_would_not_do_past_the_bound():
    """The bad variant the bound rules out: float32 past 2**24 loses the floor."""
    t = torch.tensor([[2**24 + 1]], dtype=torch.int32)
    assert floor_div(t, torch.tensor([[1.0]], dtype=torch.float32)).item() != 2**24 + 1
    assert floor_div(t, torch.tensor([[1.0]], dtype=torch.float64)).item() == 2**24 + 1


@pytest.mark.parametrize("max_model_len, dtype", [(MAX_FLOAT32_DIV_LEN, torch.float32),
                                                  (MAX_FLOAT32_DIV_LEN + 1, torch.float64),
                                                  (MAX_MODEL_LEN, torch.float64)])
def test_batch_picks_the_division_dtype(max_model_len, dtype):
    sc = Scenario(name="div", config={"max_model_len": max_model_len, "block_size": 2**20,
                                      "max_num_batched_tokens": 2048},
                  requests=(RequestSpec(id="a", prompt_len=3, max_tokens=2),), max_steps=5)
    p = prepare(sc)
    assert not isinstance(p, str), p
    small = prepare(Scenario(name="small", config={"max_model_len": 64}, requests=sc.requests, max_steps=5))
    batch = build_batch([config_row(x.config) for x in (small, p)], [x.columns for x in (small, p)], "cpu")
    assert batch.block_size_f.dtype == dtype  # the batch's largest max_model_len decides
    assert batch.block_size_f.tolist() == [float(small.config.block_size), float(2**20)]
