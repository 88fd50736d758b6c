#!/usr/bin/env python3
"""Re-base the repository's vLLM source-line citations from one release to another.

schedspec cites vLLM's source by line, in the form of docs/rules.md §0.1: an
abbreviation from the legend table there, a colon and a line, a range or a list of
them (ABBR:LINE, ABBR:FIRST-LAST, ABBR:LINE, LINE-LINE; a list may go on after a line
break, past a `#`; ABBR:LINE/LINE is a list too).  Those numbers are lines of the
modelled release.  When the project moves to a new release, every number must move
with the code it points at; this script does that.

How a maintainer uses it when adding a release:

1. Unpack both releases' sources (the files the legend names) into two folders,
   e.g. `tar xzf vllm-X.tar.gz --strip-components=1 vllm-X/vllm/v1/core ...`.
2. Dry run, from the repository root:
       scripts/rebase-citations.py OLD_ROOT NEW_ROOT --report /tmp/rebase.txt
   It prints what it would change, per file, and the citations that need a human.
3. Apply on a clean tree (one commit of its own):
       scripts/rebase-citations.py OLD_ROOT NEW_ROOT --apply --relabel OLD=NEW
   Every citation is rewritten, the flagged ones to the best guess, so that the
   tree stays consistent; then go through the "needs a human" list.  Run it once:
   a second run would move the numbers again.
4. By hand: the prose that names the release (the legend's wording in
   docs/rules.md §0.1, VLLM_VERSION in tests/test_docs_citations.py, ...), and the
   pinned texts the report says no longer hold.

How a line is mapped: difflib.SequenceMatcher aligns the two files' lines (compared
without their indentation).  A line inside an 'equal' block maps exactly; every other
case is flagged, with a best guess: a line whose indentation changed (it may sit under
a new condition) maps as in the 'equal' block; a line of a 'replace' or 'delete' block
maps to its text where that reappears among the new file's changed lines (near the
block, or anywhere if it is unique), else to the most similar changed line near the
block, else proportionally inside a 'replace' block or to the place of a deletion.  A
range maps each end; one that would turn over keeps its guessed end and old length.

What it leaves alone: text that is not a citation (dates, releases such as 0.33.0,
times of day), citations by full file name (`0.32.0 scheduler.py:846`; those without
a release are listed in the report), and citations labelled with a release
(`<release> ABBR:LINE`): those labelled with OLD are rewritten, label and all, only
with `--relabel OLD=NEW` (`--relabel OLD=` drops the label); the others are listed.
With `--since REV` it also leaves alone the citations on lines added or changed since
commit REV: in a tree where people have begun citing the new release by hand, run it
with REV the last commit before that work (the numbers written since may be new ones
already; a second shift would break them), and check the listed ones by hand.
It also maps PINNED_LINES-style entries, `("ABBR", LINE): "text"`, and says whether
the text still holds at the new line.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import difflib
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

LEGEND_ROW = re.compile(r"^\|[ \t]*`([A-Z]+)`[ \t]*\|[ \t]*`(vllm/[^`]+\.py)`[ \t]*\|", re.M)
RELEASE = r"\d+\.\d+\.\d+"
SECTION = "\u00a7"  # the section sign, written so that this file cites no section
ITEM = re.compile(r"(\d+)(?:-(\d+))?")
# Between two items of one citation: a comma, and maybe a line break and a comment's `#`;
# or a slash (`ABBR:LINE/LINE`).
ITEM_SEP = r"(?:,[ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?|/)"
# A label right before a citation: `0.33.0 ABBR:..`, `0.33.0: ABBR:..`.
LABEL = re.compile(r"(?<![\w.])(" + RELEASE + r"):?(?:[ \t]+|[ \t]*\n[ \t]*(?:#[ \t]*)?)\Z")
# A release named right before a parenthesised citation: `0.33.0 (ABBR:..`.
NEAR_RELEASE = re.compile(r"(?<![\w.])(" + RELEASE + r")[ \t]*\(\Z")
# What may stand between two citations of one chain: a comma or a semicolon.
CHAIN = re.compile(r"[ \t]*[,;][ \t]*(?:\n[ \t]*(?:#[ \t]*)?)?")
INNER_RANGE_MAX = 60  # longer ranges (whole functions) whose inside changed are only counted
FULL_PATH = re.compile(r"(?<![\w/.\-])((?:[\w\-]+/)*[\w\-]+\.py):(\d+(?:-\d+)?(?:,[ \t]*\d+(?:-\d+)?)*)")
PIN = re.compile(r'\(\s*"([A-Z]+)"\s*,\s*(\d+)\s*\)\s*:\s*("(?:[^"\\\n]|\\.)*")')


# -- the legend -----------------------------------------------------------------------------

def legend(rules_text: str) -> dict[str, str]:
    """abbreviation -> path inside the release's source tree, from docs/rules.md §0.1."""
    return dict(LEGEND_ROW.findall(rules_text))


def legend_prose(rules_text: str) -> list[tuple[int, str]]:
    """The lines of the legend's paragraph (from `**0.1` up to `**0.2`) that name a release:
    prose to edit by hand."""
    lines = rules_text.splitlines()
    start = next((i for i, s in enumerate(lines) if s.startswith("**0.1")), None)
    if start is None:
        return []
    found = []
    for i in range(start, len(lines)):
        if i > start and lines[i].startswith("**0.2"):
            break
        if re.search(RELEASE, lines[i]):
            found.append((i + 1, lines[i]))
    return found


def citation_pattern(abbrs) -> re.Pattern:
    """ABBR:ITEM[, ITEM...]; the grammar of tests/test_docs_citations.py, plus lists that
    go on after a line break."""
    names = "|".join(sorted(map(re.escape, abbrs), key=len, reverse=True))
    item = r"\d+(?:-\d+)?"
    return re.compile(r"(?<![\w:/.\-])(" + names + r"):(" + item + r"(?:" + ITEM_SEP + item + r")*)")


# -- mapping one file's lines ---------------------------------------------------------------

@dataclass
class Mapped:
    line: int  # the new line (1-based), the best guess where flagged
    reason: str = ""  # empty: exact; else why it needs a human

    @property
    def flagged(self) -> bool:
        return bool(self.reason)


class LineMap:
    """Old line numbers of one file -> new ones."""

    WINDOW = 15  # lines either side of a changed block where a similar line is looked for

    def __init__(self, old: list[str], new: list[str]):
        self.old, self.new = old, new
        a, b = [s.strip() for s in old], [s.strip() for s in new]
        self.opcodes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        self._starts = [op[1] for op in self.opcodes]
        # New lines no old line maps onto exactly: where a changed old line may have gone.
        self._unmatched = [j for tag, _, _, j1, j2 in self.opcodes if tag != "equal" for j in range(j1, j2)]
        self._unmatched_at: dict[str, list[int]] = {}
        for j in self._unmatched:
            self._unmatched_at.setdefault(b[j], []).append(j)
        self._old_count: dict[str, int] = {}
        for s in a:
            self._old_count[s] = self._old_count.get(s, 0) + 1

    def _opcode(self, i: int):
        return self.opcodes[bisect.bisect_right(self._starts, i) - 1]

    def map(self, n: int, end: str = "first") -> Mapped:
        """Line n of the old file in the new one; `end` says which end of a range n is
        ('first' or 'last'), for a line that changed."""
        if not 1 <= n <= len(self.old):
            return Mapped(n, "not a line of the old file")
        i = n - 1
        tag, i1, i2, j1, j2 = self._opcode(i)
        if tag == "equal":  # the same text; a change of indentation may be a new nesting
            j = j1 + (i - i1)
            return Mapped(j + 1, "" if self.old[i].rstrip() == self.new[j].rstrip() else "reindented")
        if tag == "replace":  # proportionally: the block's first line to its first, last to last
            if end == "last":
                guess = j1 + max(-(-(i - i1 + 1) * (j2 - j1) // (i2 - i1)) - 1, 0)
            else:
                guess = j1 + (i - i1) * (j2 - j1) // (i2 - i1)
        else:  # deleted: the next surviving line, or for a range's last end the one before
            guess = j1 if end == "first" else j1 - 1
        guess = min(max(guess, 0), len(self.new) - 1)
        what = "replaced" if tag == "replace" else "deleted"
        text = self.old[i].strip()
        near = (j1 - self.WINDOW, j2 + self.WINDOW)
        places = self._unmatched_at.get(text, []) if _meaningful(text) else []
        if places:
            nearest = min(places, key=lambda j: abs(j - guess))
            if near[0] <= nearest < near[1] or (len(places) == 1 and self._old_count[text] == 1):
                return Mapped(nearest + 1, "moved")
            what += ", its text also at " + ", ".join(str(j + 1) for j in places)
        similar = self._similar(text, guess, j1, j2, near)
        if similar is not None:
            return Mapped(similar + 1, what + ", similar line")
        return Mapped(guess + 1, what)

    def _similar(self, text: str, guess: int, j1: int, j2: int, near: tuple[int, int]) -> int | None:
        """The new line most like `text` among the changed ones near the block j1..j2 (0.5
        inside the block, 0.6 around it), nearest to `guess` among equals; None if none."""
        if not text:
            return None
        lo, hi = bisect.bisect_left(self._unmatched, near[0]), bisect.bisect_left(self._unmatched, near[1])
        best = max(((_similarity(text, self.new[j].strip()), -abs(j - guess), j) for j in self._unmatched[lo:hi]),
                   default=None)
        if best is None or best[0] < (0.5 if j1 <= best[2] < j2 else 0.6):
            return None
        return best[2]

    def interior_changed(self, first: int, last: int) -> bool:
        """Whether anything inside old lines first..last was inserted, deleted or changed."""
        for tag, i1, i2, j1, j2 in self.opcodes:
            if tag == "equal":
                continue
            if tag == "insert" and first - 1 < i1 <= last - 1:
                return True
            if tag != "insert" and i1 < last and i2 > first - 1:
                return True
        return False


def _meaningful(text: str) -> bool:
    """Whether a line is distinctive enough to be looked for elsewhere."""
    return len(re.sub(r"[\W_]", "", text)) >= 8


def _similarity(a: str, b: str) -> float:
    """How alike two lines are, 0 to 1; lines of the same kind (`while`, `if`, `return`
    ...) a little more."""
    ratio = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    same_kind = a.split(" ", 1)[0] == b.split(" ", 1)[0] and a[:1].isalpha()
    return min(1.0, ratio + (0.1 if same_kind else 0.0))


# -- finding and rewriting citations ----------------------------------------------------------

@dataclass
class Citation:
    path: str
    lineno: int  # of the citation in the repository file
    start: int
    end: int
    abbr: str
    text: str  # as written
    label: str = ""  # the release written right before it (or before its chain)
    label_span: tuple[int, int] | None = None  # where that label is, on the chain's first
    near_release: str = ""  # `<release> (ABBR:...`: a release named next to it
    kept: bool = False  # on a line edited since --since REV: left as written
    new_text: str = ""
    items: list[tuple[tuple[int, int], tuple[Mapped, Mapped]]] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return any(a.flagged or b.flagged for _, (a, b) in self.items)


def find_citations(path: str, text: str, pattern: re.Pattern) -> list[Citation]:
    """The citations in `text`, each with the release label written before it or before
    the first citation of its chain."""
    found: list[Citation] = []
    prev: Citation | None = None
    for m in pattern.finditer(text):
        c = Citation(path, text.count("\n", 0, m.start()) + 1, m.start(), m.end(), m.group(1), m.group(0))
        before = text[max(0, m.start() - 80):m.start()]
        label = LABEL.search(before)
        if label:
            c.label = label.group(1)
            offset = m.start() - len(before)
            c.label_span = (offset + label.start(), offset + label.end())
        elif prev is not None and CHAIN.fullmatch(text[prev.end:m.start()]):
            c.label, c.near_release = prev.label, prev.near_release
        near = NEAR_RELEASE.search(before)
        if near:
            c.near_release = near.group(1)
        found.append(c)
        prev = c
    return found


def rebase(c: Citation, maps: dict[str, LineMap]) -> None:
    """Fill in c.items and c.new_text: every number of c mapped."""
    lm = maps[c.abbr]
    head = len(c.abbr) + 1
    out, pos = [c.text[:head]], head
    for m in ITEM.finditer(c.text, head):
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if m.group(2):
            a, b = lm.map(first, "first"), lm.map(last, "last")
            if b.line < a.line:  # turned over: keep the guessed end, and the old length
                if a.flagged and not b.flagged:
                    b = Mapped(min(a.line + last - first, len(lm.new)), "range turned over")
                else:
                    a = Mapped(max(b.line - (last - first), 1), a.reason or "range turned over")
            new = f"{a.line}-{b.line}" if b.line != a.line else str(a.line)
        else:
            a = b = lm.map(first)
            new = str(a.line)
        c.items.append(((first, last), (a, b)))
        out += [c.text[pos:m.start()], new]
        pos = m.end()
    out.append(c.text[pos:])
    c.new_text = "".join(out)


def new_label(c: Citation, relabel: dict[str, str], text: str) -> str | None:
    """The replacement of c's label under --relabel (None: keep it as written)."""
    if c.label_span is None or c.label not in relabel:
        return None
    written = text[c.label_span[0]:c.label_span[1]]
    target = relabel[c.label]
    return written.replace(c.label, target, 1) if target else ""


# -- the pinned lines of the citation test ------------------------------------------------------

@dataclass
class Pin:
    path: str
    lineno: int
    span: tuple[int, int]  # of the line number
    abbr: str
    old: int
    text: str
    mapped: Mapped | None = None
    holds: bool = True
    kept: bool = False  # on a line edited since --since REV: left as written


def find_pins(path: str, text: str, maps: dict[str, LineMap]) -> list[Pin]:
    """The `("ABBR", LINE): "text"` entries, mapped, and whether the text still holds."""
    pins = []
    for m in PIN.finditer(text):
        if m.group(1) not in maps:
            continue
        p = Pin(path, text.count("\n", 0, m.start()) + 1, m.span(2), m.group(1), int(m.group(2)),
                ast.literal_eval(m.group(3)))
        lm = maps[p.abbr]
        p.mapped = lm.map(p.old)
        p.holds = 1 <= p.mapped.line <= len(lm.new) and p.text in lm.new[p.mapped.line - 1]
        pins.append(p)
    return pins


# -- one file ---------------------------------------------------------------------------------

@dataclass
class FileResult:
    path: str
    citations: list[Citation]
    pins: list[Pin]
    full_paths: list[tuple[int, str, str]]  # (line, citation, release label or "")
    new_text: str


def process(path: str, text: str, pattern: re.Pattern, maps: dict[str, LineMap],
            relabel: dict[str, str], edited: set[int] = frozenset()) -> FileResult:
    """Re-base one file's citations; those on the lines `edited` are left as written."""
    citations = find_citations(path, text, pattern)
    edits: list[tuple[int, int, str]] = []
    for c in citations:
        rebase(c, maps)
        c.kept = not edited.isdisjoint(range(c.lineno, c.lineno + c.text.count("\n") + 1))
        if c.kept or (c.label and c.label not in relabel):
            continue  # edited since --since REV, or labelled with a release: left as written
        if c.new_text != c.text:
            edits.append((c.start, c.end, c.new_text))
        label = new_label(c, relabel, text)
        if label is not None:
            edits.append((c.label_span[0], c.label_span[1], label))
    pins = find_pins(path, text, maps)
    for p in pins:
        p.kept = p.lineno in edited
    edits += [(p.span[0], p.span[1], str(p.mapped.line)) for p in pins if p.mapped.line != p.old and not p.kept]
    new = text
    for start, end, repl in sorted(edits, reverse=True):
        new = new[:start] + repl + new[end:]
    return FileResult(path, citations, pins, full_path_citations(text), new)


def full_path_citations(text: str) -> list[tuple[int, str, str]]:
    """Citations by file name (`block_pool.py:290`), with the release written before them."""
    found = []
    for m in FULL_PATH.finditer(text):
        label = LABEL.search(text[max(0, m.start() - 80):m.start()])
        found.append((text.count("\n", 0, m.start()) + 1, m.group(0), label.group(1) if label else ""))
    return found


# -- the report -------------------------------------------------------------------------------

def describe(c: Citation, maps: dict[str, LineMap]) -> list[str]:
    """A flagged citation: where, as written, the old and new text of each changed line."""
    lm = maps[c.abbr]
    out = [f"  {c.path}:{c.lineno}  {flat(c.text)}  ->  {flat(c.new_text)}"]
    for (first, last), (a, b) in c.items:
        for n, mp in ((first, a), (last, b)) if first != last else ((first, a),):
            if not mp.flagged:
                continue
            old = repr(lm.old[n - 1].strip()) if 1 <= n <= len(lm.old) else "(none)"
            out.append(f"      [{mp.reason}] old {c.abbr}:{n}: {old}")
            out.append(f"      {' ' * (len(mp.reason) + 2)} new {c.abbr}:{mp.line}: {new_line_text(lm, mp.line)}")
    return out


def flat(text: str) -> str:
    return text.replace("\n", " ")


def new_line_text(lm: LineMap, n: int) -> str:
    return repr(lm.new[n - 1].strip()) if 1 <= n <= len(lm.new) else "(none)"


def section(title: str, lines: list[str]) -> list[str]:
    return ["", f"## {title}"] + lines


def summary(results: list[FileResult], groups: dict[str, list[Citation]], applied: bool) -> list[str]:
    done, changed = groups["done"], groups["changed"]
    out = [f"citations found: {sum(len(r.citations) for r in results)} in "
           f"{sum(1 for r in results if r.citations)} files; {'rewritten' if applied else 'to rewrite'}: "
           f"{len(changed)}; unchanged: {len(done) - len(changed)}; left as labelled: {len(groups['left'])}; "
           f"left on lines edited since --since: {len(groups['kept'])}; needs a human: {len(groups['flagged'])}"]
    rows = [f"  {r.path}: {sum(1 for c in r.citations if c in changed)} / {len(r.citations)}"
            for r in results if r.citations]
    return out + section("per file (citations rewritten / found)", rows)


def pin_lines(results: list[FileResult], maps: dict[str, LineMap]) -> list[str]:
    pins = [p for r in results for p in r.pins]
    out = [f"## pinned lines ({len(pins)}; {sum(not p.holds for p in pins)} whose text no longer holds)"]
    for p in pins:
        state = "holds" if p.holds else f"NO LONGER HOLDS: {p.abbr}:{p.mapped.line} is " + new_line_text(
            maps[p.abbr], p.mapped.line)
        why = f" [{p.mapped.reason}]" if p.mapped.flagged else ""
        kept = "  (edited since --since: left)" if p.kept else ""
        out.append(f"  {p.path}:{p.lineno}  ({p.abbr}, {p.old}) -> ({p.abbr}, {p.mapped.line}){why}: "
                   f"{p.text!r} {state}{kept}")
    return [""] + out


def report(results: list[FileResult], maps: dict[str, LineMap], relabel: dict[str, str],
           prose: list[tuple[int, str]], rules_name: str, applied: bool,
           trees: SourceTrees | None = None) -> str:
    cits = [c for r in results for c in r.citations]
    g: dict[str, list[Citation]] = {
        "kept": [c for c in cits if c.kept],
        "left": [c for c in cits if c.label and c.label not in relabel and not c.kept],
        "done": [c for c in cits if not (c.kept or c.label and c.label not in relabel)],
    }
    g["changed"] = [c for c in g["done"] if c.new_text != c.text]
    g["flagged"] = [c for c in g["done"] if c.flagged]
    out = summary(results, g, applied)
    out += section(f"needs a human ({len(g['flagged'])}; {'rewritten to' if applied else 'suggested'}: "
                   "the best guess)", [s for c in g["flagged"] for s in describe(c, maps)])
    out += section(f"on lines edited since --since, left as written ({len(g['kept'])})",
                   [f"  {c.path}:{c.lineno}  {flat(c.text)}  (would be {flat(c.new_text)})" for c in g["kept"]])
    out += section(f"labelled with a release and left as written ({len(g['left'])}; `--relabel OLD=NEW` "
                   "rewrites those labelled OLD)",
                   [f"  {c.path}:{c.lineno}  {c.label} {flat(c.text)}  (would be {flat(c.new_text)}"
                    f"{', needs a human' if c.flagged else ''})" for c in g["left"]])
    out += section(f"relabelled ({sum(1 for c in g['done'] if c.label)})",
                   [f"  {c.path}:{c.lineno}  {c.label} {flat(c.text)}  ->  {relabel[c.label] or '(no label)'} "
                    f"{flat(c.new_text)}" for c in g["done"] if c.label])
    near = [c for c in g["done"] if c.near_release]
    out += section(f"next to a release named in prose ({len(near)}; rewritten: the prose may need a look)",
                   [f"  {c.path}:{c.lineno}  {c.near_release} ({flat(c.text)}  ->  {flat(c.new_text)}"
                    for c in near])
    inner = [c for c in g["done"] if not c.flagged and any(
        f != l and maps[c.abbr].interior_changed(f, l) for (f, l), _ in c.items)]
    short = [c for c in inner if any(l - f < INNER_RANGE_MAX for (f, l), _ in c.items if f != l)]
    out += section(f"ranges whose inside changed between the releases ({len(inner)}, ends mapped exactly; "
                   f"those under {INNER_RANGE_MAX} lines listed: the cited code may have changed)",
                   [f"  {c.path}:{c.lineno}  {flat(c.text)}  ->  {flat(c.new_text)}" for c in short])
    out += pin_lines(results, maps)
    fulls = [(r.path, *f) for r in results for f in r.full_paths if not f[2] or f[2] in relabel]
    out += section(f"citations by file name, not rewritten ({len(fulls)} without a release or labelled "
                   "OLD; those of other releases not listed)",
                   [f"  {p}:{n}  {(lab + ' ') if lab else ''}{t}" + (f"  ->  {trees.suggest(t)}" if trees else "")
                    for p, n, t, lab in fulls])
    out += section(f"prose naming a release in {rules_name} {SECTION}0.1 (edit by hand)",
                   [f"  {rules_name}:{n}: {s}" for n, s in prose])
    return "\n".join(out) + "\n"


# -- the command line -------------------------------------------------------------------------

def repo_files(repo: Path, paths: list[str]) -> list[str]:
    """The .py and .md files to look at: those named, the ones git knows under the folders
    named, or by default every tracked one."""
    names = {p for p in paths if (repo / p).is_file()}
    folders = [p for p in paths if (repo / p).is_dir()]
    if folders or not paths:
        extra = ["--cached", "--others", "--exclude-standard"] if folders else []
        out = subprocess.run(["git", "ls-files", "-z", *extra, "--", *folders], cwd=repo,
                             capture_output=True, check=True).stdout
        names |= {n.decode() for n in out.split(b"\0") if n}
    return sorted(n for n in names if n.endswith((".py", ".md")) and (repo / n).is_file())


def edited_lines(repo: Path, rev: str, name: str) -> set[int]:
    """The lines of `name` (from 1) added or changed since commit `rev`: all of them when
    `rev` lacks the file."""
    if subprocess.run(["git", "cat-file", "-e", f"{rev}:{name}"], cwd=repo, capture_output=True).returncode:
        return set(range(1, (repo / name).read_text(encoding="utf-8").count("\n") + 2))
    diff = subprocess.run(["git", "diff", "-U0", rev, "--", name], cwd=repo, capture_output=True,
                          text=True, check=True).stdout
    lines: set[int] = set()
    for m in re.finditer(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", diff, re.M):
        start = int(m.group(1))
        lines.update(range(start, start + int(m.group(2) or 1)))
    return lines


def load_maps(old_root: Path, new_root: Path, paths: dict[str, str]) -> dict[str, LineMap]:
    missing = [str(root / p) for root in (old_root, new_root) for p in paths.values()
               if not (root / p).is_file()]
    if missing:
        sys.exit("missing source files (unpack them from the release's sdist):\n  " + "\n  ".join(missing))
    return {abbr: LineMap((old_root / p).read_text(encoding="utf-8").splitlines(),
                          (new_root / p).read_text(encoding="utf-8").splitlines())
            for abbr, p in paths.items()}


class SourceTrees:
    """Files of both releases found by the tail of their path (`block_pool.py`,
    `config/vllm.py`), for the citations by file name."""

    def __init__(self, old_root: Path, new_root: Path):
        self.old_root, self.new_root = old_root, new_root
        self._files = sorted(str(p.relative_to(old_root)) for p in old_root.rglob("*.py"))
        self._maps: dict[str, LineMap | None] = {}
        self.found: dict[str, str] = {}  # cited path -> the file it names

    def line_map(self, cited: str) -> LineMap | None:
        """The map of the one file whose path ends with `cited`; None if none or several."""
        if cited not in self._maps:
            found = [f for f in self._files if f == cited or f.endswith("/" + cited)]
            ok = len(found) == 1 and (self.new_root / found[0]).is_file()
            if ok:
                self.found[cited] = found[0]
            self._maps[cited] = LineMap(*(
                (root / found[0]).read_text(encoding="utf-8").splitlines()
                for root in (self.old_root, self.new_root))) if ok else None
        return self._maps[cited]

    def suggest(self, citation: str) -> str:
        """`path:LINE...` re-based, with a mark on the flagged lines; or why not."""
        cited, _, items = citation.partition(":")
        lm = self.line_map(cited)
        if lm is None:
            return "(not found once in the old source tree)"
        c = Citation("", 0, 0, 0, "F", "F:" + items)
        rebase(c, {"F": lm})
        return (cited + c.new_text[1:] + f"  [{self.found[cited]}]"
                + ("  (needs a human)" if c.flagged else ""))


def parse_relabel(values: list[str]) -> dict[str, str]:
    relabel = {}
    for v in values:
        old, sep, new = v.partition("=")
        if not sep or not re.fullmatch(RELEASE, old) or (new and not re.fullmatch(RELEASE, new)):
            raise argparse.ArgumentTypeError(f"--relabel wants OLD=NEW or OLD=, not {v!r}")
        relabel[old] = new
    return relabel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old_root", type=Path, help="the old release's source tree (holds vllm/...)")
    ap.add_argument("new_root", type=Path, help="the new release's source tree")
    ap.add_argument("paths", nargs="*", help="files or folders (default: the tracked .py and .md files)")
    ap.add_argument("--apply", action="store_true", help="rewrite the files (default: only report)")
    ap.add_argument("--report", type=Path, help="write the full report to this file")
    ap.add_argument("--relabel", action="append", default=[], metavar="OLD=NEW",
                    help="rewrite citations labelled OLD (`OLD ABBR:LINE`) and their label to NEW; "
                         "OLD= drops the label")
    ap.add_argument("--since", metavar="REV",
                    help="leave alone the citations on lines added or changed since commit REV (hand "
                         "edits that may already cite the new release); they are listed")
    ap.add_argument("--repo", type=Path, default=Path("."), help="the repository (default: here)")
    ap.add_argument("--rules", default="docs/rules.md", help="the file with the legend, in the repository")
    args = ap.parse_args(argv)
    try:
        relabel = parse_relabel(args.relabel)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=args.repo,
                               capture_output=True, text=True, check=True).stdout.strip())
    rules_text = (repo / args.rules).read_text(encoding="utf-8")
    paths = legend(rules_text)
    if not paths:
        sys.exit(f"no legend rows found in {args.rules}")
    maps = load_maps(args.old_root, args.new_root, paths)
    pattern = citation_pattern(paths)
    if args.since and subprocess.run(["git", "rev-parse", "--verify", "-q", args.since + "^{commit}"],
                                     cwd=repo, capture_output=True).returncode:
        ap.error(f"--since: no commit {args.since!r}")
    given = [str(Path(p).resolve().relative_to(repo)) for p in args.paths]
    results = []
    for name in repo_files(repo, given):
        edited = edited_lines(repo, args.since, name) if args.since else set()
        r = process(name, (repo / name).read_text(encoding="utf-8"), pattern, maps, relabel, edited)
        results.append(r)
        if args.apply and r.new_text != (repo / name).read_text(encoding="utf-8"):
            (repo / name).write_text(r.new_text, encoding="utf-8")
    text = report(results, maps, relabel, legend_prose(rules_text), args.rules, args.apply,
                  SourceTrees(args.old_root, args.new_root))
    if args.report:
        args.report.write_text(text, encoding="utf-8")
        head = text.split("\n## on lines edited")[0]
        print(head + f"\n(full report: {args.report})")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
