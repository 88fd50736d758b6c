"""`schedspec prove`: discharge every proof obligation with z3.

    schedspec prove [--json] [--only NAME] [--bound N] [-o DIR] [--timeout S] [--vllm-version X]

Per obligation: the claim on the spec's rules (expected: proved), a reachable
witness of its premises written as a scenario file to DIR (default
./proofs-out), and the claim on each of its bad rule variants (expected:
refuted).  Exit 0 only when all of that holds; 1 otherwise; 2 on a user error.
z3 `unknown` (a timeout) is a failure.

`--vllm-version X` proves the rules and config checks of release X
(proofs/release.py).  A property X violates is a vLLM bug the proofs show: its
obligations are expected refuted there, and the row names the scenario that
shows it on the real release.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from schedspec.reference.errors import UsageError, shown

from schedspec.reference.progress import Progress

from .args import float_arg, int_arg

from .vllm_version import add_vllm_version_argument

WITNESS_MARK = "z3 bounded-model-checking witness"


def _witness_path(outdir: Path, name: str) -> Path:
    """DIR/<name>.json; an existing file is replaced only if schedspec wrote it as a
    witness, else a fresh name is chosen."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")
    p = outdir / f"{stem}.json"
    k = 1
    while p.exists():
        try:
            prior = json.loads(p.read_text())
            ours = isinstance(prior, dict) and str(prior.get("description", "")).startswith(WITNESS_MARK)
        except (OSError, ValueError):
            ours = False
        if ours:
            return p
        p = outdir / f"{stem}-{k}.json"
        k += 1
    return p


def run_obligation(o, outdir: Path) -> dict[str, Any]:
    from schedspec.reference.scenario import Scenario, save_scenario

    from schedspec.proofs.solving import RETRIES

    t0 = time.perf_counter()
    retries0 = RETRIES["calls"]
    res = o.discharge("correct")
    row: dict[str, Any] = {"name": o.name, "property": o.property, "kind": o.kind, "bound": str(o.bound),
                           "expected": o.expected, "result": res.status, "proof_seconds": round(res.seconds, 2)}
    if res.status == "refuted" and res.model is not None:
        row["counterexample"] = res.model
    if o.extra.get("finding"):
        row["finding"] = o.extra["finding"]
    if res.status == "unknown":
        row["detail"] = res.detail
    wres, scenario = o.witness()
    row["witness_result"] = wres.status
    row["witness"] = None
    if wres.status == "proved" and isinstance(scenario, Scenario):
        path = _witness_path(outdir, o.name)
        save_scenario(scenario, path, overwrite=path.exists())
        row["witness"] = str(path)
        row["witness_step"] = (wres.model or {}).get("step")
    elif wres.status == "proved" and isinstance(scenario, (str, Path)) and Path(scenario).exists():
        row["witness"] = str(scenario)
    else:
        row["witness_detail"] = wres.detail
    bad = {}
    for v in o.bad_variants:
        r = o.discharge(v)
        bad[v] = r.status
    row["bad_variants"] = bad
    row["seconds"] = round(time.perf_counter() - t0, 2)
    # z3 calls that came back unknown and were retried with a longer timeout
    row["retries"] = RETRIES["calls"] - retries0
    row["ok"] = bool(res.status == o.expected and row["witness"]
                     and o.bad_variants and all(s == "refuted" for s in bad.values()))
    return row


def _work(task: tuple[int, int | None, float, str, str]) -> dict[str, Any]:
    """One obligation in a worker process: z3 terms do not cross processes, so
    each worker builds the obligations itself and runs the one it is given."""
    from schedspec.proofs.obligations import build_obligations
    from schedspec.proofs.release import Release

    index, bound, timeout, outdir, version = task
    return run_obligation(build_obligations(Release(version), bound, timeout)[index], Path(outdir))


def _rows(obligations, outdir: Path, jobs: int, release, bound, timeout):
    """The rows in the obligations' order, computed `jobs` at a time."""
    if jobs <= 1:
        for o in obligations:
            yield run_obligation(o, outdir)
        return
    import multiprocessing

    from schedspec.proofs.obligations import build_obligations

    index = {o.name: i for i, o in enumerate(build_obligations(release, bound, timeout))}
    tasks = [(index[o.name], bound, timeout, str(outdir), release.version) for o in obligations]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        # The slowest first, so that no core is left with a long one at the end;
        # the rows still come out in the obligations' order.
        order = sorted(range(len(tasks)), key=lambda i: -_SLOW.get(obligations[i].name, 0))
        pending = {i: pool.apply_async(_work, (tasks[i],)) for i in order}
        for i in range(len(tasks)):
            yield pending[i].get()


# Proof seconds measured at the default bounds (proofs/README.md): only the order
# of the work depends on them.
_SLOW = {"inductive:schedule+update": 67, "step:computed_tokens_bounded": 22, "step:kv_blocks_conserved": 22,
         "step:preemption_only_on_allocation_failure": 9, "step:preempted_restart_from_zero": 7,
         "step:token_budget_respected": 7}


def _chosen(obligations, names: list[str], not_encoded) -> list:
    """The obligations `--only` names (by obligation or property name), in the
    run's order; a name that matches none is a usage error."""
    for name in names:
        if any(name in (o.name, o.property) for o in obligations):
            continue
        if name in not_encoded:
            raise UsageError(f"--only {name}: not encoded (a property of "
                             f"{' and '.join(not_encoded[name])}, which the encoding models off); "
                             "`schedspec check` and `schedspec diff` judge it")
        raise UsageError(f"--only {shown(name)}: no obligation or property of that name; known: "
                         + ", ".join(o.name for o in obligations))
    return [o for o in obligations if o.name in names or o.property in names]


def cmd_prove(args) -> int:
    # The numeric flags are checked by their argparse types (register below).
    from schedspec.reference.outputs import check_output_dir

    outdir = check_output_dir(args.out, "-o")
    from schedspec.proofs.obligations import build_obligations, outside_encoding, shared_builds
    from schedspec.proofs.release import Release
    release = Release(args.modelled_release)  # --vllm-version X (cli/vllm_version.py apply)

    obligations = build_obligations(release, args.bound, args.timeout)
    not_encoded = outside_encoding(release)
    if args.only:
        obligations = _chosen(obligations, args.only, not_encoded)
    outdir.mkdir(parents=True, exist_ok=True)
    jobs = min(args.jobs or os.cpu_count() or 1, len(obligations))
    progress = Progress("prove", len(obligations), min_total=1)
    rows = []
    t0 = time.perf_counter()
    out = sys.stdout
    if not args.json:
        print(f"{'obligation':44} {'kind':9} {'result':8} {'s':>6}  bad  bound / witness", file=out)
    with shared_builds():  # each process builds an encoding once for all its obligations
        for i, row in enumerate(_rows(obligations, outdir, jobs, release, args.bound, args.timeout)):
            rows.append(row)
            progress(i + 1, len(obligations))
            if not args.json:
                nbad = sum(s == "refuted" for s in row["bad_variants"].values())
                print(f"{row['name']:44} {row['kind']:9} {row['result']:8} {row['seconds']:6.1f}  "
                      f"{nbad}/{len(row['bad_variants'])}  {row['bound']}" + ("" if row["ok"] else "   FAILED")
                      + f"\n{'':75}{row['witness'] or '- (no witness)'}"
                      + (f"\n{'':75}finding: {row['finding']}" if row.get("finding") else ""), file=out,
                      flush=True)
    progress.close()
    total = time.perf_counter() - t0
    ok = all(r["ok"] for r in rows)
    if args.json:
        json.dump({"ok": ok, "vllm_version": release.version, "seconds": round(total, 2), "obligations": rows,
                   "not_encoded": {k: list(v) for k, v in not_encoded.items()}}, out, indent=2)
        out.write("\n")
    else:
        by = {}
        for r in rows:
            by.setdefault(r["kind"], []).append(r)
        print("\nsummary", file=out)
        print(f"  {'kind':10} {'obligations':>11} {'proved':>7} {'witnesses':>9} {'bad refuted':>11}", file=out)
        for kind, rs in by.items():
            print(f"  {kind:10} {len(rs):11} {sum(r['result'] == 'proved' for r in rs):7} "
                  f"{sum(bool(r['witness']) for r in rs):9} "
                  f"{sum(all(s == 'refuted' for s in r['bad_variants'].values()) and bool(r['bad_variants']) for r in rs):11}",
                  file=out)
        print(f"  {len(rows)} obligations, {sum(r['ok'] for r in rows)} ok, {total:.1f} s; witnesses in {outdir}/"
              f"; vLLM {release.version}", file=out)
        findings = sorted({r["finding"] for r in rows if r.get("finding")})
        for f in findings:  # refuted as expected: a bug of that release, not of the proofs
            print(f"  finding: {f}", file=out)
        if not args.only:
            # Said, not hidden: what the encoding (both engine flags off) cannot state.
            for name, flags in not_encoded.items():
                print(f"  not encoded: {name} (needs {' and '.join(flags)}; judged by the state machine, "
                      "`schedspec check` and `schedspec diff`)", file=out)
    return 0 if ok else 1


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "prove", help="prove each scheduler property with z3, with a witness scenario for each",
        description="Discharge one z3 proof obligation per scheduler property (it holds in every step "
                    "from any valid state, up to a bound), show each is not vacuous by a reachable witness "
                    "scenario written to -o DIR, and check it fails on deliberately wrong variants of the "
                    "rules. Exit 1 when an obligation fails.")
    p.add_argument("--json", action="store_true", help="one JSON report on stdout")
    p.add_argument("--only", metavar="NAME", action="append",
                   help="only this obligation, by its name or its property's name (repeat for several)")
    p.add_argument("--bound", type=int_arg(1, 12), default=None, metavar="N",
                   help="running and waiting request slots of the one-step claims, for every obligation "
                        "(default 4; 6 for six obligations proved there quickly; each line prints its bound)")
    p.add_argument("-o", "--out", default="proofs-out", metavar="DIR",
                   help="folder for the witness scenarios, one per obligation, each replayable with "
                        "`schedspec check` (default ./proofs-out)")
    p.add_argument("--timeout", type=float_arg(0.0, 86400.0, lo_open=True), default=20.0, metavar="S",
                   help="base time limit of a z3 call, seconds (default 20): a call's tries run with fresh "
                        "random seeds and 1/16, 1/16, 1/8, 1/8, 1/4, 1/4, 1/2, 1/2, 1 and 4 times this, "
                        "about 7x in all")
    p.add_argument("--jobs", type=int_arg(1, 1024), default=None, metavar="N",
                   help="obligations discharged in parallel (default: one per CPU core)")
    add_vllm_version_argument(p)
    p.set_defaults(func=cmd_prove)
