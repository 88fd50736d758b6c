"""The documentation site (mkdocs.yml over docs/) builds with `mkdocs build --strict`:
every page is in the nav, and every link between pages and every anchor resolves.
The README keeps the quick start and stays an entry point.

Skipped, with the reason, where MkDocs is not installed (the `test` extra installs it);
under CI (CI=true) a missing MkDocs fails instead, so the check cannot vanish there.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICK_START = (
    "./setup.sh                      # creates .venv, installs schedspec + vLLM 0.34.0 (CPU), runs the examples",
    ".venv/bin/python -m pytest      # the whole test suite",
)


def need_mkdocs() -> None:
    if importlib.util.find_spec("mkdocs") is not None:
        return
    why = "MkDocs is not installed (pip install -e '.[test]' installs it); the site is not built"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true: {why}")
    pytest.skip(why)


def build(config: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
                          capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly(tmp_path):
    need_mkdocs()
    run = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    for page in (ROOT / "docs").glob("*.md"):  # every page was built, none left out
        name = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (tmp_path / "site" / name).is_file(), f"docs/{page.name} is not in the built site"


# One planted defect of each kind, and the words of mkdocs's warning for it.
PLANTED = {
    "[a page](no-such-page.md)": "contains a link 'no-such-page.md', but the target is not found",
    "[an anchor](proofs.md#no-such-anchor)": "does not contain an anchor '#no-such-anchor'",
    "[a source file](../spec/scheduler.py)": "contains a link '../spec/scheduler.py', but the target is not found",
}


def test_the_strict_build_fails_on_each_kind_of_defect(tmp_path):
    """The check above can fail: a copy of the site with broken links and a page left
    out of the nav does not build, and each defect is named."""
    need_mkdocs()
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "cli.md").open("a", encoding="utf-8") as f:
        f.write("\n" + "\n".join(PLANTED) + "\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    run = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    for warning in (*PLANTED.values(), "not included in the \"nav\""):
        assert warning in said, f"no warning {warning!r} in:\n{said}"


def test_the_readme_is_an_entry_point():
    """Short, with the quick start CI runs (.ci/run), and its links to docs/ resolve."""
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    for command in QUICK_START:
        assert command in lines, f"README.md lost its quick-start line {command!r}"
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", text)
    assert links, "README.md links no page of docs/"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README.md links missing pages: {missing}"
