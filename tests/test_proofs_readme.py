"""proofs/README.md's obligation table lists exactly the obligations
`schedspec prove` discharges, each once, with the kind and bad variants the
registry gives it, and its count is the registry's."""

from __future__ import annotations

import re
from pathlib import Path

from schedspec.proofs.obligations import build_obligations
from schedspec.proofs.release import DEFAULT

README = Path(__file__).resolve().parent.parent / "proofs" / "README.md"


def table_rows() -> list[list[str]]:
    """The rows of the table under the '| obligation | kind |' header."""
    lines = README.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r"\|\s*obligation\s*\|\s*kind\s*\|", l))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def test_table_lists_every_obligation_once():
    obligations = {o.name: o for o in build_obligations(DEFAULT)}
    rows = table_rows()
    names = [re.fullmatch(r"`([^`]+)`", r[0]).group(1) for r in rows]
    assert len(names) == len(set(names)), "an obligation is listed twice"
    assert set(names) == set(obligations), (set(obligations) - set(names), set(names) - set(obligations))
    for row, name in zip(rows, names):
        o = obligations[name]
        assert row[1] == o.kind, (name, row[1], o.kind)
        listed = set(re.findall(r"`([^`]+)`", row[2]))
        assert listed == set(o.bad_variants), (name, listed, o.bad_variants)
    text = README.read_text()
    m = re.search(r"\*\*(\d+) obligations\*\*", text)
    assert m and int(m.group(1)) == len(obligations), "the count stated in the README is not the registry's"
