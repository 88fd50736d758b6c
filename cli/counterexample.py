"""`schedspec counterexample GOAL`: find a scenario that reaches a goal, shrink it, write it.

    schedspec counterexample starvation [--k 3] [-o FILE] [--max-steps S] [--max-requests N]
                             [--config FILE] [--impl spec|vllm|module:Class] [--seed N]
                             [--budget-seconds T] [--tries N]
    schedspec counterexample GOAL --replay FILE [--k K] [--impl vllm]
    schedspec counterexample --list

The goals are proofs/search/goals.py's; the method is random search + shrinking
(proofs/search/counterexample.py).  Exit status: 0 when a scenario is found
and written, or when none is found within the bound (the output says so and
gives the bound); with --replay, 0 when the file reaches the goal and 1 when
it does not; 2 for a user error (also: the implementation raised); 3 for an
internal error of the search (a goal's finder raised).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from schedspec.reference.errors import UsageError, fail
from schedspec.spec.versions import DEFAULT_RELEASE

from schedspec.reference.progress import Progress

from .args import float_arg, int_arg

DEFAULT_K = 3
DEFAULT_MAX_STEPS = 64
DEFAULT_LIVENESS_MAX_STEPS = 300


#: With the default --workers, a worker per this many tries at most: starting one
#: (and loading the implementation in it) costs more than a short search gains.
TRIES_PER_WORKER = 500


def search_workers(asked: int | None, tries: int) -> int:
    """--workers, or by default the cores, at most one per TRIES_PER_WORKER tries."""
    from schedspec.reference.workers import default_workers

    return asked or max(1, min(default_workers(), -(-tries // TRIES_PER_WORKER)))


def _goal(name: str):
    from schedspec.proofs.search.goals import UnknownGoal, get_goal

    try:
        return get_goal(name)
    except UnknownGoal as e:
        raise UsageError(e.args[0]) from None


def _impl(name: str):
    from .common import load_impl_or_fail

    return load_impl_or_fail(name)


def _fixed_config(path: str) -> dict[str, Any]:
    """A scenario file's config, or a JSON object of config fields."""
    from schedspec.spec.config import ConfigError, config_from_dict

    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--config {path}: cannot read: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--config {path}: not valid JSON: {e.msg} at line {e.lineno}") from None
    if isinstance(data, dict) and str(data.get("format", "")).startswith("schedspec.scenario/"):
        data = data.get("config", {})
    try:
        config_from_dict(data)
    except ConfigError as e:
        raise UsageError(f"--config {path}: {e}") from None
    if (data.get("max_model_len", 8192)) < 2:
        raise UsageError(f"--config {path}: config.max_model_len: must be at least 2 for any request to fit")
    return dict(data)


def _default_path(goal_name: str) -> Path:
    stem = "counterexample-" + re.sub(r"[^A-Za-z0-9_-]+", "-", goal_name)
    p = Path(f"{stem}.json")
    n = 2
    while p.exists():
        p = Path(f"{stem}-{n}.json")
        n += 1
    return p


def replay_command(goal, k: int, path: str, impl: str | None = None) -> str:
    kk = f" --k {k}" if goal.uses_k else ""
    im = f" --impl {impl}" if impl else ""
    return f"schedspec counterexample {goal.name}{kk} --replay {path}{im}"


def search_command(args, goal) -> str:
    parts = [f"schedspec counterexample {goal.name}"]
    if goal.uses_k:
        parts.append(f"--k {args.k}")
    for flag, v in (("--impl", args.impl if args.impl != "spec" else None), ("--config", args.config),
                    ("--max-prompt-len", args.max_prompt_len), ("--max-steps", args.max_steps),
                    ("--max-requests", args.max_requests if args.max_requests != 6 else None),
                    ("--seed", args.seed)):
        if v is not None:
            parts.append(f"{flag} {v}")
    return " ".join(parts)


def describe(goal, k: int, result, path: str, impl_name: str, command: str = "") -> str:
    hit = result.hit
    show = ("`schedspec check " if goal.name.startswith("property:") else "`schedspec run ") + f"{path}`"
    kk = f" (K={k})" if goal.uses_k else ""
    return (f"Counterexample for goal {goal.name}{kk}: {hit.detail}, in {hit.steps} "
            f"(steps count from 0). Found by {result.method} against {impl_name} (`{command}`, "
            f"{result.tried} scenario(s) drawn; shrunk from {len(result.original.requests)} requests and "
            f"{result.original.max_steps} steps). Reproduce: {show} shows it ({goal.shows}); "
            f"`{replay_command(goal, k, path)}` checks the goal on the spec, "
            f"`{replay_command(goal, k, path, 'vllm')}` on vLLM {DEFAULT_RELEASE}.")


def cmd_counterexample(args) -> int:
    from schedspec.proofs.search.goals import GOALS, goal_names

    if args.list:
        from schedspec.proofs.search.goals import get_goal

        for name in goal_names():
            print(f"{name:<48} {get_goal(name).doc}")
        return 0
    if not args.goal:
        raise UsageError(f"give a GOAL: one of {', '.join(GOALS)} or property:NAME (--list shows them)")
    goal = _goal(args.goal)
    # The numeric flags are checked by their argparse types (register below).
    if args.replay:
        return _replay(args, goal)
    fixed = _fixed_config(args.config) if args.config else None
    from schedspec.reference.outputs import check_output_path

    # Never replaces a file, not even an earlier counterexample: each search writes a new one.
    out = check_output_path(args.out if args.out is not None else _default_path(goal.name), "-o",
                            [args.config] if args.config else [], ours=lambda _path: False)
    max_steps = args.max_steps or (DEFAULT_LIVENESS_MAX_STEPS if goal.liveness else DEFAULT_MAX_STEPS)

    from schedspec.proofs.search.counterexample import METHOD, GoalFailed, ImplementationFailed, search

    impl = _impl(args.impl)
    k = args.k
    print(f"goal {goal.name}" + (f" (K={k})" if goal.uses_k else "") + f": {goal.doc}")
    print(f"method: {METHOD}, against {args.impl}; up to {args.tries} scenarios, {args.max_requests} requests "
          f"and {max_steps} steps each, {args.budget_seconds:g} s, seed {args.seed}"
          + (f", config fixed by {args.config}" if fixed else ""))
    progress = Progress(f"search {goal.name}", args.tries, min_total=1)
    t0 = time.monotonic()
    try:
        result = search(goal, k, impl, max_requests=args.max_requests, max_steps=max_steps, seed=args.seed,
                        tries=args.tries, budget_s=args.budget_seconds, fixed_config=fixed,
                        shrink_s=args.shrink_seconds, max_prompt_len=args.max_prompt_len,
                        candidates=args.candidates, progress=progress, workers=search_workers(args.workers, args.tries),
                        impl_name=args.impl)
    except ImplementationFailed as e:
        raise UsageError(str(e)) from None
    except GoalFailed as e:
        fail(f"{e}; please report it", 3)
    finally:
        progress.close()
        close = getattr(impl, "close", None)
        if close:
            close()
    elapsed = time.monotonic() - t0
    if result.found is None:
        print(f"none within the bound: no scenario reaches {goal.name} on {args.impl} among {result.tried} "
              f"scenarios tried (up to {args.max_requests} requests, {max_steps} steps each, seed {args.seed}, "
              f"{elapsed:.1f} s). This is a bounded random search, not a proof.")
        if goal.liveness:
            print(f"{result.undecided} of these runs used up their {max_steps} steps with requests unfinished and no "
                  "repeated state: long runs, not proven livelocks (raise --max-steps to decide them).")
        return 0
    scenario = dataclasses.replace(result.found, name=out.stem)
    scenario = dataclasses.replace(scenario, description=describe(goal, k, result, str(out), args.impl,
                                                                search_command(args, goal)))
    from schedspec.reference.scenario import save_scenario

    try:
        save_scenario(scenario, out)
    except (FileExistsError, OSError) as e:
        raise UsageError(f"cannot write {out}: {e}") from None
    s = result.shrink
    print(f"first hit after {result.search_seconds:.2f} s; {result.tried} scenario(s) drawn, the smallest of up to "
          f"{args.candidates} hits kept; shrunk from "
          f"{len(result.original.requests)} requests / {result.original.max_steps} steps to "
          f"{len(scenario.requests)} request(s) / {scenario.max_steps} step(s) ({s.runs} runs, {s.seconds:.2f} s)")
    print(f"{result.hit.detail}, in {result.hit.steps}")
    print(f"written to {out}  (total {elapsed:.2f} s)")
    print(f"reproduce: schedspec run {out}   ({goal.shows})")
    print(f"           {replay_command(goal, k, str(out), None if args.impl == 'spec' else args.impl)}")
    return 0


def _replay(args, goal) -> int:
    from schedspec.reference.scenario import ScenarioError, load_scenario
    from schedspec.proofs.search.counterexample import GoalFailed, ImplementationFailed, evaluate

    try:
        scenario = load_scenario(args.replay, args.modelled_release)
    except ScenarioError as e:
        raise UsageError(str(e)) from None
    from schedspec.spec.config import ConfigError

    try:
        scenario.scheduler_config()
    except ConfigError as e:
        raise UsageError(f"{args.replay}: {e}") from None
    impl = _impl(args.impl)
    try:
        hit = evaluate(scenario, impl, goal, args.k)
    except ImplementationFailed as e:
        raise UsageError(f"{args.replay}: {e}") from None
    except GoalFailed as e:
        fail(f"{args.replay}: {e}; please report it", 3)
    finally:
        close = getattr(impl, "close", None)
        if close:
            close()
    kk = f" (K={args.k})" if goal.uses_k else ""
    if hit is None:
        print(f"{args.replay} on {args.impl}: goal {goal.name}{kk} NOT reached")
        return 1
    print(f"{args.replay} on {args.impl}: goal {goal.name}{kk} reached: {hit.detail}, in {hit.steps}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "counterexample", help="search for a scenario that reaches a goal (starvation, thrash, ...), shrink it",
        description="Random search + shrinking for a scenario that reaches GOAL on an implementation; writes "
                    "the shrunk scenario, whose description says the condition and how to reproduce it. "
                    "Exit 0: found, or none within the bound; with --replay, 1 when the file does not reach "
                    "the goal; 2: user error.")
    p.add_argument("goal", nargs="?", metavar="GOAL", help="a goal name or property:NAME (--list shows them)")
    p.add_argument("--k", type=int_arg(1, 10_000), default=DEFAULT_K, metavar="K", help="the goal's count (default 3)")
    p.add_argument("-o", "--out", metavar="FILE",
                   help="where to write the scenario (default ./counterexample-GOAL.json, never overwritten)")
    p.add_argument("--max-steps", type=int_arg(1, 1_000_000), metavar="S",
                   help=f"steps per scenario (default {DEFAULT_MAX_STEPS}; {DEFAULT_LIVENESS_MAX_STEPS} for liveness)")
    p.add_argument("--max-prompt-len", type=int_arg(1, 10_000_000), metavar="P",
                   help="longest prompt drawn (default: up to max_model_len - 1)")
    p.add_argument("--max-requests", type=int_arg(1, 10_000), default=6, metavar="N", help="requests per scenario (default 6)")
    p.add_argument("--config", metavar="FILE",
                   help="fix the config: a scenario file's, or a JSON object of config fields")
    p.add_argument("--impl", default="spec",
                   help="spec (default), vllm (loading takes about 20 s), torch, or module:Class")
    p.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=0, metavar="N", help="seed of the search (default 0)")
    p.add_argument("--budget-seconds", type=float_arg(0.0, 86400.0, lo_open=True), default=60.0, metavar="T",
                   help="time limit of the search (default 60)")
    p.add_argument("--tries", type=int_arg(1, 100_000_000), default=20000, metavar="N", help="scenarios to draw at most (default 20000)")
    p.add_argument("--shrink-seconds", type=float_arg(0.0, 86400.0, lo_open=True), default=20.0, metavar="T",
                   help="time limit of the shrinking (default 20)")
    p.add_argument("--candidates", type=int_arg(1, 10_000), default=5, metavar="N",
                   help="hits to shrink before keeping the smallest (default 5)")
    p.add_argument("--workers", type=int_arg(1, 4096), metavar="N",
                   help="processes judging candidates (default: the cores, at most one per "
                        f"{TRIES_PER_WORKER} tries); the same scenario is found whatever N is, the time budget aside")
    p.add_argument("--replay", metavar="FILE", help="evaluate the goal on a scenario file instead of searching")
    p.add_argument("--list", action="store_true", help="list the goals")
    p.set_defaults(func=cmd_counterexample)


def main(argv: list[str] | None = None) -> int:
    from .common import standalone_main

    return standalone_main("counterexample", register, argv)


if __name__ == "__main__":
    sys.exit(main())
