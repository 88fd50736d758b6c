"""Citations of the rule book and of vLLM's source resolve.

- Every `docs/rules.md §N` (or `§N.M`) in the repository's .py and .md files names a
  section of docs/rules.md, and every bare `§N` inside docs/rules.md names one of its own
  sections.  Elsewhere a section sign must follow `docs/rules.md`; the old citation forms
  (the shared book's file name, "rule book" and a section number) are errors.
- Every vLLM source citation `ABBR:LINE`, `ABBR:FIRST-LAST` (abbreviations from the legend
  in docs/rules.md §0.1) in the repository's .py and .md files lies inside that file of
  the installed vLLM 0.34.0, and the lines the rule book leans on hold what it says they
  hold.  Skipped, with the reason, when vLLM 0.34.0 is not installed.
- No file of the repository points into the project's shared folder, which users do not
  have.

Each checker is also run on planted bad input: a checker that finds nothing fails.
The planted strings are built from pieces (and `\\u00a7` for the section sign), so that
this file itself holds no citation and no shared-folder path.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "docs" / "rules.md"
VLLM_VERSION = "0.34.0"
SECTION = "\u00a7"  # the section sign

# A numbered heading ("## 4. The waiting loop") or a numbered paragraph lead
# ("**4.2 The loop.**").
SECTION_LEAD = re.compile(r"^(?:#{1,6}[ \t]+|\*\*)(\d+(?:\.\d+)*)\.?[ \t]", re.M)
NUMBER = r"(\d+(?:\.\d+)*)"
RULE_CITATION = re.compile(
    r"(?:docs/)?rules\.md[ \t]*" + SECTION + r"[ \t]*\d+(?:\.\d+)*"
    r"(?:[ \t]*(?:,|and|or)[ \t]*" + SECTION + r"[ \t]*\d+(?:\.\d+)*)*")
BARE_SECTION = re.compile(SECTION + r"[ \t]*" + NUMBER)
STALE_FORMS = (
    (re.compile(r"v1-scheduler" + r"-rules"), "the shared rule book's file name; cite docs/rules.md"),
    (re.compile(r"rule[ \t]+book[ \t]*" + SECTION, re.I), "'rule book " + SECTION + "N'; cite docs/rules.md "
     + SECTION + "N"),
)
LEGEND_ROW = re.compile(r"^\|[ \t]*`([A-Z]+)`[ \t]*\|[ \t]*`(vllm/[^`]+\.py)`[ \t]*\|", re.M)
SHARED_PATHS = (b".." + b"/shared", b"/work" + b"/shared")
# Files allowed to name a shared-folder path, with how often and why.
SHARED_ALLOWED = {
    # The list of terms the command line's help texts must not contain.
    "tests/test_cli_flags.py": 1,
}

# Lines of vLLM 0.34.0 that docs/rules.md builds its rules on: (abbr, line) -> text the
# line must contain.  When vLLM moves, these fail first; re-check the book then.
PINNED_LINES = {
    ("S", 735): "token_budget = self.max_num_scheduled_tokens",
    ("S", 738): "input_budget = self.scheduler_config.max_num_batched_tokens",
    ("S", 777): "if self.scheduler_config.enable_chunked_prefill and num_eligible_reqs > 1",
    ("S", 811): "while req_index < len(self.running) and token_budget > 0",
    ("S", 823): "request.num_computed_tokens + 2 - request.num_output_placeholders",
    ("S", 860): "if 0 < long_prefill_token_threshold < num_new_tokens",
    ("S", 872): "- self.num_sampled_tokens_per_step",
    ("S", 954): "preempted_req = self.running[-1]",
    ("S", 964): "req_index -= 1",
    ("S", 986): "preempted_req = self.running.pop()",
    ("S", 1066): "if not preempted_reqs",
    ("S", 1096): "num_running >= self.max_num_active_reqs or token_budget <= 0",
    ("S", 1123): "if request.num_stale_output_tokens and not request.drop_stale_output",
    ("S", 1345): "request_token_budget = min(token_budget, input_budget - draft_slots)",
    ("S", 1356): "num_new_tokens = request.num_tokens - num_computed_tokens",
    ("S", 1388): "not self.scheduler_config.enable_chunked_prefill",
    ("S", 1396): "num_new_tokens = min(num_new_tokens, request_token_budget)",
    ("S", 1511): "full_sequence_must_fit=self.scheduler_reserve_full_isl",
    ("S", 1513): "has_scheduled_reqs=bool(self.running)",
    ("S", 1681): "self.waiting.prepend_requests(step_skipped_waiting)",
    ("S", 1889): "request.num_stale_output_tokens = request.num_in_flight_tokens",
    ("S", 1896): "self.waiting.prepend_request(request)",
    ("S", 1912): "request.num_computed_tokens += num_scheduled_token",
    ("S", 2373): "if request is None or request.is_finished():",
    ("S", 2468): "self.kv_cache_manager.cache_blocks(",
    ("S", 2897): "request.num_computed_tokens -= len(new_token_ids) - num_new",
    ("AS", 36): "request.num_output_placeholders += (",
    ("Q", 94): "self.appendleft(request)",
    ("U", 98): "def check_stop(",
    ("K", 210): "self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)",
    ("K", 324): "max_cache_hit_length = request.get_max_cache_hit_length(max_cache_hit_length)",
    ("K", 552): "if full_sequence_must_fit:",
    ("K", 605): "available_blocks = self.block_pool.get_num_free_blocks() - reserved_blocks",
    ("K", 642): "num_tokens_to_cache = min(",
    ("T", 241): "return max(num_required_blocks - num_req_blocks, 0)",
    ("T", 799): "itertools.islice(full_block_hashes, max_length // block_size)",
    ("P", 164): "self.null_block = self.free_block_queue.popleft()",
    ("P", 835): "self.free_block_queue.prepend_n(blocks_to_evict_first)",
    ("P", 837): "self.free_block_queue.append_n(blocks_to_evict_last)",
    ("RQ", 422): "class RequestStatus(",
    ("C", 375): "if self.max_num_batched_tokens < self.max_num_seqs:",
    ("V", 560): "def max_concurrent_batches",
    ("E", 758): "def step_with_batch_queue(",
}


# -- the checkers -------------------------------------------------------------------------

def rule_sections(text: str) -> set[str]:
    """The section numbers docs/rules.md defines."""
    return set(SECTION_LEAD.findall(text))


def check_rule_citations(text: str, sections: set[str], *, own: bool = False) -> list[str]:
    """Problems with the rule-book citations in `text`; `own` when `text` is the book."""
    problems = [f"{m.group(0)!r}: {why}" for pattern, why in STALE_FORMS for m in pattern.finditer(text)]
    cited: set[int] = set()
    for m in RULE_CITATION.finditer(text):
        for n in BARE_SECTION.finditer(m.group(0)):
            cited.add(m.start() + n.start())
            if n.group(1) not in sections:
                problems.append(f"{m.group(0)!r}: docs/rules.md has no section {n.group(1)}")
    for n in BARE_SECTION.finditer(text):
        if n.start() in cited:
            continue
        if not own:
            problems.append(f"{n.group(0)!r}: a section sign without 'docs/rules.md' before it")
        elif n.group(1) not in sections:
            problems.append(f"{n.group(0)!r}: no such section in this book")
    return problems


def legend(text: str) -> dict[str, str]:
    """abbreviation -> path inside site-packages, from the table of docs/rules.md §0.1."""
    return dict(LEGEND_ROW.findall(text))


def source_citation_pattern(abbrs) -> re.Pattern:
    names = "|".join(sorted(map(re.escape, abbrs), key=len, reverse=True))
    return re.compile(r"(?<![\w:/.\-])(" + names + r"):(\d+)(?:-(\d+))?((?:,[ \t]*\d+(?:-\d+)?)*)")


def check_source_citations(text: str, line_counts: dict[str, int]) -> list[str]:
    """Problems with the `ABBR:LINE[-LINE]` citations in `text`: each line must exist in
    the cited file (`line_counts`: abbreviation -> number of lines)."""
    problems = []
    for m in source_citation_pattern(line_counts).finditer(text):
        abbr = m.group(1)
        spans = [(int(m.group(2)), int(m.group(3) or m.group(2)))]
        spans += [(int(a), int(b or a)) for a, b in re.findall(r"(\d+)(?:-(\d+))?", m.group(4))]
        for first, last in spans:
            if not 1 <= first <= last <= line_counts[abbr]:
                problems.append(f"{m.group(0)!r}: {abbr} has lines 1-{line_counts[abbr]}, "
                                f"not {first}-{last}")
    return problems


def shared_mentions(data: bytes) -> int:
    return sum(data.count(s) for s in SHARED_PATHS)


# -- the repository and vLLM ----------------------------------------------------------------

def repo_files() -> list[str]:
    """The repository's files (tracked, or untracked and not ignored), relative to ROOT."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
        names = sorted({n.decode() for n in out.split(b"\0") if n})
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        skip = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "build"}
        names = []
        for here, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            names += [str(Path(here, f).relative_to(ROOT)) for f in files]
    return [n for n in names if (ROOT / n).is_file()]


def text_files() -> dict[str, str]:
    return {n: (ROOT / n).read_text(encoding="utf-8") for n in repo_files() if n.endswith((".py", ".md"))}


@pytest.fixture(scope="module")
def book() -> str:
    assert RULES.is_file(), "docs/rules.md is missing"
    return RULES.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def vllm_lines(book) -> dict[str, list[str]]:
    """abbreviation -> the lines of that file in the installed vLLM 0.34.0."""
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed (./setup.sh installs it); source citations unchecked")
    version = importlib.metadata.version("vllm")
    if version != VLLM_VERSION:
        pytest.skip(f"vLLM {version} is installed; the citations are line numbers of {VLLM_VERSION}")
    site = Path(list(spec.submodule_search_locations)[0]).parent
    paths = legend(book)
    missing = [p for p in paths.values() if not (site / p).is_file()]
    assert not missing, f"docs/rules.md §0.1 names files vLLM {VLLM_VERSION} lacks: {missing}"
    return {abbr: (site / p).read_text(encoding="utf-8").splitlines() for abbr, p in paths.items()}


# -- rule-book citations --------------------------------------------------------------------

def test_book_sections_are_numbered_once(book):
    leads = SECTION_LEAD.findall(book)
    assert len(leads) > 40, "docs/rules.md lost its numbered sections"
    assert len(leads) == len(set(leads)), sorted(n for n in leads if leads.count(n) > 1)
    for n in leads:  # every subsection sits under its section
        assert "." not in n or n.rsplit(".", 1)[0] in leads, n


def test_rule_citations_resolve(book):
    sections = rule_sections(book)
    problems = [f"{name}: {p}" for name, text in text_files().items()
                for p in check_rule_citations(text, sections, own=name == "docs/rules.md")]
    assert not problems, "\n".join(problems)


def test_rule_citations_are_used():
    """The citation check has something to check: the code cites the book."""
    cites = [name for name, text in text_files().items()
             if name != "docs/rules.md" and RULE_CITATION.search(text)]
    assert len(cites) >= 2, cites


def test_rule_checker_reports_planted_citations(book):
    sections = rule_sections(book)
    good = "rules.md " + SECTION + "3.7 and docs/rules.md " + SECTION + "11"
    assert check_rule_citations(good, sections) == []
    bad = {
        "see docs/rules.md " + SECTION + "99.9": "no section 99.9",
        "docs/rules.md " + SECTION + "3.7, " + SECTION + "3.99": "no section 3.99",
        "Setting (rule book " + SECTION + "7)": "rule book",
        "(v1-scheduler" + "-rules.md, R = vLLM 0.33.0)": "file name",
        "as " + SECTION + "4.2 says": "without 'docs/rules.md'",
    }
    for text, why in bad.items():
        problems = check_rule_citations(text, sections)
        assert problems and why in " ".join(problems), (text, problems)
    assert check_rule_citations("see " + SECTION + "99", sections, own=True)


# -- vLLM source citations ------------------------------------------------------------------

def test_source_citations_within_vllm(vllm_lines):
    counts = {abbr: len(lines) for abbr, lines in vllm_lines.items()}
    pattern = source_citation_pattern(counts)
    problems, seen = [], 0
    for name, text in text_files().items():
        seen += len(pattern.findall(text))
        problems += [f"{name}: {p}" for p in check_source_citations(text, counts)]
    assert seen > 200, f"only {seen} source citations found: is the pattern broken?"
    assert not problems, "\n".join(problems)


def test_source_checker_reports_planted_citations(vllm_lines):
    counts = {abbr: len(lines) for abbr, lines in vllm_lines.items()}
    assert check_source_citations("(S:735, K:605-609, RQ:409-419)", counts) == []
    c = ":"  # planted citations are assembled, so that this file holds none
    for text in (f"S{c}999999", f"the loop (S{c}795-99999)", f"S{c}0", f"K{c}588-584",
                 f"S{c}719, 99999", f"RQ{c}{counts['RQ'] + 1}"):
        assert check_source_citations(text, counts), text
    # Not citations: another file's line, a longer name, a time of day.
    assert check_source_citations("M:U:99999 SUS:99999 12:99999", counts) == []


def test_pinned_lines_hold_what_the_book_says(vllm_lines):
    wrong = [f"{abbr}:{n} should contain {text!r}, is {vllm_lines[abbr][n - 1].strip()!r}"
             for (abbr, n), text in PINNED_LINES.items() if text not in vllm_lines[abbr][n - 1]]
    assert not wrong, "\n".join(wrong)


def test_legend_covers_the_abbreviations_in_use(book):
    abbrs = legend(book)
    assert {"S", "K", "T", "P", "Q", "U", "RQ", "KU", "O", "C", "CC"} <= set(abbrs), sorted(abbrs)
    assert all(p.startswith("vllm/") for p in abbrs.values())


# -- no pointers into the shared folder -----------------------------------------------------

def test_no_file_points_into_the_shared_folder():
    found = {}
    for name in repo_files():
        count = shared_mentions((ROOT / name).read_bytes())
        if count != SHARED_ALLOWED.get(name, 0):
            found[name] = count
    assert not found, f"files naming the shared folder (count found; allowed: {SHARED_ALLOWED}): {found}"


def test_shared_check_reports_planted_mentions():
    assert shared_mentions(b"see ../" + b"shared/docs/book.md") == 1
    assert shared_mentions(b"open /work/" + b"shared/docs") == 1
    assert shared_mentions(b"docs/rules.md") == 0
