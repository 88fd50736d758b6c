"""The mutation score of the spec against the proofs' agreement tests, from a
mutmut run's results (scripts/mutation-score.sh runs mutmut, then this).

Reads mutmut's per-file result files under `mutants/` and prints, per mutated
file, how many mutants were killed, survived, timed out, had no test that
reaches them, and how many are not run yet; then every mutant that was not
killed, with the source line it changes (old -> new), grouped by function, so
that each survivor can be classified (proofs/README.md "Mutation score").

    python scripts/mutation_report.py [--root DIR] [--sample FILE] [--json]
    python scripts/mutation_report.py [--root DIR] --draw N [--seed S]

With `--sample FILE` (mutant names, one per line: a uniform random sample of
the mutants no other run had checked), the score is also estimated for all the
mutants: the ones checked outside the sample count as they are, the unchecked
rest by the sample's kill rate, with a 95 % Wilson interval.  `--draw N`
prints such a sample: N names drawn uniformly from the mutants that count and
no run has checked (run them with `mutmut run NAME ...`, in batches of a
shuffled sample if the run may be cut short: a batch is itself uniform, the
mutants mutmut reaches first in a cut batch are not).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import math
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

# mutmut's exit codes (mutmut/stats.py status_by_exit_code, mutmut 3.8): read
# from mutmut when it is installed, so the two never drift apart.
try:
    from mutmut.stats import status_by_exit_code as STATUS
except ImportError:  # the report alone, without mutmut: its table as of 3.8
    STATUS = {1: "killed", 3: "killed", -24: "timeout", 24: "timeout", 0: "survived", 5: "no tests",
              2: "check was interrupted by user", None: "not checked", 33: "no tests", 34: "skipped",
              35: "suspicious", 36: "timeout", 37: "caught by type check", -11: "segfault", -9: "segfault"}

ORDER = ("killed", "caught by type check", "timeout", "survived", "error text", "no tests", "not checked")
SHORT = {"caught by type check": "typecheck", "no tests": "no test", "not checked": "not run"}


def functions(source: str) -> dict[str, str]:
    """Every function and method in a mutmut-generated file, by name, as source."""
    # By line numbers on one split of the source: ast.get_source_segment splits
    # the whole file on every call, hours on a file of thousands of mutants.
    tree = ast.parse(source)
    lines = source.splitlines()
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = "\n".join(lines[node.lineno - 1:node.end_lineno])
    return out


def change(funcs: dict[str, str], key: str) -> str:
    """The lines mutant `key` (module.function__mutmut_N) changes, as `old -> new`."""
    name = key.rsplit(".", 1)[-1]
    base = name.rsplit("__mutmut_", 1)[0]
    orig, mutant = funcs.get(base + "__mutmut_orig"), funcs.get(name)
    if orig is None or mutant is None:
        return "?"
    # the def lines name the function differently; compare them under one name
    a, b = orig.splitlines(), mutant.replace(name, base + "__mutmut_orig", 1).splitlines()
    old, new = [], []
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (old if line.startswith("-") else new).append(line[1:].strip())
    return " / ".join(old) + "  ->  " + " / ".join(new)


# A mutant that changes nothing but the text or field name of an error it raises
# (every line it changes is a `raise`, a `fail(` or a string literal): the
# agreement tests compare scheduling, not messages (tests/test_input_fuzz.py and
# tests/test_versions.py read those).  Counted apart, never as killed.
ERROR_TEXT = ("raise ", "fail(", '"', "f\"", "'", "f'")


def is_error_text(change_text: str) -> bool:
    old = change_text.split("  ->  ", 1)[0]
    return bool(old) and all(part.startswith(ERROR_TEXT) for part in old.split(" / "))


# Merging runs (several --root): a mutant killed in any run is killed; else
# the first verdict of survived, then no tests, then not run.
RANK = {"killed": 0, "caught by type check": 0, "timeout": 0, "survived": 1, "no tests": 2, "not checked": 3}


def merged_status(codes: list) -> str:
    statuses = [STATUS.get(code, f"exit {code}") for code in codes]
    return min(statuses, key=lambda st: RANK.get(st, 1))


# What a mutant that was not killed changes, by the feature of the spec its
# line or function belongs to: the features the proofs' encodings leave out
# (proofs/README.md "Scope") cannot be tied by an agreement test, so
# their mutants are counted apart from the ones the encodings model.  First
# match wins; a keyword is looked for in the changed lines and the function name.
FEATURES = (
    ("prefix caching", ("block_pool.", "hits", "hit_blocks", "block_hashes", "cache_blocks", "skip_reading_prefix_cache",
                        "enable_prefix_caching", "get_computed_blocks", "num_evictable")),
    ("speculative decoding", ("draft", "spec_token", "num_speculative", "lookahead", "prefill_scheduled",
                              "pads_new_decode", "spec_decode")),
    ("async scheduling", ("placeholder", "in_flight", "stale", "async_scheduling", "is_prefill_chunk")),
    ("pause", ("pause_state", "PAUSED")),
    ("structured output, LoRA", ("grammar", "lora", "structured_output")),
    # Features added after the encodings (docs/rules.md §18, §19 and §20): no encoding states them.
    ("KV connector", ("kv_connector", "REMOTE_KVS", "remote_kv", "requires_kv_delivery", "hold_loading",
                      "loads_finished", "finished_recving", "kv_sends")),
    ("prefill throttling", ("prefill_throttle", "throttle_prefills", "prefill_cadence", "prefill_schedule_interval",
                            "_adaptive")),
    ("encoder inputs", ("encoder", "mm_features", "mm_hash")),
    # the type checks of config values (a scenario file's; the encodings' configs are integers)
    ("config file parsing", ("config_from_dict", "x__is_int")),
    ("error reporting", ("excerpt", "ConfigError", "field_path", "raise ValueError")),
)


# Mutants whose line names no feature but that change behaviour only with one:
# the feature and why (proofs/README.md "Mutation score").
FEATURE_OF = {
    "schedspec.spec.scheduler.x_append_output_tokens__mutmut_20":
        ("KV connector", "a stopped request's status left None: every finished request is removed at once "
                         "but one a KV producer holds for its send"),
    "schedspec.spec.kv_cache.x_allocate_slots__mutmut_73":
        ("KV connector", "the blocks an asynchronous KV load reserves added to the free ones instead of "
                         "subtracted: reserved_blocks is 0 but for such a load"),
    "schedspec.spec.scheduler.x_deliver_output__mutmut_29":
        ("speculative decoding", "tokens past a stop discarded: more than one token is delivered at once only "
                                 "with accepted drafts"),
    "schedspec.spec.scheduler.x_append_output_tokens__mutmut_21":
        ("prefix caching", "a stopped request's discarded count: the request is removed at once, so only the "
                           "blocks its delivery caches before (prefix caching) can show it"),
    "schedspec.spec.scheduler.x_admit__mutmut_23":
        ("KV connector", "external tokens asked for a request that reads no cached prefix: nonzero only for "
                         "a request with kv_connector_tokens"),
    "schedspec.spec.scheduler.x_enqueue__mutmut_17":
        ("KV connector", "a PRIORITY insertion searched to the queue's end: the span ends before it only "
                         "for the KV holders' queue (kv_connector.queue_span)"),
}


def feature(mutant: str, change_text: str) -> str:
    """The feature the mutant's changed line names, else the one its function's
    name names (a line of the stale-output delivery that frees encoder inputs is
    an encoder-input mutant), else "modelled"; FEATURE_OF first."""
    if mutant in FEATURE_OF:
        return FEATURE_OF[mutant][0]
    # The default field prefix of a validator's errors: before the features, as its
    # def line also names the function (validate_spec_decode names a feature).
    if "where: str = " in change_text:
        return "error reporting"
    # ... and a call that hands a validator another prefix (`where` dropped or None):
    # `where` reaches nothing but the field names of ConfigError.
    old, _, new = change_text.partition("  ->  ")
    if "where)" in old and new in (old.replace("where)", ")"), old.replace("where)", "None)")):
        return "error reporting"
    for where in (change_text, mutant):
        for name, keys in FEATURES:
            if any(k in where for k in keys):
                return name
    return "modelled"


# Survivors shown equivalent by hand: no input of the agreement tests, or of vLLM,
# tells them from the rules (proofs/README.md "Mutation score" gives the
# argument for each).  They leave the "non-equivalent" score's denominator.
EQUIVALENT = {
    "schedspec.spec.scheduler.x_add_request__mutmut_15": "front=None for front=False: enqueue only tests it for truth",
    "schedspec.spec.scheduler.x_num_new_tokens_running__mutmut_10":
        "0 < threshold <= n: capping n at n when they are equal changes nothing",
    "schedspec.spec.scheduler.x_update_from_output__mutmut_18":
        "continue -> break for the output of a request finished meanwhile: it is the last one of its batch "
        "that the loop reaches with anything to do",
    "schedspec.spec.scheduler.x_update_after_schedule__mutmut_13":
        "is_prefill_chunk by num_tokens - placeholders: a request holding placeholders has computed "
        "num_tokens + placeholders - 1, so any grant reaches both bounds; with none they are equal",
    "schedspec.spec.scheduler.x_schedule__mutmut_16":
        "the S:1704-1705 assertion weakened: both budgets stay >= 0 in every step (token_budget_respected), "
        "so neither form fires",
    "schedspec.spec.scheduler.x_schedule_running__mutmut_6":
        "the running loop goes on at an input budget equal to the drafter rows: every request then gets "
        "cap 2 = 0 and is skipped, which changes nothing",
    "schedspec.spec.kv_cache.x_allocate_slots__mutmut_8":
        "the guard that refuses 0 new tokens without hits or external tokens moved to < 0: no caller asks "
        "for 0 that way (the running loop skips n = 0, an admission returns before a 0 chunk, an async KV "
        "load passes 0 only with external tokens), and a negative count raises in both forms",
    "schedspec.spec.scheduler.x_remove_finished__mutmut_3":
        "the encoder references freed for every finished request, not only when some exist: freeing a "
        "request without references does nothing",
    "schedspec.spec.scheduler.x_blocks_to_allocate__mutmut_31":
        "the evictable hit blocks counted when there are no hits too: both pool views count 0 of no blocks "
        "(BlockCountsWork.num_evictable, PoolWork.num_evictable)",
}

ASIDE = ("error reporting", "config file parsing")


def counted(status: str, feature_name: str, change_text: str) -> bool:
    """Does the mutant count in the score that measures the tie (error text, error
    reporting and file parsing aside)?  Decided from its line, so for an unchecked
    mutant too."""
    return status != "error text" and feature_name not in ASIDE and not is_error_text(change_text)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def sample_estimate(mutants: list[dict], sample: set[str]) -> dict:
    """The score over every counted mutant: those checked outside the sample as they
    are, the others (none checked but the sample's) at the sample's kill rate.
    Equivalent survivors (EQUIVALENT) leave both numerator and denominator."""
    def is_killed(m):
        return m["status"] in ("killed", "caught by type check", "timeout")

    def is_known(m):  # checked, and not as part of the sample
        return m["mutant"] not in sample and m["status"] != "not checked"

    pool = [m for m in mutants if m["counted"] and m["mutant"] not in EQUIVALENT]
    known = [m for m in pool if is_known(m)]
    rest = [m for m in pool if not is_known(m)]
    drawn = [m for m in rest if m["mutant"] in sample and m["status"] != "not checked"]
    if not drawn:
        raise SystemExit("mutation_report: --sample names no checked mutant")
    k_known = sum(map(is_killed, known))
    k_drawn = sum(map(is_killed, drawn))
    lo, hi = wilson(k_drawn, len(drawn))
    total = len(known) + len(rest)
    return {"checked_outside_sample": len(known), "killed_outside_sample": k_known,
            "unchecked_population": len(rest), "sample_checked": len(drawn), "sample_killed": k_drawn,
            "estimate": (k_known + k_drawn / len(drawn) * len(rest)) / total,
            "low": (k_known + lo * len(rest)) / total, "high": (k_known + hi * len(rest)) / total,
            "equivalent_left_out": sorted(m["mutant"] for m in mutants if m["mutant"] in EQUIVALENT)}


def report(roots: list[Path], sample: set[str] | None = None) -> dict:
    metas = sorted((roots[0] / "mutants").rglob("*.py.meta"))
    if not metas:
        raise SystemExit(f"mutation_report: no mutmut results under {roots[0] / 'mutants'}; "
                         "run scripts/mutation-score.sh first")
    files, survivors, killed_by_feature, everything = {}, [], Counter(), []
    for meta in metas:
        rel = meta.relative_to(roots[0] / "mutants").with_suffix("")  # .py
        runs = [json.loads(m.read_text())["exit_code_by_key"]
                for m in (root / "mutants" / meta.relative_to(roots[0] / "mutants") for root in roots) if m.exists()]
        funcs = functions((roots[0] / "mutants" / rel).read_text())
        counts: Counter = Counter()
        for key in runs[0]:
            status = merged_status([run.get(key) for run in runs])
            text = change(funcs, key)
            if status == "survived" and is_error_text(text):
                status = "error text"
            name = "error reporting" if status == "error text" else feature(key, text)
            if status in ("killed", "caught by type check", "timeout"):
                killed_by_feature[name] += 1
            if status not in ("killed", "caught by type check"):
                survivors.append({"file": str(rel), "mutant": key, "status": status, "change": text,
                                  "feature": name})
            counts[status] += 1
            everything.append({"mutant": key, "status": status, "counted": counted(status, name, text)})
        files[str(rel)] = dict(counts)
    out = {"files": files, "not_killed": survivors, "killed_by_feature": dict(killed_by_feature),
           "unchecked_counted": sorted(m["mutant"] for m in everything
                                       if m["counted"] and m["status"] == "not checked")}
    if sample is not None:
        out["sample"] = sample_estimate(everything, sample)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", action="append", default=None,
                    help="the folder mutmut ran in (holds mutants/; default .); repeat it to merge runs of the "
                         "same source with different test selections")
    ap.add_argument("--sample", type=Path, default=None,
                    help="a file of mutant names, one per line: a uniform random sample of the mutants the "
                         "other runs left unchecked; estimates the score over all of them")
    ap.add_argument("--draw", type=int, default=None, metavar="N",
                    help="print N mutant names drawn uniformly from the unchecked mutants that count, and stop")
    ap.add_argument("--seed", type=int, default=0, help="the seed of --draw (default 0)")
    ap.add_argument("--json", action="store_true", help="the report as JSON")
    args = ap.parse_args(argv)
    if args.draw is not None and args.draw < 1:
        raise SystemExit(f"mutation_report: --draw: {args.draw} is not a positive number of mutants")
    sample = None
    if args.sample is not None:
        try:
            sample = {line.strip() for line in args.sample.read_text().splitlines() if line.strip()}
        except OSError as e:
            raise SystemExit(f"mutation_report: --sample {args.sample}: {e.strerror}")
    rep = report([Path(r) for r in (args.root or ["."])], sample)
    if args.draw is not None:
        pool = rep["unchecked_counted"]
        for name in sorted(random.Random(args.seed).sample(pool, min(args.draw, len(pool)))):
            print(name)
        return 0
    if args.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
        return 0
    cols = list(ORDER) + sorted({s for c in rep["files"].values() for s in c} - set(ORDER))
    print(f"{'file':36}" + "".join(f"{SHORT.get(c, c):>11}" for c in cols) + f"{'total':>8}")
    total: Counter = Counter()
    for f, c in rep["files"].items():
        total.update(c)
        print(f"{f:36}" + "".join(f"{c.get(k, 0):>11}" for k in cols) + f"{sum(c.values()):>8}")
    print(f"{'all':36}" + "".join(f"{total.get(k, 0):>11}" for k in cols) + f"{sum(total.values()):>8}")
    killed = total["killed"] + total["caught by type check"] + total["timeout"]
    run = killed + total["survived"]
    if run:
        print(f"killed (timeouts included) / run: {killed} / {run} = {100 * killed / run:.1f} %")
    by_feature: Counter = Counter((s["feature"], s["status"]) for s in rep["not_killed"]
                                  if s["status"] in ("survived", "no tests", "error text"))
    if by_feature:
        print("\nnot killed, by the feature the mutant changes (survived / error text / no test):")
        for name in [f for f, _ in FEATURES] + ["modelled"]:
            row = [by_feature.get((name, st), 0) for st in ("survived", "error text", "no tests")]
            if any(row):
                print(f"  {name:28} {row[0]:>5} {row[1]:>5} {row[2]:>5}")
        modelled = by_feature.get(("modelled", "survived"), 0)
        print(f"killed / (killed + survivors in what the encodings model): {killed} / {killed + modelled}"
              f" = {100 * killed / max(1, killed + modelled):.1f} %")
        # Every mutant left alive or unreached counts against the tie but the error
        # text and the file parsing, which no encoding states; equivalent mutants
        # are taken out by hand (proofs/README.md lists them).
        against = sum(n for (name, st), n in by_feature.items() if st in ("survived", "no tests") and name not in ASIDE)
        tied = sum(n for name, n in rep["killed_by_feature"].items() if name not in ASIDE)
        print(f"leaving error reporting and file parsing aside, killed / (killed + every survivor and unreached "
              f"mutant, equivalents included): {tied} / {tied + against} = {100 * tied / max(1, tied + against):.1f} %")
    if "sample" in rep:
        s = rep["sample"]
        print(f"\nestimate over every mutant (error reporting and file parsing aside, {len(s['equivalent_left_out'])} "
              f"equivalent left out): {s['killed_outside_sample']} killed of {s['checked_outside_sample']} checked "
              f"outside the sample; the other {s['unchecked_population']} at the sample's rate, "
              f"{s['sample_killed']} / {s['sample_checked']}: {100 * s['estimate']:.1f} % "
              f"(95 % interval {100 * s['low']:.1f} - {100 * s['high']:.1f} %)")
    by_func = defaultdict(list)
    untested: Counter = Counter()
    for s in rep["not_killed"]:
        func = s["mutant"].rsplit("__mutmut_", 1)[0]
        if s["status"] == "no tests":
            untested[func] += 1
        elif s["status"] != "not checked":
            by_func[func].append(s)
    if untested:
        print("\nno agreement test reaches (mutants):")
        for func, n in untested.most_common():
            print(f"  {n:>4}  {func}")
    for func, items in by_func.items():
        print(f"\n{func}")
        for s in items:
            print(f"  {s['mutant'].rsplit('__mutmut_', 1)[1]:>4} {s['status']:<10} {s['feature']:<22} {s['change']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
