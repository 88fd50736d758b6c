"""The table of `schedspec peer-tests`: per test file, from the pytest plugin's
reports of the plain and the shadowed runs (schedspec.monitor.pytest_plugin),
as a dict (written as JSON by --json-out) and as text.

    build_table(plain, shadow)    the per-file table, the divergences, the failures
    format_table(table)           the table as text
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from schedspec.reference.errors import shown

from .peer_extract import TEST_ROOT
from .peer_fetch import VLLM_VERSION

TABLE_FORMAT = "schedspec.peer-tests/1"

CALL_NAMES = ("schedule", "update_from_output", "add_request", "finish_requests")


def _file_of(nodeid: str, test_root: str = TEST_ROOT) -> str:
    path = nodeid.split("::", 1)[0]
    return path.removeprefix(test_root + "/")


def outcome_of(report: Mapping[str, Any] | None, nodeid: str) -> str | None:
    if report is None:
        return None
    entry = report.get("tests", {}).get(nodeid)
    return entry.get("outcome") if isinstance(entry, Mapping) else None


def _blank_row(name: str) -> dict[str, Any]:
    return {"file": name, "collected": 0,
            "plain": {"passed": 0, "failed": 0, "error": 0, "skipped": 0},
            "shadow": {"passed": 0, "failed": 0, "error": 0, "skipped": 0},
            "calls": {c: {"total": 0, "checked": 0, "outside_scope": 0} for c in CALL_NAMES},
            "calls_total": 0, "calls_checked": 0, "outside_scope": {}, "divergences": 0,
            "divergences_not_counted": 0, "monitor_errors": 0, "plain_pass_shadow_fail": 0}


def _add_stats(row: dict[str, Any], stats: Mapping[str, Any]) -> None:
    for name, counts in (stats.get("calls") or {}).items():
        slot = row["calls"].setdefault(name, {"total": 0, "checked": 0, "outside_scope": 0})
        for key in ("total", "checked", "outside_scope"):
            slot[key] = slot.get(key, 0) + int((counts or {}).get(key, 0) or 0)
    outside = Counter(row["outside_scope"])
    outside.update({k: int(v) for k, v in (stats.get("outside_scope") or {}).items()})
    row["outside_scope"] = dict(sorted(outside.items()))
    row["calls_total"] = sum(c.get("total", 0) for c in row["calls"].values())
    row["calls_checked"] = sum(c.get("checked", 0) for c in row["calls"].values())


def build_table(plain: Mapping[str, Any] | None, shadow: Mapping[str, Any] | None,
                test_root: str = TEST_ROOT, version: str = VLLM_VERSION) -> dict[str, Any]:
    """The per-file table from the plugin's reports (either may be None).

    A test that fails plain is vLLM's test failing on this machine: it is listed
    with its message and nothing it did under the monitor counts against the
    spec.  A test that passes plain and not shadowed, and a divergence in a
    test that passes plain, make the run fail (exit_status 1)."""
    plain_tests = dict((plain or {}).get("tests", {}))
    shadow_tests = dict((shadow or {}).get("tests", {}))
    ids = sorted(set(plain_tests) | set(shadow_tests))
    rows: dict[str, dict[str, Any]] = {}
    plain_failures, pass_fail, divergences, monitor_errors = [], [], [], []
    for nodeid in ids:
        row = rows.setdefault(_file_of(nodeid, test_root), _blank_row(_file_of(nodeid, test_root)))
        row["collected"] += 1
        p_out, s_out = outcome_of(plain, nodeid), outcome_of(shadow, nodeid)
        if plain is not None and p_out in row["plain"]:
            row["plain"][p_out] += 1
        if shadow is not None and s_out in row["shadow"]:
            row["shadow"][s_out] += 1
        if plain is not None and p_out in ("failed", "error"):
            plain_failures.append({"test": nodeid, "outcome": p_out,
                                   "message": plain_tests[nodeid].get("message"),
                                   "missing_modules": list(plain_tests[nodeid].get("missing_modules") or [])})
        counted = plain is None or p_out == "passed"
        if plain is not None and shadow is not None and p_out == "passed" and s_out != "passed":
            row["plain_pass_shadow_fail"] += 1
            entry = shadow_tests.get(nodeid) or {}
            pass_fail.append({"test": nodeid, "outcome": s_out or "not run", "message": entry.get("message")})
        stats = (shadow_tests.get(nodeid) or {}).get("stats")
        if not isinstance(stats, Mapping):
            continue
        _add_stats(row, stats)
        for d in stats.get("divergences") or []:
            divergences.append({"test": nodeid, "counted": counted, **dict(d)})
            row["divergences" if counted else "divergences_not_counted"] += 1
        for e in stats.get("monitor_errors") or []:
            monitor_errors.append({"test": nodeid, **dict(e)})
            row["monitor_errors"] += 1
    files = [rows[k] for k in sorted(rows)]
    totals = _blank_row("total")
    for row in files:
        totals["collected"] += row["collected"]
        for mode in ("plain", "shadow"):
            for k, v in row[mode].items():
                totals[mode][k] += v
        _add_stats(totals, {"calls": row["calls"], "outside_scope": row["outside_scope"]})
        for k in ("divergences", "divergences_not_counted", "monitor_errors", "plain_pass_shadow_fail"):
            totals[k] += row[k]
    # Grouped by the message; the modules any of a group's outputs names (vLLM
    # logs a failed model inspection once, in the first test that hits it).
    causes = Counter(first_line(f["message"]) for f in plain_failures)
    modules: dict[str, set[str]] = {}
    for f in plain_failures:
        modules.setdefault(first_line(f["message"]), set()).update(f["missing_modules"])
    bad = any(d["counted"] for d in divergences) or bool(pass_fail)
    return {"format": TABLE_FORMAT, "vllm": version, "test_root": test_root,
            "modes": [m for m, r in (("plain", plain), ("shadow", shadow)) if r is not None],
            "files": files, "totals": totals,
            "divergences": divergences, "plain_pass_shadow_fail": pass_fail,
            "monitor_errors": monitor_errors, "plain_failures": plain_failures,
            "plain_failure_causes": [{"cause": _cause(c, sorted(modules[c])), "tests": n}
                                     for c, n in causes.most_common()],
            "exit_status": 1 if bad else 0}


def _cause(message: str | None, missing_modules: Sequence[str] = ()) -> str:
    """A failure message cut to what tells failures apart: its first line (for
    pydantic's "1 validation error for X", the error's own line), and the
    modules its output says are not installed."""
    cause = first_line(message)
    if missing_modules:
        cause += f" (not installed: {', '.join(missing_modules)})"
    return cause


def first_line(message: str | None) -> str:
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    line = lines[0]
    head, sep, model = line.rpartition(" validation error for ")
    if not sep:
        head, sep, model = line.rpartition(" validation errors for ")
    if sep and len(lines) > 1:
        line = f"{head.split(':')[0].rsplit('.', 1)[-1]} ({model}): {lines[1]}"
    for cut in (" [type=", ", input_value="):
        line = line.split(cut)[0]
    return line[:240]


def format_table(table: Mapping[str, Any], vectors_dir: str | None = None) -> str:
    """The table as text, for a terminal."""
    modes = table.get("modes", [])
    has_plain, has_shadow = "plain" in modes, "shadow" in modes
    rows = [*table["files"], table["totals"]]
    width = max([len("file"), *(len(r["file"]) for r in rows)])
    head = f"{'file':<{width}}  {'tests':>5}"
    if has_plain:
        head += f"  {'plain: pass':>11} {'fail':>5} {'skip':>5}"
    if has_shadow:
        head += f"  {'shadow: pass':>12} {'calls checked/total':>20} {'outside':>8} {'diverg.':>7} {'mon.err':>7}"
        if has_plain:
            head += f" {'pass->fail':>10}"
    lines = [f"vLLM {table.get('vllm', VLLM_VERSION)}'s {table.get('test_root', TEST_ROOT)} tests on this machine"
             + (" (plain: without the monitor; shadow: every scheduler call checked against the spec)"
                if has_shadow else " (plain: without the monitor)"), head, "-" * len(head)]
    for r in rows:
        if r is table["totals"]:
            lines.append("-" * len(head))
        line = f"{shown(r['file'], 60):<{width}}  {r['collected']:>5}"
        if has_plain:
            p = r["plain"]
            line += f"  {p['passed']:>11} {p['failed'] + p['error']:>5} {p['skipped']:>5}"
        if has_shadow:
            s = r["shadow"]
            outside = sum(c.get("outside_scope", 0) for c in r["calls"].values())
            line += (f"  {s['passed']:>12} {str(r['calls_checked']) + '/' + str(r['calls_total']):>20} "
                     f"{outside:>8} {r['divergences']:>7} {r['monitor_errors']:>7}")
            if has_plain:
                line += f" {r['plain_pass_shadow_fail']:>10}"
        lines.append(line)
    totals = table["totals"]
    if has_shadow:
        calls = ", ".join(f"{name} {c.get('checked', 0)}/{c.get('total', 0)}"
                          for name, c in totals["calls"].items())
        lines.append(f"\nscheduler calls checked/made: {calls or 'none'}")
        # Cut only what no feature name of scope.py reaches (the longest is 47 characters).
        features = ", ".join(f"{shown(k, 60)} {v}" for k, v in totals["outside_scope"].items())
        lines.append(f"calls outside the spec's scope, by feature: {features or 'none'}")
    divs = table.get("divergences", [])
    if divs:
        lines.append(f"\ndivergences ({sum(d['counted'] for d in divs)} counted):")
        for d in divs:
            where = f"{d.get('call', '?')} #{d.get('call_number', '?')}"
            field_ = f" field {shown(d.get('field'), 60)}" if d.get("field") else ""
            vector = f"; state vector {shown(d.get('vector'), 300)}" if d.get("vector") else ""
            note = "" if d["counted"] else " (test fails plain: not counted)"
            lines.append(f"  {shown(d['test'], 160)}  {where}{field_}{vector}{note}")
    if table.get("plain_pass_shadow_fail"):
        lines.append("\npassed plain, not under the monitor (failures of this run):")
        for t in table["plain_pass_shadow_fail"]:
            msg = f": {shown(_cause(t.get('message')), 160)}" if t.get("message") else ""
            lines.append(f"  {shown(t['test'], 160)}  {t['outcome']}{msg}")
    if table.get("monitor_errors"):
        lines.append(f"\nmonitor errors ({len(table['monitor_errors'])}):")
        for e in table["monitor_errors"][:20]:
            lines.append(f"  {shown(e['test'], 160)}  {e.get('call', '?')} #{e.get('call_number', '?')}: "
                         f"{shown(e.get('error'), 160)}")
        if len(table["monitor_errors"]) > 20:
            lines.append(f"  ... {len(table['monitor_errors']) - 20} more (--json-out lists them all)")
    if table.get("plain_failures"):
        lines.append(f"\nfailing plain, on vLLM alone ({len(table['plain_failures'])} tests; not counted "
                     "against the spec), by cause:")
        for c in table["plain_failure_causes"]:
            lines.append(f"  {c['tests']:>4}  {shown(c['cause'], 240)}")
    if has_shadow:
        verdict = ("FAIL: " + ", ".join(x for x in (
            f"{totals['divergences']} divergences" if totals["divergences"] else "",
            f"{totals['plain_pass_shadow_fail']} tests pass plain and fail shadowed"
            if totals["plain_pass_shadow_fail"] else "") if x)) if table["exit_status"] else \
            "ok: no divergence, and every test that passes plain passes under the monitor"
        lines.append(f"\n{verdict}")
    return "\n".join(lines)


__all__ = ["CALL_NAMES", "TABLE_FORMAT", "build_table", "first_line", "format_table", "outcome_of"]
