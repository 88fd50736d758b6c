"""Every bad flag and output path of the command line: one line on stderr, exit 2,
no traceback, and no file written or changed -- checked before any run starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_one_line_error, cli
from schedspec.reference.example_files import EXAMPLES_DIR, example_names


def _snapshot(root: Path) -> dict[str, bytes]:
    # Python's own bytecode cache of a user module imported from `root` is not
    # something schedspec wrote (it appears wherever PYTHONDONTWRITEBYTECODE is unset).
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(root.rglob("*")) if "__pycache__" not in p.relative_to(root).parts}


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh working folder holding a scenario, a foreign file of each kind and a
    fifo; cwd is there so that default outputs (./divergences, ./proofs-out)
    would land in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCHEDSPEC_PROGRESS", "0")
    (tmp_path / "s.json").write_text((EXAMPLES_DIR / "table3-b16.json").read_text())
    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.4 the user's report")
    (tmp_path / "mine.png").write_bytes(b"\x89PNG not ours")
    (tmp_path / "notes.json").write_text('{"format": "something else"}')
    (tmp_path / "folder.json").mkdir()
    os.mkfifo(tmp_path / "fifo.json")
    return tmp_path


def assert_rejected(capsys, root: Path, args, *words):
    """`schedspec ARGS` fails with one line naming `words`, and root is unchanged."""
    before = _snapshot(root)
    rc, _out, err = cli(capsys, *args)
    assert_one_line_error(rc, err, *words)
    assert _snapshot(root) == before, "a rejected command changed the folder"


LONG = "x" * 300

RUN_PATH_CASES = [
    (("--trace-out", ""), ["--trace-out", "empty"]),
    (("--trace-out", "/proc/x.json"), ["--trace-out", "/proc"]),
    (("--trace-out", "/dev/full"), ["--trace-out", "not a regular file"]),
    (("--trace-out", "fifo.json"), ["--trace-out", "not a regular file"]),
    (("--trace-out", "folder.json"), ["--trace-out", "folder"]),
    (("--trace-out", "nodir/t.json"), ["--trace-out", "does not exist"]),
    (("--trace-out", "notes.json"), ["--trace-out", "not a schedspec trace"]),
    (("--trace-out", "report.pdf"), ["--trace-out", "not a schedspec trace"]),
    (("--trace-out", "s.json"), ["--trace-out", "input"]),
    (("--trace-out", f"{LONG}.json"), ["--trace-out", "255"]),
    (("--plot", ""), ["--plot", "empty"]),
    (("--plot", "/proc/x.png"), ["--plot", "/proc"]),
    (("--plot", "out.xyz"), ["--plot", ".xyz", ".png"]),
    (("--plot", "noext"), ["--plot", "noext", ".png"]),
    (("--plot", "report.pdf"), ["--plot", "not a schedspec plot"]),
    (("--plot", "mine.png"), ["--plot", "not a schedspec plot"]),
    (("--plot", "nodir/p.png"), ["--plot", "does not exist"]),
    (("--plot", f"{LONG}.png"), ["--plot", "255"]),
    (("--plot", "s.json"), ["--plot", ".json"]),
]


@pytest.mark.parametrize("args, words", RUN_PATH_CASES, ids=[" ".join(a)[:40] for a, _ in RUN_PATH_CASES])
def test_run_output_paths_checked_before_the_run(capsys, sandbox, args, words):
    assert_rejected(capsys, sandbox, ("run", "s.json", *args), *words)


def test_a_bad_output_path_costs_no_run(capsys, sandbox, monkeypatch):
    """The path is refused before the scenario runs, not after."""
    import schedspec.reference.engine as engine

    def boom(*a, **k):
        raise AssertionError("the scenario ran before the output path was checked")

    monkeypatch.setattr(engine, "run_scenario", boom)
    assert_rejected(capsys, sandbox, ("run", "s.json", "--plot", "out.xyz"), "--plot")
    assert_rejected(capsys, sandbox, ("run", "s.json", "--trace-out", "/dev/full"), "--trace-out")


NUMERIC_CASES = [
    (("run", "s.json", "--step-ms", "nan"), ["--step-ms", "nan"]),
    (("run", "s.json", "--step-ms", "-1"), ["--step-ms", "-1"]),
    (("run", "s.json", "--step-ms", "0"), ["--step-ms"]),
    (("run", "s.json", "--step-ms", "inf"), ["--step-ms"]),
    (("run", "s.json", "--step-ms", "fast"), ["--step-ms", "fast"]),
    (("run", "s.json", "--token-ms", "-0.5"), ["--token-ms"]),
    (("run", "s.json", "--token-ms", "NaN"), ["--token-ms"]),
    (("examples", "--steps", "-1"), ["--steps", "-1"]),
    (("examples", "--steps", "1.5"), ["--steps", "1.5"]),
    (("diff", "--impl", "spec", "--against", "torch", "--scenarios", "-1"), ["--scenarios", "-1"]),
    (("diff", "--impl", "spec", "--against", "torch", "--scenarios", "0"), ["--scenarios"]),
    (("diff", "--impl", "spec", "--against", "torch", "--configs", "-3"), ["--configs"]),
    (("diff", "--impl", "spec", "--against", "torch", "--scenarios", "2", "--seed", "-1"), ["--seed"]),
    (("diff", "--impl", "spec", "--against", "torch", "--scenarios", "2", "--shrink-seconds", "-5"),
     ["--shrink-seconds", "-5"]),
    (("diff", "--impl", "spec", "--against", "torch", "--scenarios", "2", "--shrink-seconds", "nan"),
     ["--shrink-seconds", "nan"]),
    (("diff", "--impl", "torch", "--scenarios", "2", "--batch-size", "0"), ["--batch-size"]),
    (("sweep", "s.json", "--set", "max_num_seqs=8", "--step-ms", "nan"), ["--step-ms"]),
    (("sweep", "s.json", "--set", "max_num_seqs=8", "--token-ms", "-1"), ["--token-ms"]),
    (("sweep", "--seed", "1", "--scenarios", "-1", "--set", "max_num_seqs=8"), ["--scenarios"]),
    (("sweep", "--seed", "-1", "--set", "max_num_seqs=8"), ["--seed"]),
    (("prove", "--bound", "0"), ["--bound"]),
    (("prove", "--bound", "13"), ["--bound"]),
    (("prove", "--timeout", "nan"), ["--timeout"]),
    (("prove", "--timeout", "-1"), ["--timeout"]),
    (("prove", "--jobs", "0"), ["--jobs"]),
    (("counterexample", "starvation", "--k", "0"), ["--k"]),
    (("counterexample", "starvation", "--tries", "-1"), ["--tries"]),
    (("counterexample", "starvation", "--max-steps", "0"), ["--max-steps"]),
    (("counterexample", "starvation", "--max-requests", "-2"), ["--max-requests"]),
    (("counterexample", "starvation", "--max-prompt-len", "0"), ["--max-prompt-len"]),
    (("counterexample", "starvation", "--candidates", "0"), ["--candidates"]),
    (("counterexample", "starvation", "--seed", "x"), ["--seed"]),
    (("counterexample", "starvation", "--budget-seconds", "nan"), ["--budget-seconds"]),
    (("counterexample", "starvation", "--budget-seconds", "0"), ["--budget-seconds"]),
    (("counterexample", "starvation", "--shrink-seconds", "-5"), ["--shrink-seconds"]),
    (("counterexample", "starvation", "--shrink-seconds", "inf"), ["--shrink-seconds"]),
]


@pytest.mark.parametrize("args, words", NUMERIC_CASES, ids=[" ".join(a)[:50] for a, _ in NUMERIC_CASES])
def test_nonsense_numbers_are_one_line_errors(capsys, sandbox, args, words):
    assert_rejected(capsys, sandbox, args, *words)


ARGPARSE_CASES = [
    (("runn",), ["invalid choice", "runn"]),
    ((), ["COMMAND"]),
    (("run",), ["scenario"]),
    (("run", "s.json", "--no-such-flag"), ["--no-such-flag"]),
    (("run", "s.json", "--trace-out"), ["--trace-out"]),
    (("run", "s.json", "--timeline", "some"), ["--timeline", "some"]),
    (("run", "s.json", "--policy-baseline", "lifo"), ["--policy-baseline", "lifo"]),
    (("diff", "--device", "tpu", "--scenarios", "2"), ["--device"]),
]


@pytest.mark.parametrize("args, words", ARGPARSE_CASES, ids=[" ".join(a)[:40] or "none" for a, _ in ARGPARSE_CASES])
def test_argparse_errors_are_one_line(capsys, sandbox, args, words):
    assert_rejected(capsys, sandbox, args, *words)


def test_version_and_help(capsys):
    from schedspec import __version__

    rc, out, _err = cli(capsys, "--version")
    assert rc == 0 and __version__ in out and "0.20.0 to 0.34.0" in out


def _all_actions():
    import argparse

    from schedspec.cli.main import build_parser

    def walk(parser, prefix):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for ca in a._choices_actions:
                    yield f"{prefix} {ca.dest}", ca.help
                for name, sp in a.choices.items():
                    yield f"{prefix} {name}", sp.description or ""
                    yield from walk(sp, f"{prefix} {name}")
            elif not isinstance(a, argparse._HelpAction):
                yield f"{prefix} {'/'.join(a.option_strings) or a.dest}", a.help

    return list(walk(build_parser(), "schedspec"))


def test_every_argument_has_help_without_internal_terms():
    actions = _all_actions()
    assert len(actions) > 60
    missing = [where for where, h in actions if not h]
    assert not missing, f"arguments without help: {missing}"
    # Terms a newcomer cannot look up, and internal paths.
    bad = [(where, h) for where, h in actions
           if any(t in (h or "") for t in ("Table 1", "Table 3", "group B", "group A", "../shared", "errors.py",
                                          "the seeds'"))
           and not where.startswith("schedspec explore")]
    assert not bad, bad


# --impl ---------------------------------------------------------------------

IMPL_CASES = [
    ("os:path", ["os:path", "not a class"]),
    (":SpecScheduler", [":SpecScheduler", "module:Class"]),
    ("a b:C", ["module:Class"]),
    ("vllmm", ["vllmm", "spec, vllm, torch"]),
    ("json:JSONDecoder", ["lacks"]),
    ("no_such_module_h8b:X", ["no_such_module_h8b", "current folder"]),
    ("schedspec.reference.impl:NoSuchClass", ["NoSuchClass"]),
]


@pytest.mark.parametrize("impl, words", IMPL_CASES, ids=[i for i, _ in IMPL_CASES])
@pytest.mark.parametrize("command", ["run", "check"])
def test_bad_impl_is_one_line(capsys, sandbox, command, impl, words):
    assert_rejected(capsys, sandbox, (command, "s.json", "--impl", impl), *words)


def test_bad_impl_in_diff_and_counterexample(capsys, sandbox):
    assert_rejected(capsys, sandbox, ("diff", "--impl", "os:path", "s.json"), "not a class")
    assert_rejected(capsys, sandbox, ("counterexample", "starvation", "--impl", ":X"), "module:Class")


def _user_module(folder: Path, name: str) -> str:
    (folder / f"{name}.py").write_text(
        "from schedspec.reference.impl import SpecScheduler\n"
        "class Mine(SpecScheduler):\n    name = 'mine'\n"
        "class Broken:\n    def __init__(self):\n        raise RuntimeError('boom\\nsecond line')\n"
        "class Crashes(SpecScheduler):\n    name = 'crashes'\n"
        "    def schedule(self):\n        raise RuntimeError('crash on purpose')\n")
    return name


def test_user_impl_from_the_current_folder(capsys, sandbox, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(sandbox))])
    mod = _user_module(sandbox, "h8b_user_impl_a")
    rc, out, err = cli(capsys, "run", "s.json", "--impl", f"{mod}:Mine", "--timeline", "none")
    assert rc == 0, err
    assert "on mine" in out
    rc, _out, err = cli(capsys, "run", "s.json", "--impl", f"{mod}:Broken")
    assert_one_line_error(rc, err, "Broken", "RuntimeError", "boom")


def test_user_impl_from_the_current_folder_with_the_installed_script(sandbox):
    """The console script's sys.path[0] is its bin folder, not the cwd."""
    script = Path(sys.executable).parent / "schedspec"
    if not script.exists():
        pytest.skip("no installed schedspec script next to this interpreter")
    mod = _user_module(sandbox, "h8b_user_impl_b")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([str(script), "run", "s.json", "--impl", f"{mod}:Mine", "--timeline", "none"],
                       capture_output=True, text=True, cwd=sandbox, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "on mine" in p.stdout


def test_slow_vllm_load_is_announced_and_timed_apart(capsys, sandbox, monkeypatch):
    """`--impl vllm` says it is loading and how long it took (vLLM itself is
    replaced by the spec here: what is tested is the announcement)."""
    from schedspec.reference import loader as impl

    monkeypatch.setitem(impl.BUILTIN_IMPLS, "vllm", "schedspec.reference.impl:SpecScheduler")
    rc, out, err = cli(capsys, "run", "s.json", "--impl", "vllm", "--timeline", "none")
    assert rc == 0, err
    assert "loading vLLM" in err and "vLLM loaded in" in err


def test_diff_announces_the_vllm_load_and_reports_it_apart(capsys, sandbox, monkeypatch):
    from schedspec.reference import loader as impl

    monkeypatch.setitem(impl.BUILTIN_IMPLS, "vllm", "schedspec.reference.impl:SpecScheduler")
    rc, out, err = cli(capsys, "diff", "--impl", "vllm", "s.json", "-o", "div")
    assert rc == 0, err
    assert "loading vLLM" in err
    assert "load time per worker (not in the figures above): vllm" in out


def test_every_numeric_flag_has_a_checked_type():
    """New numeric flags must use args.int_arg/float_arg (plain int/float
    accept -1, nan, inf)."""
    import argparse

    from schedspec.cli.main import build_parser

    loose = []

    def walk(parser, prefix):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk(sp, f"{prefix} {name}")
            elif a.type in (int, float):
                loose.append(f"{prefix} {'/'.join(a.option_strings)}")

    walk(build_parser(), "schedspec")
    assert loose == []


# diff -o DIR and divergence file names ---------------------------------------

def test_diff_output_folder_checked_first(capsys, sandbox):
    assert_rejected(capsys, sandbox, ("diff", "--impl", "spec", "--against", "torch", "s.json", "-o", "notes.json"),
                    "-o", "not a folder")
    assert_rejected(capsys, sandbox, ("diff", "--impl", "spec", "--against", "torch", "s.json", "-o", "a/b/c"),
                    "-o", "does not exist")
    assert_rejected(capsys, sandbox, ("diff", "--impl", "spec", "--against", "torch", "s.json", "-o", ""),
                    "-o", "empty")
    assert_rejected(capsys, sandbox, ("diff", "--impl", "spec", "--against", "torch", "s.json",
                                      "-o", "/proc/divergences"), "-o", "/proc")


@pytest.mark.parametrize("name", ["../escaped", "/tmp/h8b-abs-escape", "a/../../b", "..", ".hidden",
                                  "line\nbreak\x1b[31m", "x" * 300, "ü" * 200])
def test_divergence_file_stays_in_the_output_folder(capsys, sandbox, monkeypatch, name):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(sandbox))])
    mod = _user_module(sandbox, "h8b_user_impl_c")
    data = json.loads((EXAMPLES_DIR / "table3-b16.json").read_text())
    data["name"] = name
    (sandbox / "named.json").write_text(json.dumps(data))
    outdir = sandbox / "work" / "out"
    outdir.parent.mkdir()
    before = set(_snapshot(sandbox))
    rc, out, err = cli(capsys, "diff", "--impl", f"{mod}:Crashes", "--against", "spec", "named.json", "-o", outdir)
    assert rc == 1, err
    assert "Traceback" not in err
    assert "\x1b" not in out
    new = set(_snapshot(sandbox)) - before
    written = [p for p in new if (sandbox / p).is_file()]
    assert len(written) == 1, new
    path = (sandbox / written[0]).resolve()
    assert path.parent == outdir.resolve(), path
    assert len(path.name.encode()) <= 255 and not path.name.startswith(".")
    assert not Path("/tmp/h8b-abs-escape.json").exists()


def test_safe_stem():
    from schedspec.reference.campaign import safe_stem

    assert safe_stem("random-s7-12") == "random-s7-12"  # ordinary names are kept
    for name in ("../x", "/abs/x", "x" * 300, "a b", "..", "", "\x00", "é" * 300):
        s = safe_stem(name)
        assert "/" not in s and not s.startswith(".") and 0 < len(s) <= 80, (name, s)
    assert safe_stem("a/b") != safe_stem("a_b")  # different names stay apart


# prove / counterexample / sweep outputs ---------------------------------------

def test_prove_and_counterexample_outputs_checked_first(capsys, sandbox):
    assert_rejected(capsys, sandbox, ("prove", "-o", "notes.json"), "-o", "not a folder")
    assert_rejected(capsys, sandbox, ("prove", "-o", "no/such/dir"), "-o", "does not exist")
    assert_rejected(capsys, sandbox, ("counterexample", "starvation", "-o", "notes.json"), "-o", "not overwriting")
    assert_rejected(capsys, sandbox, ("counterexample", "starvation", "-o", "/proc/c.json"), "-o", "/proc")
    assert_rejected(capsys, sandbox, ("counterexample", "starvation", "-o", "folder.json"), "-o", "folder")
    assert_rejected(capsys, sandbox, ("counterexample", "starvation", "-o", ""), "-o", "empty")


@pytest.mark.parametrize("plot, words", [
    ("out.pdf", ["PNG only"]), ("noext", ["noext"]), ("out.xyz", [".xyz"]), ("mine.png", ["not a schedspec plot"]),
    ("/proc/x.png", ["/proc"]), ("s.json", [".json"]),
])
def test_sweep_plot_checked_first(capsys, sandbox, plot, words):
    assert_rejected(capsys, sandbox, ("sweep", "s.json", "--set", "max_num_seqs=8", "--plot", plot), "--plot", *words)


# names, examples, escaping, check ---------------------------------------------

@pytest.mark.parametrize("command", ["run", "check", "validate"])
def test_misspelt_example_lists_the_valid_ones(capsys, sandbox, command):
    assert_rejected(capsys, sandbox, (command, "tabel3-b16"), "tabel3-b16", "did you mean table3-b16",
                    *example_names())


def test_shipped_examples_reproduce_commands_work(capsys, sandbox):
    import re

    for name in example_names():
        desc = json.loads((EXAMPLES_DIR / f"{name}.json").read_text()).get("description", "")
        m = re.search(r"Reproduce: (schedspec [^.]*?)(?:$|\.\s)", desc)
        assert m, f"{name}: no reproduce command in its description"
        args = m.group(1).split()[1:]
        rc, _out, err = cli(capsys, *args, "--timeline", "none")
        assert rc == 0, (name, args, err)


def _odd_scenario(folder: Path) -> Path:
    data = json.loads((EXAMPLES_DIR / "group-a.json").read_text())
    data["name"] = "odd\x1b[2Jname\nsecond"
    data["description"] = "first line\nsecond line \x1b[31mred\x07"
    data["requests"][0]["id"] = "r\n0\x1b[1m"
    f = folder / "odd.json"
    f.write_text(json.dumps(data))
    return f


@pytest.mark.parametrize("command", ["run", "check", "validate"])
def test_ids_and_descriptions_are_printed_escaped(capsys, sandbox, command):
    f = _odd_scenario(sandbox)
    rc, out, err = cli(capsys, command, f)
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    if command == "run":
        assert "r\\n0\\x1b[1m" in out
        assert not any(line.startswith("0") for line in out.splitlines())  # no id broke a line
    if command != "validate":
        assert "odd\\x1b[2Jname\\nsecond" in out


def test_check_with_no_applicable_property_says_vacuous(capsys, sandbox):
    data = {"format": "schedspec.scenario/1", "name": "idle",
            "config": {"max_num_batched_tokens": 32, "max_num_seqs": 4}, "requests": [], "max_steps": 3}
    (sandbox / "idle.json").write_text(json.dumps(data))
    rc, out, err = cli(capsys, "check", "idle.json")
    assert rc == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("vacuous") and "properties hold" not in out
    rc, out, err = cli(capsys, "check", "preemption")
    assert rc == 0, err
    assert "0 violated" in out and "vacuous" in out.strip().splitlines()[-1]


# the helpers themselves ------------------------------------------------------

def test_trace_marker_is_read_from_the_header_only(tmp_path):
    import gzip

    from schedspec.reference.outputs import HEADER_BYTES, is_schedspec_trace

    head = '{"format": "schedspec.trace/1", "steps": []}'
    (tmp_path / "t.json").write_text(head)
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        f.write(head)
    late = tmp_path / "late.json"
    late.write_text(" " * (2 * HEADER_BYTES) + head)
    with gzip.open(tmp_path / "late.json.gz", "wt") as f:
        f.write(" " * (2 * HEADER_BYTES) + head)
    assert is_schedspec_trace(tmp_path / "t.json") and is_schedspec_trace(tmp_path / "t.json.gz")
    assert not is_schedspec_trace(late) and not is_schedspec_trace(tmp_path / "late.json.gz")
    assert not is_schedspec_trace("/dev/zero") and not is_schedspec_trace(tmp_path)


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_plot_marker_round_trip(tmp_path, fmt):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schedspec.reference.outputs import check_plot_path, is_schedspec_plot, plot_metadata

    ours, theirs = tmp_path / f"ours.{fmt}", tmp_path / f"theirs.{fmt}"
    for path, meta in ((ours, plot_metadata(fmt)), (theirs, None)):
        fig, ax = plt.subplots()
        ax.bar(range(500), range(500))
        fig.savefig(path, metadata=meta)
        plt.close(fig)
    assert is_schedspec_plot(ours) and not is_schedspec_plot(theirs)
    assert check_plot_path(str(ours)) == ours


def test_plain_status_line_when_not_a_terminal(capsys, monkeypatch):
    from schedspec.reference import progress as errors

    monkeypatch.delenv("SCHEDSPEC_PROGRESS", raising=False)
    monkeypatch.setattr(errors, "STATUS_EVERY_S", 0.0)
    p = errors.Progress("work\nlabel", 10)
    p(3)
    p.close()
    err = capsys.readouterr().err
    assert err.startswith("schedspec: work\\nlabel: 3/10") and err.count("\n") == 1
    monkeypatch.setenv("SCHEDSPEC_PROGRESS", "0")
    p = errors.Progress("work", 10)
    p(3)
    p.close()
    assert capsys.readouterr().err == ""
