"""Adaptive timeouts: a z3 call that comes back unknown is retried with a longer
timeout before the obligation is declared unknown, and unknown stays a failure.

A timeout of 1 ms (z3's unit; 0 would mean none) makes z3 answer unknown on the first try of any real claim;
the retry (with a factor large enough to finish) must then prove it and count
the retry.  Without a retry the same obligation is unknown, and `prove` fails it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schedspec.cli.prove import run_obligation
from schedspec.proofs import obligations as O
from schedspec.proofs import loop_invariants as LI

TINY = 0.001  # seconds: z3 gives up at once


@pytest.fixture
def factors(monkeypatch):
    def use(*f):
        monkeypatch.setattr(O, "RETRY_FACTORS", tuple(f))
    return use


def test_step_claim_retried_then_proved(factors):
    claim = O.step_claim("max_num_seqs_respected", 2, 2, block_sizes=(1,), timeout_s=TINY)
    factors(1)
    assert claim.discharge("correct").status == "unknown"
    factors(1, 20_000)  # 1 ms, then 20 s
    before = O.RETRIES["calls"]
    assert claim.discharge("correct").status == "proved"
    assert O.RETRIES["calls"] > before


def test_loop_claim_retried_then_proved(factors):
    claim = LI.CLAIMS["max_num_seqs_respected"]
    factors(1)
    assert LI.discharge(claim, "correct", timeout_s=TINY, block_sizes=(2,)).status == "unknown"
    factors(1, 20_000)
    before = O.RETRIES["calls"]
    assert LI.discharge(claim, "correct", timeout_s=TINY, block_sizes=(2,)).status == "proved"
    assert O.RETRIES["calls"] > before


def test_unknown_is_a_failure_in_prove(factors, tmp_path: Path):
    factors(1)
    o = next(o for o in O.build_obligations(2, timeout_s=TINY) if o.name == "step:max_num_seqs_respected")
    row = run_obligation(o, tmp_path)
    assert row["result"] == "unknown" and not row["ok"], row
