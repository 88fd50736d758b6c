"""Differential campaigns: run two implementations over scenarios (files or seeded
random ones), compare their traces, record coverage, and write (and shrink)
every diverging scenario, never overwriting a file.

A campaign is described by a `CampaignOptions` (plain values; the command line,
cli/diff.py, builds one from its flags) and run by `run_campaign` (any two
implementations, one scenario at a time) or gpu/campaign.py
`run_batched_campaign` (torch against the spec, whole batches at a time); both
report divergences through `report_divergence`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from .errors import UsageError, shown
from .progress import Progress
from schedspec.spec.config import FLOAT_FIELDS, ConfigError, SchedulerConfig, config_from_dict
from schedspec.spec.versions import DEFAULT_RELEASE

from .compare import Divergence
from .engine import run_scenario
from .example_files import resolve_scenario_path
from .impl import DraftTaking, GrammarTaking, takes_finished_recving, takes_finished_sending
from .scenario import Scenario, ScenarioError, load_scenario
from .shrink import shrink


@dataclasses.dataclass(frozen=True)
class CampaignOptions:
    """What a campaign needs besides the implementations themselves.

    `impl` and `against`: the two implementations' names as `--impl` takes them
    (reports, messages and the reproduce command name them so); `seed` and
    `num_scenarios`: the random scenarios (None or 0: none); `configs`: how many
    random configs the config-agreement check draws (None: no check); `flags`:
    the engine-flag combinations random scenarios draw (reference/generator.py;
    None: the default for the pair, see `campaign_flags`); `device`: where torch
    runs (None: its default), also named in the reproduce command; `batch_size`:
    scenarios torch steps at once in the batched campaign (None: its default);
    `out_dir`: where diverging scenarios are written; `shrink` and
    `shrink_seconds`: whether a diverging random scenario is shrunk, and the time
    budget for one; `quiet`: print nothing on the output stream (the caller
    prints the returned report, e.g. as JSON); `scenario_timeout`: seconds a
    worker may spend on one scenario (its shrink aside) before it counts as hung;
    `release`: the vLLM release of the configs that name none (the command's
    `--vllm-version X` or `--impl vllm==X`), the one random scenarios draw for."""

    impl: str
    against: str = "spec"
    seed: int = 0
    num_scenarios: int | None = None
    configs: int | None = None
    flags: tuple[tuple[bool, bool], ...] | None = None
    device: str | None = None
    batch_size: int | None = None
    out_dir: Path = Path("divergences")
    shrink: bool = True
    shrink_seconds: float = 120.0
    quiet: bool = False
    scenario_timeout: float = 300.0
    release: str = DEFAULT_RELEASE


class TimedImpl:
    """Wraps an implementation and adds up the time spent in its scheduler
    calls (add_request, finish_requests, schedule, update_from_output);
    construction (reset) and state read-back (observe) are not counted.
    `impl` is the wrapped implementation, `name` its name, `seconds` the time,
    `steps` the schedule() calls."""

    def __init__(self, impl):
        self.impl = impl
        self.name = getattr(impl, "name", type(impl).__name__)
        self.seconds = 0.0
        self.steps = 0
        if isinstance(impl, DraftTaking):  # only then: the engine asks for it (reference/impl.py)
            self.update_draft_token_ids = lambda drafts: self._timed(impl.update_draft_token_ids, drafts)
        if isinstance(impl, GrammarTaking):
            self.grammar_compiled = lambda ids, failed=False: self._timed(impl.grammar_compiled, ids, failed)
        if takes_finished_recving(impl) and takes_finished_sending(impl):  # async KV loads, KV sends
            self.update_from_output = lambda output, sampled, finished_recving=(), finished_sending=(): self._timed(
                impl.update_from_output, output, sampled, finished_recving, finished_sending)
        elif takes_finished_recving(impl):  # async KV loads
            self.update_from_output = lambda output, sampled, finished_recving=(): self._timed(
                impl.update_from_output, output, sampled, finished_recving)
        for flag in ("models_kv_connector_hits", "models_encoder_inputs"):
            if hasattr(impl, flag):
                setattr(self, flag, getattr(impl, flag))

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t

    def reset(self, config):
        return self.impl.reset(config)

    def add_request(self, request):
        return self._timed(self.impl.add_request, request)

    def finish_requests(self, ids, status):
        return self._timed(self.impl.finish_requests, ids, status)

    def schedule(self):
        self.steps += 1
        return self._timed(self.impl.schedule)

    def update_from_output(self, output, sampled):
        return self._timed(self.impl.update_from_output, output, sampled)

    def observe(self):
        return self.impl.observe()

    def close(self):
        close_impl(self.impl)


def close_impl(impl) -> None:
    """Call `impl.close()` if the implementation has one (vLLM's adapter does)."""
    close = getattr(impl, "close", None)
    if close:
        close()


def crash_trace(scenario: Scenario, impl, e: BaseException, step: int | None = None) -> dict[str, Any]:
    """The trace of a run that raised `e` (in engine step `step`): no steps, and the
    exception as `crash`, its type as `crash_type`."""
    return {"scenario": scenario.name, "implementation": getattr(impl, "name", "?"), "steps": [],
            "crash": f"{type(e).__name__}: {e}", "crash_type": type(e).__name__, "crash_step": step}


def run_guarded(scenario: Scenario, impl, on_step=None) -> dict[str, Any]:
    """run_scenario, where an implementation that raises gives its crash trace
    (a divergence to report with the scenario, not the end of the campaign, unless
    both implementations raise alike: compare.py `compare_runs`)."""
    at: list[int | None] = [None]

    def track(step: int, total: int) -> None:
        at[0] = step

    try:
        return run_scenario(scenario, impl, on_step=on_step, progress=track)
    except Exception as e:  # noqa: BLE001 - report it with the scenario
        return crash_trace(scenario, impl, e, at[0])


def safe_stem(name: str, limit: int = 80) -> str:
    """A scenario name made into a file name that stays inside its folder: only
    letters, digits, `.`, `_` and `-`; no leading dot (`..`, hidden files); at
    most `limit` characters (names longer than 255 bytes fail with "File name
    too long").  A changed name gets a short hash of the original so that two
    names never map to the same file stem by accident."""
    import hashlib
    import re

    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "scenario"
    if stem != name or len(stem) > limit:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        stem = f"{stem[:limit - 9]}-{digest}"
    return stem


def repro_command(options: CampaignOptions, path: Path) -> str:
    """The command that reruns the campaign's two implementations on `path`."""
    cmd = f"schedspec diff --impl {options.impl}"
    if options.against != "spec":
        cmd += f" --against {options.against}"
    if options.device:
        cmd += f" --device {options.device}"
    return f"{cmd} {path}"


def load_scenario_files(paths: Iterable[str], release: str = DEFAULT_RELEASE) -> list[tuple[Scenario, bool]]:
    """(scenario, False) per file (or shipped example's name); a UsageError for
    one that cannot be read."""
    out = []
    for f in paths:
        try:
            out.append((load_scenario(resolve_scenario_path(f), release), False))
        except ScenarioError as e:
            raise UsageError(str(e)) from None
    return out


def flags_description(flags: Sequence[tuple[bool, bool]]) -> str:
    """The --flags words that draw `flags` (the flags drawn change the scenario of an index)."""
    from .generator import FLAG_NAMES, FLAGS_ALL

    return (" --flags all" if flags == FLAGS_ALL
            else " --flags " + ",".join(n for n, f in FLAG_NAMES.items() if f in flags))


def random_scenario(seed: int, i: int, flags: Sequence[tuple[bool, bool]] | None = None,
                    features: frozenset[str] = frozenset(), release: str = DEFAULT_RELEASE) -> Scenario:
    """Random scenario `i` of `seed` for vLLM `release` (its config fields are the
    ones drawn), drawing the engine-flag combinations `flags` (reference/generator.py;
    None: none, as torch campaigns need) and `features` (speculative decoding); its
    description says how to draw it again."""
    from .generator import FLAGS_OFF, generate_scenario, scenario_rng

    flags = flags or FLAGS_OFF
    s = generate_scenario(scenario_rng(seed, i), i, flags, release, features)
    for_release = "" if release == DEFAULT_RELEASE else f" for vLLM {release}"
    return dataclasses.replace(
        s, name=f"random-s{seed}-{i}",
        description=f"random scenario {i} of seed {seed}{for_release} (schedspec diff --scenarios N --seed "
                    f"{seed}{flags_description(flags)}, N > {i})")


def random_scenarios(num_scenarios: int | None, seed: int, flags: Sequence[tuple[bool, bool]] | None = None,
                     release: str = DEFAULT_RELEASE) -> Iterator[tuple[Scenario, bool]]:
    """(random_scenario(seed, i, flags, release=release), True) for i in 0 .. num_scenarios - 1."""
    for i in range(num_scenarios or 0):
        yield random_scenario(seed, i, flags, release=release), True


def campaign_features(options: CampaignOptions) -> frozenset[str]:
    """The features random scenarios draw besides the flags: those both
    implementations model (generator.py `features_for`), with the flags drawn."""
    from .generator import FLAGS_OFF, features_for

    return features_for(options.impl, options.against) if campaign_flags(options) != FLAGS_OFF else frozenset()


def campaign_flags(options: CampaignOptions):
    """The engine-flag combinations random scenarios draw: `options.flags`, else
    every combination both implementations model (generator.py `flags_for`).
    Asking an implementation for a combination it does not model is a user error."""
    from .generator import flags_for, unmodelled_flags

    impls = (options.impl, options.against)
    if options.flags is None:
        return flags_for(*impls)
    reason = unmodelled_flags(options.flags, *impls)
    if reason:
        raise UsageError(reason)
    return options.flags


def _accepts(impl_name: str, impl, raw: dict[str, Any], release: str) -> tuple[bool, str]:
    # A config naming no release is of the command's release (--vllm-version, --impl vllm==X).
    raw = raw if "vllm_version" in raw else {**raw, "vllm_version": release}
    if impl_name == "spec":
        try:
            config_from_dict(raw)
            return True, ""
        except ConfigError as e:
            return False, str(e)
    try:
        cfg = SchedulerConfig(**{k: (float(v) if k in FLOAT_FIELDS else v) for k, v in raw.items()})
        impl.reset(cfg)
        return True, ""
    except (ConfigError, ValueError) as e:
        return False, str(e)


def run_config_agreement(options: CampaignOptions, impl_a, impl_b, out) -> dict[str, Any]:
    """`options.configs` random configs near vLLM's acceptance boundaries (seed
    `options.seed`): does each implementation accept each one?  The counts and
    every disagreement."""
    from .generator import config_rng, generate_config_dict

    n, a_name, b_name = options.configs or 0, options.impl, options.against
    res = {"configs": options.configs, "both_accept": 0, "both_reject": 0, "disagreements": []}
    progress = Progress("configs", n)
    try:
        for i in range(n):
            rng = config_rng(options.seed, i)
            raw = generate_config_dict(rng, valid_bias=0.5)
            ok_a, why_a = _accepts(a_name, impl_a, raw, options.release)
            ok_b, why_b = _accepts(b_name, impl_b, raw, options.release)
            if ok_a and ok_b:
                res["both_accept"] += 1
            elif not ok_a and not ok_b:
                res["both_reject"] += 1
            else:
                res["disagreements"].append({"index": i, "config": raw,
                                             a_name: why_a or "accepts", b_name: why_b or "accepts"})
                if not options.quiet:
                    print(f"CONFIG DISAGREEMENT (config {i} of seed {options.seed}): {json.dumps(raw)}", file=out)
                    print(f"  {a_name}: {why_a or 'accepts'}", file=out)
                    print(f"  {b_name}: {why_b or 'accepts'}", file=out)
            progress(i + 1, n)
    finally:
        progress.close()
    return res


def campaign_source(options: CampaignOptions, files: list[tuple[Scenario, bool]],
                    flags: Sequence[tuple[bool, bool]] | None) -> tuple[int, Iterable[tuple[Scenario, bool]]]:
    """How many scenarios a campaign runs, and them in order: `files` if any,
    else `options.num_scenarios` random ones drawing `flags`."""
    total = len(files) + (options.num_scenarios or 0)
    return total, (files if files else random_scenarios(options.num_scenarios, options.seed, flags, options.release))


def print_campaign_report(res: dict[str, Any], elapsed: float, timing: str, out) -> None:
    """A campaign's closing lines: the totals, `timing` (the time per step as
    the campaign measured it) and the coverage counters."""
    print(f"scenarios: {res['scenarios']}  steps compared: {res['steps_compared']}  divergences: "
          f"{len(res['divergences'])}  time: {elapsed:.1f} s", file=out)
    print(timing, file=out)
    if res["coverage"]:
        print("coverage: " + ", ".join(f"{k} {v}" for k, v in res["coverage"].items()), file=out)


def scenario_items(options: CampaignOptions, files: list[tuple[Scenario, bool]]) -> list[tuple[int, tuple]]:
    """The campaign's work as reference/workers.py items: a file's scenario, or the
    seed and index of a random one (the worker draws it)."""
    if files:
        return [(i, ("file", s)) for i, (s, _) in enumerate(files)]
    return [(i, ("random", options.seed, i)) for i in range(options.num_scenarios or 0)]


@dataclasses.dataclass(frozen=True)
class Execution:
    """Where a campaign runs (reference/workers.py): `workers` processes (1: this
    one) or, with `ray_address`, that many Ray actors; `store`: the results
    folder results stream to (campaign_store.py), `done`: results it already
    holds (--resume)."""

    workers: int = 1
    ray_address: str | None = None
    store: Any = None
    done: dict = dataclasses.field(default_factory=dict)
    devices: tuple[str | None, str | None] = (None, None)


def run_campaign(options: CampaignOptions, files: list[tuple[Scenario, bool]], out,
                 execution: Execution | None = None) -> dict[str, Any]:
    """Runs `options.impl` against `options.against` on `files` (from
    load_scenario_files), or when there are none on `options.num_scenarios`
    random scenarios, where `execution` says; merges the results in scenario
    order, whatever order they arrive in, and writes and reports each
    divergence.  The report: `scenarios`, `steps_compared`, `divergences`,
    `failures` (scenarios whose worker crashed or hung), `coverage` (all
    deterministic: `deterministic_report`), and `ms_per_step` (per
    implementation, in its scheduler calls), `seconds`, `load_seconds` (per
    implementation, per worker), `workers`.  Raises UsageError when workers
    cannot load the implementations."""
    from .workers import Job, SetupError, WorkerFailure, WorkerInfo, run_job

    execution = execution or Execution()
    flags = campaign_flags(options)
    items = scenario_items(options, files)
    total = len(items)
    results: dict[int, dict[str, Any]] = dict(execution.done)
    pending = [(i, item) for i, item in items if i not in results]
    inline = execution.workers <= 1 and execution.ray_address is None
    job = Job(WORKER_SETUP, (options, flags, execution.devices, inline), WORKER_RUN,
              item_timeout=options.scenario_timeout, long_timeout=options.scenario_timeout + options.shrink_seconds)
    progress = Progress("diff", total, min_total=20)
    merged = Merge(options, files, flags, out, resumed=bool(execution.done), before_print=progress.close)
    info = WorkerInfo()
    t0 = time.monotonic()
    try:
        merged.advance(results)
        progress(len(results), total)
        for index, outcome in run_job(job, pending, workers=execution.workers, ray_address=execution.ray_address,
                                      info=info):
            if isinstance(outcome, WorkerFailure):
                outcome = {"scenario": merged.scenario(index).name,
                           "failure": {"kind": outcome.kind, "detail": outcome.detail}}
            outcome["index"] = index
            if execution.store is not None:
                execution.store.append(outcome)
            results[index] = outcome
            merged.advance(results)
            progress(len(results), total)
    except SetupError as e:
        raise UsageError(str(e)) from None
    finally:
        progress.close()
    elapsed = time.monotonic() - t0
    names = (options.impl, options.against)
    per_step = {n: (1000.0 * merged.seconds[k] / merged.calls[k] if merged.calls[k] else None)
                for k, n in enumerate(names)}
    res = {**merged.report(total), "ms_per_step": per_step, "seconds": round(elapsed, 1),
           "workers": len(info.setups) or 1, "worker_restarts": info.restarts,
           "load_seconds": {n: [s[n] for s in info.setups if s] for n in names}}
    if not options.quiet:
        pa, pb = per_step[names[0]], per_step[names[1]]
        ratio = f"  ({names[0]}/{names[1]} = {pa / pb:.1f}x)" if pa and pb else ""
        fmt = lambda x: f"{x:.3f} ms" if x is not None else "-"  # noqa: E731
        print_campaign_report(res, elapsed, f"time per step in scheduler calls: {names[0]} {fmt(pa)}, "
                              f"{names[1]} {fmt(pb)}{ratio}", out)
        if res["failures"]:
            print(f"worker failures: {len(res['failures'])} (scenarios written to {options.out_dir})", file=out)
    return res


WORKER_SETUP = "schedspec.reference.campaign_worker:setup_pair"
WORKER_RUN = "schedspec.reference.campaign_worker:run_item"
DETERMINISTIC_KEYS = ("implementations", "scenarios", "steps_compared", "divergences", "failures", "coverage",
                      "rejected")


def deterministic_report(res: dict[str, Any]) -> dict[str, Any]:
    """The part of a campaign's report that the scenarios and implementations
    alone decide: no timings, no worker counts."""
    return {k: res[k] for k in DETERMINISTIC_KEYS if k in res}


class Merge:
    """A campaign's results taken in scenario order: totals, coverage, and the
    divergences and worker failures written and printed as their turn comes."""

    def __init__(self, options: CampaignOptions, files: list[tuple[Scenario, bool]], flags, out, resumed: bool,
                 before_print=lambda: None):
        self.options, self.files, self.flags, self.out, self.resumed = options, files, flags, out, resumed
        self.before_print = before_print  # e.g. take the progress bar off the screen
        self.next = 0
        self.steps = 0
        self.coverage: dict[str, int] = {}
        self.seconds = [0.0, 0.0]
        self.calls = [0, 0]
        self.divergences: list[dict[str, Any]] = []
        self.failures: list[dict[str, Any]] = []
        self.rejected: list[dict[str, str]] = []  # given files both implementations refused

    def scenario(self, index: int) -> Scenario:
        if self.files:
            return self.files[index][0]
        return random_scenario(self.options.seed, index, self.flags, campaign_features(self.options),
                               self.options.release)

    def advance(self, results: dict[int, dict[str, Any]]) -> None:
        while self.next in results:
            self.take(results[self.next])
            self.next += 1

    def take(self, rec: dict[str, Any]) -> None:
        is_random = not self.files
        if ("failure" in rec or rec.get("found")) and not self.options.quiet:
            self.before_print()
        if "failure" in rec:
            self.failures.append(write_failure(self.options, self.scenario(rec["index"]), rec["failure"], self.out,
                                               self.resumed))
            return
        if "rejected" in rec and self.files:
            # A file the user gave that neither implementation runs: say why, once, not just count it.
            if not self.options.quiet:
                self.before_print()
            self.rejected.append(note_rejected(self.scenario(rec["index"]).name, rec["rejected"],
                                               None if self.options.quiet else self.out))
        self.steps += rec["steps"]
        for k, v in rec["coverage"].items():
            self.coverage[k] = self.coverage.get(k, 0) + v
        for k in (0, 1):
            self.seconds[k] += rec["seconds"][k]
            self.calls[k] += rec["calls"][k]
        found = rec.get("found")
        if found:
            from .scenario import scenario_from_json

            minimal = found.get("minimal")
            small = ((scenario_from_json(minimal["scenario"]), Divergence(**minimal["divergence"]))
                     if minimal else None)
            self.divergences.append(write_divergence(self.options, self.scenario(rec["index"]), is_random,
                                                     Divergence(**found["divergence"]), small, self.out,
                                                     self.resumed))

    def report(self, total: int) -> dict[str, Any]:
        return {"implementations": [self.options.impl, self.options.against], "scenarios": total,
                "steps_compared": self.steps, "divergences": self.divergences, "failures": self.failures,
                "coverage": dict(sorted(self.coverage.items())),
                **({"rejected": self.rejected} if self.rejected else {})}


def note_rejected(name: str, error: str, out: IO[str] | None) -> dict[str, str]:
    """A given file that both implementations refused: its entry in the report's
    `rejected`, and one line naming it and why on `out` (None: quiet)."""
    if out is not None:
        print(f"scenario {name!r}: rejected by both implementations, nothing compared: {error}", file=out)
    return {"scenario": name, "error": error}


def scenario_text(scenario: Scenario) -> str:
    """A scenario file's bytes as save_scenario writes them."""
    return json.dumps(scenario.to_json(), indent=2) + "\n"


def write_fresh(directory: Path, stem: str, render, reuse: bool) -> Path:
    """Writes `render(path)` to a new file directory/<stem>[-k].json and returns
    its path.  With `reuse` (a resumed campaign redoing its own writes), a file
    already holding exactly those bytes is taken instead of a new one."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = safe_stem(stem)
    k = 1
    while True:
        path = directory / (f"{stem}.json" if k == 1 else f"{stem}-{k}.json")
        text = render(path)
        if not path.exists():
            path.write_text(text)
            return path
        if reuse and path.read_text() == text:
            return path
        k += 1


def with_reproduce(options: CampaignOptions, scenario: Scenario, path: Path) -> Scenario:
    return dataclasses.replace(scenario, description=(scenario.description + " | " if scenario.description else "")
                               + f"Reproduce: {repro_command(options, path)}")


def write_failure(options: CampaignOptions, scenario: Scenario, failure: dict[str, str], out,
                  reuse: bool = False) -> dict[str, Any]:
    """A scenario on which a worker crashed or hung: written to `options.out_dir`
    like a divergence, so that it can be run again alone."""
    path = write_fresh(options.out_dir, scenario.name, lambda p: scenario_text(with_reproduce(options, scenario, p)),
                       reuse)
    if not options.quiet:
        print(f"WORKER {failure['kind'].upper()} on {shown(scenario.name)}: {shown(failure['detail'], 300)}", file=out)
        print(f"  scenario written to {path}", file=out)
    return {"scenario": scenario.name, **failure, "file": str(path)}


def report_divergence(options: CampaignOptions, scenario: Scenario, is_random: bool, d: Divergence, impl_a,
                      impl_b, out) -> dict[str, Any]:
    """A divergence found with the implementations at hand (gpu/campaign.py):
    a random scenario is shrunk (`impl_a` and `impl_b` rerun it), then both are
    written (write_divergence)."""
    small = None
    if is_random and options.shrink and d.kind != "crash":
        small = shrink(scenario, impl_a, impl_b, d, budget_s=options.shrink_seconds)
    return write_divergence(options, scenario, is_random, d, small, out)


def write_divergence(options: CampaignOptions, scenario: Scenario, is_random: bool, d: Divergence,
                     small: tuple[Scenario, Divergence] | None, out, reuse: bool = False) -> dict[str, Any]:
    """Writes the diverging scenario to `options.out_dir` (a fresh file) with the
    command that reproduces it in its description, and its shrunk form `small`
    (scenario, divergence) beside it.  The report's entry for the divergence."""
    entry: dict[str, Any] = {"scenario": scenario.name, **d.to_json()}
    path = write_fresh(options.out_dir, scenario.name,
                       lambda p: scenario_text(with_reproduce(options, scenario, p)), reuse)
    entry["file"] = str(path)
    if not options.quiet:
        print(f"DIVERGENCE in {shown(scenario.name)}: {d.describe()}", file=out)
        print(f"  scenario written to {path}", file=out)
    if small is not None:
        shrunk, sd = small

        def render(p: Path) -> str:
            return scenario_text(dataclasses.replace(
                shrunk, name=f"{scenario.name}-min",
                description=(f"Shrunk from {scenario.name} ({scenario.description}): {options.impl} and "
                             f"{options.against} first differ at "
                             + (f"step {sd.step}, " if sd.step is not None else "")
                             + f"field {sd.field}. Reproduce: {repro_command(options, p)}")))

        mpath = write_fresh(options.out_dir, f"{scenario.name}-min", render, reuse)
        entry["minimal"] = {"file": str(mpath), "requests": len(shrunk.requests),
                            "max_steps": shrunk.max_steps, **sd.to_json()}
        if not options.quiet:
            print(f"  shrunk to {len(shrunk.requests)} request(s), {shrunk.max_steps} step(s): {mpath}", file=out)
            print(f"  {sd.describe()}".replace("\n", "\n  "), file=out)
            print(f"  reproduce: {repro_command(options, mpath)}", file=out)
    return entry


__all__ = ["CampaignOptions", "DETERMINISTIC_KEYS", "Execution", "Merge", "TimedImpl", "campaign_features",
           "campaign_flags",
           "campaign_source", "close_impl", "crash_trace", "deterministic_report", "flags_description",
           "load_scenario_files", "print_campaign_report", "random_scenario", "random_scenarios", "repro_command",
           "report_divergence", "run_campaign", "run_config_agreement", "run_guarded", "safe_stem",
           "scenario_items", "scenario_text", "with_reproduce", "write_divergence", "write_failure", "write_fresh"]
