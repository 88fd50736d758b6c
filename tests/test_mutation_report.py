"""scripts/mutation_report.py reads mutmut's results right: statuses, the line a
mutant changes, error-text and feature classes, and merged runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "mutation_report.py"

# What mutmut 3 writes for a module: each function as an original and its
# numbered mutants (here without the trampolines, which the report ignores).
SOURCE = '''
def x_budget__mutmut_orig(s, n):
    s.left -= n
    return s.left > 0


def x_budget__mutmut_1(s, n):
    s.left += n
    return s.left > 0


def x_budget__mutmut_2(s, n):
    s.left -= n
    return s.left >= 0


def x_check__mutmut_orig(v):
    if v < 0:
        raise ValueError("v must be >= 0")


def x_check__mutmut_1(v):
    if v < 0:
        raise ValueError("XXv must be >= 0XX")


def x_hit__mutmut_orig(r, hits):
    return r.num_computed_tokens + len(hits)


def x_hit__mutmut_1(r, hits):
    return r.num_computed_tokens - len(hits)
'''


def make_run(root: Path, codes: dict[str, int | None], source: str = SOURCE) -> Path:
    mod = root / "mutants" / "pkg"
    mod.mkdir(parents=True)
    (mod / "m.py").write_text(source)
    (mod / "m.py.meta").write_text(json.dumps({"exit_code_by_key": codes}))
    return root


def report(*roots: Path) -> dict:
    args = [sys.executable, str(SCRIPT), "--json"]
    for r in roots:
        args += ["--root", str(r)]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def test_statuses_changes_and_classes(tmp_path):
    run = make_run(tmp_path / "a", {"pkg.m.x_budget__mutmut_1": 1, "pkg.m.x_budget__mutmut_2": 0,
                                    "pkg.m.x_check__mutmut_1": 0, "pkg.m.x_hit__mutmut_1": 0})
    rep = report(run)
    assert rep["files"]["pkg/m.py"] == {"killed": 1, "survived": 2, "error text": 1}
    by = {s["mutant"]: s for s in rep["not_killed"]}
    assert by["pkg.m.x_budget__mutmut_2"]["change"] == "return s.left > 0  ->  return s.left >= 0"
    assert by["pkg.m.x_budget__mutmut_2"]["feature"] == "modelled"
    assert by["pkg.m.x_check__mutmut_1"]["status"] == "error text"
    assert by["pkg.m.x_hit__mutmut_1"]["feature"] == "prefix caching"


def test_a_kill_in_any_merged_run_counts(tmp_path):
    a = make_run(tmp_path / "a", {"pkg.m.x_budget__mutmut_1": 0, "pkg.m.x_budget__mutmut_2": None,
                                  "pkg.m.x_check__mutmut_1": 0, "pkg.m.x_hit__mutmut_1": 33})
    b = make_run(tmp_path / "b", {"pkg.m.x_budget__mutmut_1": 1, "pkg.m.x_budget__mutmut_2": 0,
                                  "pkg.m.x_check__mutmut_1": None, "pkg.m.x_hit__mutmut_1": 0})
    rep = report(a, b)
    assert rep["files"]["pkg/m.py"] == {"killed": 1, "survived": 2, "error text": 1}


def test_no_results_is_one_line_and_a_failure(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode != 0
    assert p.stderr.strip().count("\n") == 0 and "run scripts/mutation-score.sh" in p.stderr


STALE = '''
def x_deliver_stale_output__mutmut_orig(w, r):
    w.num_stale -= 1
    encoder_inputs.free_computed(w, r)


def x_deliver_stale_output__mutmut_1(w, r):
    w.num_stale -= 1
    encoder_inputs.free_computed(None, r)


def x_deliver_stale_output__mutmut_2(w, r):
    w.num_stale += 1
    encoder_inputs.free_computed(w, r)


def x_deliver_stale_output__mutmut_3(w, r):
    w.num_stale -= 2
    encoder_inputs.free_computed(w, r)
'''


def test_the_changed_line_names_the_feature_before_the_function_and_the_score_lines(tmp_path):
    """A mutant's feature is the one its changed line names (the stale-output
    delivery's encoder-input line is an encoder-input mutant), else its function's.
    The text report gives the score over modelled code and the one that counts every
    survivor and unreached mutant outside error reporting and file parsing."""
    run = make_run(tmp_path / "a", {"pkg.m.x_deliver_stale_output__mutmut_1": 0,
                                    "pkg.m.x_deliver_stale_output__mutmut_2": 1,
                                    "pkg.m.x_deliver_stale_output__mutmut_3": 0}, STALE)
    rep = report(run)
    by = {s["mutant"]: s["feature"] for s in rep["not_killed"]}
    assert by == {"pkg.m.x_deliver_stale_output__mutmut_1": "encoder inputs",
                  "pkg.m.x_deliver_stale_output__mutmut_3": "async scheduling"}
    assert rep["killed_by_feature"] == {"async scheduling": 1}
    text = subprocess.run([sys.executable, str(SCRIPT), "--root", str(run)], capture_output=True, text=True,
                          check=True).stdout
    assert "killed / (killed + survivors in what the encodings model): 1 / 1 = 100.0 %" in text
    assert "equivalents included): 1 / 3 = 33.3 %" in text


def test_a_sample_of_the_unchecked_mutants_estimates_the_whole_score(tmp_path):
    """--sample: the mutants checked outside the sample count as they are, the
    unchecked rest at the sample's kill rate; error text is outside both."""
    a = make_run(tmp_path / "a", {"pkg.m.x_budget__mutmut_1": 1, "pkg.m.x_budget__mutmut_2": None,
                                  "pkg.m.x_check__mutmut_1": None, "pkg.m.x_hit__mutmut_1": None})
    sample = tmp_path / "sample.txt"
    sample.write_text("pkg.m.x_budget__mutmut_2\n")

    def estimate(code):
        b = make_run(tmp_path / f"b{code}", {"pkg.m.x_budget__mutmut_1": None, "pkg.m.x_budget__mutmut_2": code,
                                             "pkg.m.x_check__mutmut_1": None, "pkg.m.x_hit__mutmut_1": None})
        out = json.loads(subprocess.run([sys.executable, str(SCRIPT), "--json", "--root", str(a), "--root", str(b),
                                         "--sample", str(sample)], capture_output=True, text=True,
                                        check=True).stdout)
        return out["sample"]

    killed = estimate(1)
    # budget_1 checked and killed; budget_2 (drawn) and hit_1 (not) are the unchecked
    # rest, at the sample's rate 1/1; check_1 only changes an error's text
    assert (killed["checked_outside_sample"], killed["unchecked_population"], killed["sample_checked"]) == (1, 2, 1)
    assert killed["estimate"] == 1.0 and killed["low"] < 1.0 == killed["high"]
    survived = estimate(0)
    assert abs(survived["estimate"] - 1 / 3) < 1e-9 and survived["low"] <= 1 / 3 <= survived["high"]
    # a sample with nothing checked is a one-line error
    p = subprocess.run([sys.executable, str(SCRIPT), "--root", str(a), "--sample", str(sample)],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "--sample names no checked mutant" in p.stderr


def test_draw_samples_the_unchecked_mutants_that_count(tmp_path):
    a = make_run(tmp_path / "a", {"pkg.m.x_budget__mutmut_1": 1, "pkg.m.x_budget__mutmut_2": None,
                                  "pkg.m.x_check__mutmut_1": None, "pkg.m.x_hit__mutmut_1": None})

    def draw(*extra):
        return subprocess.run([sys.executable, str(SCRIPT), "--root", str(a), *extra], capture_output=True, text=True)

    # budget_1 is checked and check_1 only changes an error's text: neither is drawn
    assert set(draw("--draw", "5").stdout.split()) == {"pkg.m.x_budget__mutmut_2", "pkg.m.x_hit__mutmut_1"}
    one = draw("--draw", "1", "--seed", "3").stdout.split()
    assert len(one) == 1 and one == draw("--draw", "1", "--seed", "3").stdout.split()  # the seed replays it
    bad = draw("--draw", "0")
    assert bad.returncode == 1 and bad.stderr.strip() == "mutation_report: --draw: 0 is not a positive number of mutants"


VALIDATORS = '''
def x_validate__mutmut_orig(c, where="config"):
    validate_spec_decode(c, where)


def x_validate__mutmut_1(c, where="config"):
    validate_spec_decode(c, )


def x_validate__mutmut_2(c, where="config"):
    validate_spec_decode(c, None)


def x_validate__mutmut_3(c, where="config"):
    validate_spec_decode(None, where)
'''


def test_a_validator_handed_another_error_prefix_is_error_reporting(tmp_path):
    """`where` reaches only ConfigError's field names: a call that drops it or
    passes None changes the error text alone; dropping the config does not."""
    run = make_run(tmp_path / "a", {f"pkg.m.x_validate__mutmut_{i}": 0 for i in (1, 2, 3)}, VALIDATORS)
    by = {s["mutant"]: s["feature"] for s in report(run)["not_killed"]}
    assert by == {"pkg.m.x_validate__mutmut_1": "error reporting", "pkg.m.x_validate__mutmut_2": "error reporting",
                  "pkg.m.x_validate__mutmut_3": "speculative decoding"}
