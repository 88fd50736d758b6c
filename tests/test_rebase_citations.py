"""scripts/rebase-citations.py on two tiny source trees and a tiny repository.

The fake legend uses abbreviations the real one lacks (ZQ, ZR), so that nothing here
is a citation of vLLM: neither tests/test_docs_citations.py nor the script itself,
run on this repository, reads this file's citations.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rebase-citations.py"

OLD_ZQ = """def a():
    x = 1
    y = 2
    return x + y

def b():
    removed_line_here()
    return 3

def c():
    return 4
"""
# One line inserted at the top (two with the blank), the line of b() removed.
NEW_ZQ = """import os

def a():
    x = 1
    y = 2
    return x + y

def b():
    return 3

def c():
    return 4
"""
ZR = "one\ntwo\nthree\n"

RULES = """# Fake rules

**0.1 Source abbreviations.**  Line numbers are those of the fake 1.0.0 release.

| abbr. | file | what |
|---|---|---|
| `ZQ` | `vllm/zq.py` | the changed file |
| `ZR` | `vllm/zr.py` | the unchanged file |

**0.2 Scope.**  Nothing.
"""

CITING = """Cites ZQ:1 and ZQ:4-6, and ZQ:7 (gone), ZQ:10, 11 and ZQ:7-8.
# a list that goes on: ZQ:1,
# 10 and so on.
Left alone: 0.32.0 zq.py:7, 0.32.0 ZQ:7, at 10:30 on 2026-11-02, release 0.33.0, XZQ:4,
ZQ:x, http://example.invalid/ZQ:4 and ZR:2.
Labelled: 0.33.0 ZQ:4-6.
PINS = {("ZQ", 4): "return x + y"}
"""


@pytest.fixture(scope="module")
def rc():
    spec = importlib.util.spec_from_file_location("rebase_citations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def trees(tmp_path):
    """(old root, new root, repository) with the fake legend and CITING in notes.md."""
    for name, zq in (("old", OLD_ZQ), ("new", NEW_ZQ)):
        (tmp_path / name / "vllm").mkdir(parents=True)
        (tmp_path / name / "vllm" / "zq.py").write_text(zq)
        (tmp_path / name / "vllm" / "zr.py").write_text(ZR)
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "rules.md").write_text(RULES)
    (repo / "notes.md").write_text(CITING)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    return tmp_path / "old", tmp_path / "new", repo


def line_map(rc):
    return rc.LineMap(OLD_ZQ.splitlines(), NEW_ZQ.splitlines())


def test_lines_map_past_the_insertion_and_the_deletion(rc):
    lm = line_map(rc)
    assert [lm.map(n).line for n in (1, 4, 6, 8, 10, 11)] == [3, 6, 8, 9, 11, 12]
    assert not any(lm.map(n).flagged for n in (1, 4, 6, 8, 10, 11))


def test_a_deleted_line_is_flagged_with_a_guess(rc):
    gone = line_map(rc).map(7)
    assert gone.flagged and "deleted" in gone.reason
    assert gone.line == 9  # the next surviving line, `return 3`
    assert line_map(rc).map(99).flagged  # not a line of the old file


def test_a_replaced_line_is_flagged(rc):
    lm = rc.LineMap(["a", "x = compute(1)", "b"], ["a", "x = compute(2)", "b"])
    m = lm.map(2)
    assert m.flagged and "replaced" in m.reason and m.line == 2


def test_dry_run_changes_nothing_and_reports(rc, trees, tmp_path, capsys):
    old, new, repo = trees
    report = tmp_path / "report.txt"
    assert rc.main([str(old), str(new), "--repo", str(repo), "--report", str(report)]) == 0
    assert (repo / "notes.md").read_text() == CITING
    text = report.read_text()
    assert "needs a human" in text and "removed_line_here()" in text
    assert "0.33.0 ZQ:4-6" in text  # labelled: listed, left as written
    assert "Line numbers are those of the fake 1.0.0 release" in text  # the legend's prose
    assert "notes.md" in capsys.readouterr().out


def test_apply_rewrites_citations_only(rc, trees):
    old, new, repo = trees
    assert rc.main([str(old), str(new), "--repo", str(repo), "--apply"]) == 0
    assert (repo / "notes.md").read_text() == CITING.replace(
        "ZQ:1 and ZQ:4-6, and ZQ:7 (gone), ZQ:10, 11 and ZQ:7-8",
        "ZQ:3 and ZQ:6-8, and ZQ:9 (gone), ZQ:11, 12 and ZQ:9",
    ).replace("ZQ:1,\n# 10 and", "ZQ:3,\n# 11 and").replace('("ZQ", 4)', '("ZQ", 6)')


def test_relabel_rewrites_the_old_release_labelled_ones(rc, trees):
    old, new, repo = trees
    assert rc.main([str(old), str(new), "--repo", str(repo), "--apply", "--relabel", "0.33.0=0.34.0"]) == 0
    text = (repo / "notes.md").read_text()
    assert "Labelled: 0.34.0 ZQ:6-8." in text
    assert "0.32.0 ZQ:7," in text and "release 0.33.0," in text  # another release; not a label


def test_relabel_wants_two_releases(rc, trees):
    old, new, repo = trees
    with pytest.raises(SystemExit):
        rc.main([str(old), str(new), "--repo", str(repo), "--relabel", "0.33.0"])


def test_since_leaves_the_lines_edited_since_alone(rc, trees):
    old, new, repo = trees
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "commit", "-q", "-m", "citations of the old release"], cwd=repo, check=True)
    by_hand = CITING.replace("Labelled: 0.33.0 ZQ:4-6.", "By hand, new numbers: ZQ:6-8.")
    (repo / "notes.md").write_text(by_hand)
    assert rc.main([str(old), str(new), "--repo", str(repo), "--apply", "--since", "HEAD"]) == 0
    text = (repo / "notes.md").read_text()
    assert "By hand, new numbers: ZQ:6-8." in text  # not shifted a second time
    assert text.startswith("Cites ZQ:3 and ZQ:6-8,")
