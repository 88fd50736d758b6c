"""Randomized restarts (proofs/solving.py): a z3 call that comes back unknown is
tried again with a fresh seed and the next limit of the schedule before the
obligation is declared unknown, and unknown stays a failure.

A timeout of 1 ms (z3's unit; 0 would mean none) makes z3 answer unknown on the
first try of any real claim; a later try (with a factor large enough to finish)
must then prove it and count the retry.  Without a later try the same obligation
is unknown, and `prove` fails it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import z3

from schedspec.cli.prove import run_obligation
from schedspec.proofs import obligations as O
from schedspec.proofs import loop_claims, loop_obligations
from schedspec.proofs import solving
from schedspec.proofs.symbolic import BLOCK_SIZES
from schedspec.proofs.release import DEFAULT

TINY = 0.001  # seconds: z3 gives up at once


@pytest.fixture
def factors(monkeypatch):
    def use(*f):
        monkeypatch.setattr(solving, "RETRY_FACTORS", tuple(f))
    return use


def test_step_claim_retried_then_proved(factors):
    claim = O.step_claim("max_num_seqs_respected", 2, 2, DEFAULT, block_sizes=(1,), timeout_s=TINY)
    factors(1)
    assert claim.discharge("correct").status == "unknown"
    factors(1, 20_000)  # 1 ms, then 20 s
    before = solving.RETRIES["calls"]
    assert claim.discharge("correct").status == "proved"
    assert solving.RETRIES["calls"] > before


def test_loop_claim_retried_then_proved(factors):
    claim = loop_claims.CLAIMS["max_num_seqs_respected"]
    factors(1)
    assert loop_obligations.discharge(claim, DEFAULT, "correct", timeout_s=TINY, block_sizes=(2,)).status == "unknown"
    factors(1, 20_000)
    before = solving.RETRIES["calls"]
    assert loop_obligations.discharge(claim, DEFAULT, "correct", timeout_s=TINY, block_sizes=(2,)).status == "proved"
    assert solving.RETRIES["calls"] > before


def test_unknown_is_a_failure_in_prove(factors, tmp_path: Path):
    factors(1)
    o = next(o for o in O.build_obligations(DEFAULT, 2, timeout_s=TINY) if o.name == "step:max_num_seqs_respected")
    row = run_obligation(o, tmp_path)
    assert row["result"] == "unknown" and not row["ok"], row


def test_each_try_has_its_own_seed_and_limit(factors, monkeypatch):
    """The restarts are randomized: try k runs with seed k and timeout * factor k
    (a schedule that repeats one seed would only wait longer in z3's tail)."""
    seen = []
    real = solving.make_solver

    def spy(timeout_s, seed=0):
        seen.append((seed, round(timeout_s, 6)))
        solver = real(TINY, seed)
        # Every try gives up, whatever the machine: z3 once solved the formula below
        # inside the 1 ms limit (CI, a fresh clone), so the limit alone is not enough.
        solver.check = lambda *a: z3.unknown
        return solver

    monkeypatch.setattr(solving, "make_solver", spy)
    factors(1, 2, 4)
    x = z3.Int("x")
    hard = [x * x * x + 7 * x * x == 1234567 * x + 98765431]
    status, _, _ = solving.check(hard, 10.0)
    assert status == "unknown"
    assert seen == [(0, 10.0), (1, 20.0), (2, 40.0)]


def test_starvation_theorem_retried_then_proved(factors, monkeypatch):
    """The unbounded theorems go through solving.recheck: same schedule, same
    verdict rules."""
    from schedspec.proofs import starvation as ST

    monkeypatch.setattr(ST, "SOLVER_TIMEOUT_MS", 1)
    factors(1)
    assert ST.discharge_agreement("correct", DEFAULT).status == "unknown"
    factors(1, 20_000)
    before = solving.RETRIES["calls"]
    assert ST.discharge_agreement("correct", DEFAULT).status == "proved"
    assert solving.RETRIES["calls"] > before


def test_recheck_checks_each_solver_once(factors):
    """A solver z3 gave up on is never checked again (solving.recheck: one run in
    30 of the test above came back 'refuted' when the try after a 1 ms timeout
    reused the solver); each try builds its own."""
    import z3

    x, y, w = z3.Ints("x y w")
    built = []

    def build():
        s = z3.Solver()
        s.add(x > 0, y > 0, w > 0, x * x * x + y * y * y == w * w * w)  # no quick answer in 1 ms
        built.append(s)
        return s

    factors(1, 1, 1)
    status, last = solving.recheck(build, 1)
    assert status == "unknown" and len(built) == 3 and len({id(s) for s in built}) == 3 and last is built[-1]


def test_an_injected_check_call_decides_every_try_of_prove_parts():
    """prove_parts tries a many-conjunct goal whole first; an injected check_call must
    decide that try too, so a caller that answers "unknown" is never bypassed by a
    proof made without it."""
    import z3

    from schedspec.proofs.solving import prove_parts

    x = z3.Int("x")
    parts = [("a part", [x >= 1], z3.And(x >= 0, x >= 1))]  # provable, and not one conjunct
    calls = []

    def unknown(constraints, timeout_s):
        calls.append(len(constraints))
        return "unknown"

    status, where = prove_parts(parts, 1.0, check_call=unknown)
    assert status == "unknown" and "a part" in where
    assert calls, "check_call was never asked"
    assert prove_parts(parts, 1.0) == ("proved", "")


def test_the_whole_claim_try_proves_only_by_unsat_and_adapts(monkeypatch):
    """A step claim of several conjuncts is first tried whole, once per case; only
    its unsat proves the case.  Where the whole try misses (unknown here, on every
    case), the conjuncts decide, and after two misses with nothing proved the claim
    stops trying it whole.  A bad variant is never tried whole: it needs a model."""
    calls = []
    real = O.first_try

    def missing(constraints, timeout_s):
        calls.append("miss")
        return "unknown"

    monkeypatch.setattr(O, "first_try", missing)
    claim = O.step_claim("grants_positive", 2, 2, DEFAULT)
    cases = len(list(claim.cases()))  # (block size, policy)
    holds = claim.build("correct", (1,))[1].children()[1]  # applicable => And(conjuncts)
    assert z3.is_and(holds) and holds.num_args() > 2 and cases > 2
    assert claim.discharge("correct").status == "proved"
    assert calls == ["miss", "miss"]  # tried whole in the first two cases only
    assert claim.discharge("zero_grant").status == "refuted" and calls == ["miss", "miss"]

    def proving(constraints, timeout_s):
        calls.append("whole")
        return real(constraints, timeout_s)

    monkeypatch.setattr(O, "first_try", proving)
    calls.clear()
    claim = O.step_claim("grants_positive", 2, 2, DEFAULT)
    before = solving.RETRIES["calls"]
    assert claim.discharge("correct").status == "proved"
    assert calls == ["whole"] * cases and claim.whole_tries == [0, cases]
    assert solving.RETRIES["calls"] == before
    # A claim the whole try would wrongly call proved if it read anything but unsat:
    # sat on the whole goes to the conjuncts, which refute.
    monkeypatch.setattr(O, "first_try", lambda constraints, timeout_s: "sat")
    assert O.step_claim("grants_positive", 2, 2, DEFAULT, block_sizes=(1,)).discharge("zero_grant").status == "refuted"


def test_shared_builds_build_each_encoding_once_and_only_inside(monkeypatch):
    """Within `shared_builds()` (a whole `schedspec prove` run), the step
    obligations of one bound share one schedule + update encoding per block size
    and variant (both policies use it); outside it every build is fresh, so a test
    that patches the encoding sees its patch."""
    built = []
    real = O.encoding.schedule_update

    def counting(*a, **k):
        built.append(1)
        return real(*a, **k)

    monkeypatch.setattr(O.encoding, "schedule_update", counting)
    with O.shared_builds():
        for prop in ("grants_positive", "max_num_seqs_respected", "kv_blocks_conserved"):
            assert O.step_claim(prop, 2, 2, DEFAULT, block_sizes=(2,)).discharge("correct").status == "proved"
        assert O.inductive_step_claim(2, 2, DEFAULT, block_sizes=(2,)).discharge("correct").status == "proved"
        assert len(built) == 1  # one block size asked for: one build, whatever the claims
    built.clear()
    O.step_claim("grants_positive", 2, 2, DEFAULT, block_sizes=(2,)).build("correct", (2,))
    O.step_claim("grants_positive", 2, 2, DEFAULT, block_sizes=(2,)).build("correct", (2,))
    assert len(built) == 2


def test_a_claim_walks_the_block_sizes_it_is_given():
    """step_claim(..., block_sizes=...) narrows the cases, not only the build's default."""
    assert list(O.step_claim("grants_positive", 2, 2, DEFAULT, block_sizes=(2,)).cases()) == [(2, False), (2, True)]
    assert len(list(O.step_claim("grants_positive", 2, 2, DEFAULT).cases())) == 2 * len(BLOCK_SIZES)
