"""`schedspec peer-tests`: fetching vLLM's sdist with `pip download`, extracting the
tests it needs, the offline model configs, the pytest plugin, the table, and one
real run of a few of vLLM's scheduler tests."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import sys
import subprocess
import tarfile
import types
from pathlib import Path

import pytest

from schedspec.reference.errors import UsageError
from schedspec.monitor import peer_environment, peer_extract, peer_fetch, peer_report, peer_run, peer_tests

SDIST = peer_fetch.SDIST_NAME
TOP = f"vllm-{peer_fetch.VLLM_VERSION}"

# A tiny source distribution: the layout of vLLM's, a few files.
FAKE_FILES = {
    "pyproject.toml": '[tool.pytest.ini_options]\nmarkers = ["slow_test"]\n',
    "setup.py": "raise SystemExit('not for running')\n",
    "tests/__init__.py": "",
    "tests/conftest.py": "import pytest\nfrom tests.helpers.common import VALUE\n\n"
                         "@pytest.fixture\ndef value():\n    return VALUE\n",
    "tests/helpers/__init__.py": "",
    "tests/helpers/common.py": "VALUE = 7\n",
    "tests/helpers/deep.py": "from .common import VALUE\nDEEP = VALUE + 1\n",
    "tests/unrelated.py": "import nothing_here\n",
    "tests/other/test_far.py": "def test_far():\n    pass\n",
    "tests/other/conftest.py": "raise RuntimeError('not ours')\n",
    "tests/v1/__init__.py": "",
    "tests/v1/core/__init__.py": "",
    "tests/v1/core/utils.py": "def helper():\n    from tests.helpers import deep\n    return deep.DEEP\n",
    "tests/v1/core/test_a.py": "from .utils import helper\n\n"
                               "def test_ok(value):\n    assert value == 7 and helper() == 8\n\n"
                               "def test_fails():\n    assert False, 'plain failure'\n",
    "tests/v1/core/data/table.txt": "not python\n",
}


def make_sdist(path: Path, files: dict[str, str] = FAKE_FILES) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{TOP}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


@pytest.fixture
def fake_sdist(tmp_path) -> Path:
    path = tmp_path / "src" / SDIST
    path.parent.mkdir()
    make_sdist(path)
    return path


def pip_env(links: Path) -> dict[str, str]:
    """An environment whose pip reads no configuration file and no index, and
    finds distributions only in the folder `links` (offline)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links))
    return env


# vLLM's own build requirements include torch: pip cannot install them offline, so
# a download that gets through shows that pip did not try.
BUILD_SYSTEM = '[build-system]\nrequires = ["setuptools>=77.0.3", "torch==2.14.0"]\nbuild-backend = "setuptools.build_meta"\n\n'


def downloadable_sdist(links: Path, files: dict[str, str] = FAKE_FILES) -> Path:
    """A fake sdist in `links` as pip finds one: with PKG-INFO and vLLM's build-system table."""
    links.mkdir(parents=True, exist_ok=True)
    path = links / SDIST
    make_sdist(path, {**files, "PKG-INFO": f"Metadata-Version: 2.4\nName: vllm\nVersion: {peer_fetch.VLLM_VERSION}\n"
                                          "Summary: a stand-in\n\nThe description.\n",
                      "pyproject.toml": BUILD_SYSTEM + files["pyproject.toml"]})
    return path


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


# --- fetching: pip download ----------------------------------------------------------------------

def test_fetch_downloads_with_pip_and_reuses_the_kept_sdist(tmp_path):
    links = tmp_path / "links"
    source = downloadable_sdist(links)
    root = tmp_path / "cache"
    said: list[str] = []
    got = peer_fetch.fetch_sdist(root, env=pip_env(links), status=said.append)
    assert got == root / SDIST and got.read_bytes() == source.read_bytes()
    assert (root / f"{SDIST}.sha256").read_text().strip() == hashlib.sha256(source.read_bytes()).hexdigest()
    assert sorted(p.name for p in root.iterdir()) == [SDIST, f"{SDIST}.sha256"]  # nothing of pip's left
    assert len(said) == 1 and said[0].startswith(f"downloading {SDIST} with pip")
    # Kept: no second download, although pip could not give it now.
    source.unlink()
    assert peer_fetch.fetch_sdist(root, env=pip_env(links), status=said.append) == got and len(said) == 1
    # A kept copy that no longer matches its recorded sha256 is downloaded again: pip
    # fails now, and the copy is left as it was.
    got.write_bytes(b"damaged")
    with pytest.raises(UsageError, match="pip download of"):
        peer_fetch.fetch_sdist(root, env=pip_env(links), status=said.append)
    assert len(said) == 2 and got.read_bytes() == b"damaged"
    downloadable_sdist(links)
    assert peer_fetch.fetch_sdist(root, env=pip_env(links)).read_bytes() == source.read_bytes()


def test_a_failing_pip_download_is_one_line_with_pips_error(tmp_path):
    root = tmp_path / "cache"
    (tmp_path / "links").mkdir()
    with pytest.raises(UsageError) as e:
        peer_fetch.fetch_sdist(root, env=pip_env(tmp_path / "links"))
    assert one_line(e).startswith(f"pip download of {SDIST} failed (exit 1): ERROR: No matching distribution "
                                  f"found for vllm=={peer_fetch.VLLM_VERSION}; pass --sdist PATH")
    assert list(root.iterdir()) == []  # nothing kept


def test_the_command_exits_non_zero_when_pip_download_fails(tmp_path, capsys, monkeypatch):
    from schedspec.cli.main import main

    (tmp_path / "links").mkdir()
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in pip_env(tmp_path / "links").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as e:
        main(["peer-tests", "--plain", "--cache", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "pip download of" in err[-1] and "No matching distribution" in err[-1], err


def test_pip_error_line():
    assert peer_fetch.pip_error_line("Looking in links: x\nERROR: first\n  detail\nERROR: second\n\n") == \
        "ERROR: second"
    assert peer_fetch.pip_error_line("x\nerror: metadata-generation-failed\nhint: see above\n") == \
        "error: metadata-generation-failed"
    assert peer_fetch.pip_error_line("/x/python: No module named pip\n") == "/x/python: No module named pip"
    assert peer_fetch.pip_error_line("") == "no output"


def test_no_registry_host_is_named_in_the_fetch_code():
    """pip alone knows where packages come from (its configuration)."""
    from schedspec.monitor import peer_tests

    for module in (peer_fetch, peer_tests):
        text = Path(module.__file__).read_text()
        assert "://" not in text and "pypi" not in text.lower() and "_internal" not in text


# --- extraction ----------------------------------------------------------------------------------

def test_extract_takes_the_tests_and_only_the_helpers_they_import(tmp_path, fake_sdist):
    tree = peer_extract.extract_tests(fake_sdist, tmp_path / "cache")
    got = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()
                 and p.name != peer_extract.EXTRACTED_MARKER)
    assert got == sorted(["pyproject.toml", "tests/__init__.py", "tests/conftest.py", "tests/helpers/__init__.py",
                          "tests/helpers/common.py", "tests/helpers/deep.py", "tests/v1/__init__.py",
                          "tests/v1/core/__init__.py", "tests/v1/core/utils.py", "tests/v1/core/test_a.py",
                          "tests/v1/core/data/table.txt"])
    # Reused while the sdist is the same; replaced when it changes.
    (tree / "tests" / "v1" / "core" / "mark").write_text("")
    assert peer_extract.extract_tests(fake_sdist, tmp_path / "cache") == tree and (tree / "tests/v1/core/mark").exists()
    make_sdist(fake_sdist, {**FAKE_FILES, "tests/v1/core/test_b.py": "def test_b():\n    pass\n"})
    tree = peer_extract.extract_tests(fake_sdist, tmp_path / "cache")
    assert (tree / "tests/v1/core/test_b.py").exists() and not (tree / "tests/v1/core/mark").exists()
    assert peer_extract.available_files(tree) == ["test_a.py", "test_b.py"]


def test_resolve_targets(tmp_path, fake_sdist):
    tree = peer_extract.extract_tests(fake_sdist, tmp_path / "cache")
    assert peer_extract.resolve_targets(tree, ["test_a", "test_a.py::test_ok"], False) == [
        "tests/v1/core/test_a.py", "tests/v1/core/test_a.py::test_ok"]
    assert peer_extract.resolve_targets(tree, None, True) == ["tests/v1/core"]
    with pytest.raises(UsageError, match="no such test file") as e:
        peer_extract.resolve_targets(tree, ["test_nope.py"], False)
    one_line(e)


def test_a_bad_sdist_is_a_one_line_error(tmp_path):
    bad = tmp_path / SDIST
    bad.write_bytes(b"not a tarball")
    with pytest.raises(UsageError, match="not a readable") as e:
        peer_extract.extract_tests(bad, tmp_path / "cache")
    one_line(e)
    with pytest.raises(UsageError, match="no such file"):
        peer_fetch.check_sdist(tmp_path / "missing.tar.gz")
    make_sdist(bad, {"README": "x"})
    with pytest.raises(UsageError, match="holds no tests/v1/core"):
        peer_extract.extract_tests(bad, tmp_path / "cache")


def test_imported_modules_resolves_relative_imports():
    src = b"from . import utils\nfrom ..kv import x\nimport tests.a.b\ndef f():\n    from tests.c import d\n"
    got = peer_extract.imported_modules(src, "tests/v1/core/test_x.py")
    assert {"tests.v1.core", "tests.v1.core.utils", "tests.v1.kv", "tests.v1.kv.x", "tests.a.b",
            "tests.c", "tests.c.d"} <= got


def real_sdist() -> Path | None:
    cached = peer_fetch.cache_root() / SDIST
    return cached if cached.is_file() else None


@pytest.mark.skipif(real_sdist() is None, reason="vLLM's sdist is not in the cache (schedspec peer-tests fetches it)")
def test_real_sdist_needs_the_helpers_vllms_tests_import():
    need = peer_extract.needed_files(peer_extract.read_sdist(real_sdist()))
    for rel in ("tests/__init__.py", "tests/conftest.py", "tests/utils.py", "tests/models/utils.py",
                "tests/v1/__init__.py", "tests/v1/kv_connector/unit/utils.py", "tests/v1/core/test_scheduler.py",
                "tests/v1/core/utils.py", "pyproject.toml"):
        assert rel in need
    assert not [r for r in need if r.startswith(("tests/entrypoints/", "tests/v1/engine/"))]


# --- model configs -------------------------------------------------------------------------------

def test_model_configs_are_written_as_a_hub_cache(tmp_path):
    hub = tmp_path / "hub"
    configs = peer_extract.model_configs()
    assert "facebook/opt-125m" in configs and "Qwen/Qwen3-Next-80B-A3B-Instruct" in configs
    for model_id, config in configs.items():
        assert config.get("architectures") and config.get("model_type"), model_id
    written = peer_extract.write_model_configs(hub)
    assert sorted(written) == sorted(configs)
    for model_id in written:
        repo = hub / ("models--" + model_id.replace("/", "--"))
        rev = (repo / "refs" / "main").read_text()
        assert len(rev) == 40
        assert json.loads((repo / "snapshots" / rev / "config.json").read_text()) == configs[model_id]
    with pytest.raises(ValueError):
        peer_extract.write_model_configs(hub, {"../evil": {}})


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_transformers_reads_the_configs_offline(tmp_path):
    import subprocess

    hub = tmp_path / "hf" / "hub"
    ids = peer_extract.write_model_configs(hub)
    env = peer_environment.peer_environment(tmp_path, hub)
    code = ("import sys\nfrom transformers import AutoConfig\n"
            "for m in sys.argv[1:]:\n    print(m, AutoConfig.from_pretrained(m).model_type)\n")
    proc = subprocess.run([sys.executable, "-c", code, *ids], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == len(ids)


# --- the pytest plugin ---------------------------------------------------------------------------

class StandInMonitor:
    """What schedspec.monitor.shadow.install returns, as far as the plugin uses it."""

    def __init__(self, policy, vectors_dir):
        self.policy, self.vectors_dir = policy, vectors_dir
        self.labels: list[str] = []
        self.label = None

    def begin(self, label):
        self.label = label
        self.labels.append(label)

    def end(self):
        label, self.label = self.label, None
        divergences = []
        if label.endswith("test_diverges"):
            divergences.append({"call": "schedule", "call_number": 2, "field": "num_scheduled_tokens",
                                "spec": {"a": 1}, "vllm": {"a": 2}, "vector": f"{self.vectors_dir}/v1.json"})
        return {"calls": {"schedule": {"total": 3, "checked": 2, "outside_scope": 1},
                          "update_from_output": {"total": 2, "checked": 2, "outside_scope": 0}},
                "outside_scope": {"prefix_caching": 1}, "divergences": divergences, "monitor_errors": []}


PLUGIN_TESTS = """
import os
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup broke")

def test_passes():
    pass

def test_fails():
    assert 1 == 2

def test_skips():
    pytest.skip("not here")

def test_setup_error(broken):
    pass

def test_diverges():
    pass

def test_only_plain():
    assert os.environ.get("STAND_IN_SHADOW") != "1", "fails under the monitor"

def test_needs_a_module():
    import not_installed_anywhere_zz
"""


def run_plugin(tmp_path: Path, *extra: str) -> dict:
    (tmp_path / "test_sample.py").write_text(PLUGIN_TESTS)
    (tmp_path / "test_broken_file.py").write_text("import no_such_module_here\n")
    report = tmp_path / f"report{len(list(tmp_path.glob('report*')))}.json"
    progress = tmp_path / "progress.txt"
    rc = pytest.main([str(tmp_path), "-p", "schedspec.monitor.pytest_plugin", "-p", "no:cacheprovider", "-q",
                      "--rootdir", str(tmp_path), "--continue-on-collection-errors", "--import-mode=importlib",
                      "--schedspec-report", str(report), "--schedspec-progress", str(progress), *extra])
    assert rc == 1
    lines = progress.read_text().splitlines()
    assert lines[0] == "collected 7" and len(lines) == 8
    return json.loads(report.read_text())


def stand_in_shadow(monkeypatch) -> list:
    made = []

    def install(policy="count", vectors_dir=None):
        os.environ["STAND_IN_SHADOW"] = "1"
        made.append(StandInMonitor(policy, vectors_dir))
        return made[-1]

    module = types.ModuleType("schedspec.monitor.shadow")
    module.install = install
    monkeypatch.setitem(sys.modules, "schedspec.monitor.shadow", module)
    monkeypatch.delenv("STAND_IN_SHADOW", raising=False)
    return made


def test_plugin_records_outcomes_plain(tmp_path, monkeypatch):
    made = stand_in_shadow(monkeypatch)
    data = run_plugin(tmp_path, "--schedspec-plain")
    assert made == [] and data["version"] == 1 and data["plain"] is True
    outcomes = {k.split("::")[-1]: v["outcome"] for k, v in data["tests"].items()}
    assert outcomes == {"test_passes": "passed", "test_fails": "failed", "test_skips": "skipped",
                        "test_setup_error": "error", "test_diverges": "passed", "test_only_plain": "passed",
                        "test_needs_a_module": "failed", "test_broken_file.py": "error"}
    assert all(v["stats"] is None for v in data["tests"].values())
    assert "no_such_module_here" in data["tests"]["test_broken_file.py"]["message"]
    assert data["tests"]["test_broken_file.py"]["missing_modules"] == ["no_such_module_here"]
    assert data["tests"]["test_sample.py::test_needs_a_module"]["missing_modules"] == ["not_installed_anywhere_zz"]
    assert "missing_modules" not in data["tests"]["test_sample.py::test_fails"]
    assert "setup broke" in data["tests"]["test_sample.py::test_setup_error"]["message"]
    assert "not here" in data["tests"]["test_sample.py::test_skips"]["message"]


def test_plugin_runs_each_test_under_the_monitor(tmp_path, monkeypatch):
    made = stand_in_shadow(monkeypatch)
    data = run_plugin(tmp_path, "--schedspec-vectors", str(tmp_path / "vec"), "--schedspec-policy", "log")
    assert len(made) == 1 and made[0].policy == "log" and made[0].vectors_dir == str(tmp_path / "vec")
    assert data["plain"] is False
    ran = [k for k in data["tests"] if "::" in k]
    assert sorted(made[0].labels) == sorted(ran)
    for k in ran:
        assert data["tests"][k]["stats"]["calls"]["schedule"]["checked"] == 2
    assert data["tests"]["test_sample.py::test_only_plain"]["outcome"] == "failed"
    assert data["tests"]["test_sample.py::test_diverges"]["stats"]["divergences"][0]["call_number"] == 2


# --- the table -----------------------------------------------------------------------------------

def stats(checked=2, divergences=(), errors=()):
    return {"calls": {"schedule": {"total": checked + 1, "checked": checked, "outside_scope": 1}},
            "outside_scope": {"spec_decode": 1}, "divergences": list(divergences), "monitor_errors": list(errors)}


def report(plain: bool, tests: dict, missing: dict | None = None) -> dict:
    data = {"version": 1, "plain": plain,
            "tests": {k: {"outcome": o, "message": m, "stats": None if plain else s} for k, (o, m, s) in tests.items()}}
    for k, modules in (missing or {}).items():
        data["tests"][k]["missing_modules"] = modules
    return data


DIV = {"call": "schedule", "call_number": 4, "field": "scheduled", "spec": 1, "vllm": 2, "vector": "/v/a.json"}
F1, F2 = "tests/v1/core/test_scheduler.py", "tests/v1/core/test_prefix_caching.py"


def test_table_counts_per_file_and_flags_what_fails_the_run():
    plain = report(True, {f"{F1}::a": ("passed", None, None), f"{F1}::b": ("failed", "ValueError: no config", None),
                          f"{F1}::c": ("passed", None, None), f"{F2}::d": ("passed", None, None),
                          f"{F2}::e": ("skipped", "no gpu", None)}, missing={f"{F1}::b": ["torchvision"]})
    shadow = report(False, {
        f"{F1}::a": ("passed", None, stats()),
        f"{F1}::b": ("failed", "ValueError: no config", stats(divergences=[DIV])),  # fails plain: not counted
        f"{F1}::c": ("failed", "AssertionError: boom", stats()),                     # plain pass, shadow fail
        f"{F2}::d": ("passed", None, stats(checked=5, divergences=[DIV], errors=[{"call": "schedule",
                                                                                   "call_number": 1,
                                                                                   "error": "KeyError: x"}])),
        f"{F2}::e": ("skipped", "no gpu", None)})
    t = peer_report.build_table(plain, shadow)
    assert [r["file"] for r in t["files"]] == ["test_prefix_caching.py", "test_scheduler.py"]
    sched = t["files"][1]
    assert sched["collected"] == 3 and sched["plain"] == {"passed": 2, "failed": 1, "error": 0, "skipped": 0}
    assert sched["shadow"]["passed"] == 1 and sched["plain_pass_shadow_fail"] == 1
    assert sched["divergences"] == 0 and sched["divergences_not_counted"] == 1
    assert sched["calls_checked"] == 6 and sched["calls_total"] == 9 and sched["outside_scope"] == {"spec_decode": 3}
    pc = t["files"][0]
    assert pc["divergences"] == 1 and pc["monitor_errors"] == 1 and pc["calls_checked"] == 5
    assert t["totals"]["collected"] == 5 and t["totals"]["divergences"] == 1
    assert [p["test"] for p in t["plain_pass_shadow_fail"]] == [f"{F1}::c"]
    assert [(d["test"], d["counted"], d["vector"]) for d in t["divergences"]] == [
        (f"{F2}::d", True, "/v/a.json"), (f"{F1}::b", False, "/v/a.json")]
    assert t["plain_failure_causes"] == [{"cause": "ValueError: no config (not installed: torchvision)", "tests": 1}]
    assert t["exit_status"] == 1
    text = peer_report.format_table(t)
    assert "test_scheduler.py" in text and f"{F2}::d  schedule #4 field scheduled; state vector /v/a.json" in text
    assert "not counted" in text and "passed plain, not under the monitor" in text and "FAIL" in text


def test_every_scope_feature_prints_whole_in_the_table():
    """The outside-scope line cuts what a subprocess reports at a length no feature
    name of scope.py reaches: each one prints whole."""
    from schedspec.monitor import scope

    names = [v for k, v in vars(scope).items() if k.isupper() and isinstance(v, str) and not k.startswith("_")]
    s = stats()
    s["outside_scope"] = {name: 1 for name in names}
    shadow = report(False, {f"{F1}::a": ("passed", None, s)})
    text = peer_report.format_table(peer_report.build_table(None, shadow))
    line = next(x for x in text.splitlines() if x.startswith("calls outside the spec's scope"))
    assert "characters)" not in line
    for name in names:
        assert f"{name} 1" in line, name


def test_failure_causes_name_pydantics_own_line():
    msg = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
           "  Value error, Model architectures ['X'] failed to be inspected. [type=value_error, input_value=1]")
    plain = report(True, {f"{F1}::a": ("failed", msg, None), f"{F1}::b": ("error", msg, None)})
    (cause,) = peer_report.build_table(plain, None)["plain_failure_causes"]
    assert cause == {"cause": "ValidationError (ModelConfig): Value error, Model architectures ['X'] failed to be "
                              "inspected.", "tests": 2}


def test_table_plain_failures_alone_do_not_fail_the_run():
    plain = report(True, {f"{F1}::a": ("passed", None, None), f"{F1}::b": ("failed", "x", None)})
    shadow = report(False, {f"{F1}::a": ("passed", None, stats()),
                            f"{F1}::b": ("failed", "x", stats(divergences=[DIV]))})
    t = peer_report.build_table(plain, shadow)
    assert t["exit_status"] == 0 and t["totals"]["divergences"] == 0
    assert "ok: no divergence" in peer_report.format_table(t)
    only_plain = peer_report.build_table(plain, None)
    assert only_plain["modes"] == ["plain"] and only_plain["exit_status"] == 0
    assert "shadow" not in peer_report.format_table(only_plain).splitlines()[1]


def test_a_test_missing_from_the_shadowed_run_is_flagged():
    plain = report(True, {f"{F1}::a": ("passed", None, None)})
    t = peer_report.build_table(plain, report(False, {}))
    assert t["plain_pass_shadow_fail"][0]["outcome"] == "not run" and t["exit_status"] == 1


# --- the runner, with a stand-in monitor -----------------------------------------------------------

STAND_IN_PLUGIN = '''
import os, sys, types

class Monitor:
    def begin(self, label):
        self.label = label
    def end(self):
        divs = [{"call": "schedule", "call_number": 1, "field": "f", "spec": 0, "vllm": 1,
                 "vector": None}] if self.label.endswith("test_diverges") else []
        return {"calls": {"schedule": {"total": 1, "checked": 1, "outside_scope": 0}},
                "outside_scope": {}, "divergences": divs, "monitor_errors": []}

def install(policy="count", vectors_dir=None):
    os.environ["STAND_IN_SHADOW"] = "1"
    return Monitor()

module = types.ModuleType("schedspec.monitor.shadow")
module.install = install
sys.modules["schedspec.monitor.shadow"] = module
'''


# The fake sessions load none of the plugins this interpreter's packages bring (vLLM's tests
# may use them; these do not): Hypothesis's alone takes 0.7 s to import, in each session.
QUIET_SESSION = ("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:xdist", "-p", "no:xdist.looponfail")


def test_run_pytest_plain_and_shadowed_builds_the_table(tmp_path, fake_sdist):
    files = {**FAKE_FILES, "tests/v1/core/test_b.py":
             "import os\n\ndef test_only_plain():\n    assert os.environ.get('STAND_IN_SHADOW') != '1'\n\n"
             "def test_diverges():\n    pass\n"}
    make_sdist(fake_sdist, files)
    root = tmp_path / "cache"
    tree = peer_extract.extract_tests(fake_sdist, root)
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "stand_in_shadow.py").write_text(STAND_IN_PLUGIN)
    env = peer_environment.peer_environment(root, root / "hf" / "hub", [tmp_path / "plug"])
    env.pop("STAND_IN_SHADOW", None)
    targets = peer_extract.resolve_targets(tree, None, True)
    run_dir = peer_run.new_run_dir(root)
    extra = ["-p", "stand_in_shadow", *QUIET_SESSION]
    plain = peer_run.run_pytest(tree, targets, run_dir, env, plain=True, extra_args=extra, show_progress=False)
    shadow = peer_run.run_pytest(tree, targets, run_dir, env, plain=False, vectors_dir=tmp_path / "v",
                           extra_args=extra, show_progress=False)
    assert plain.returncode == 1 and plain.log.is_file()
    t = peer_report.build_table(plain.report, shadow.report)
    row = {r["file"]: r for r in t["files"]}
    assert row["test_a.py"]["plain"]["passed"] == 1 and row["test_a.py"]["plain"]["failed"] == 1
    assert row["test_b.py"]["plain"]["passed"] == 2 and row["test_b.py"]["shadow"]["passed"] == 1
    assert [p["test"] for p in t["plain_pass_shadow_fail"]] == ["tests/v1/core/test_b.py::test_only_plain"]
    assert [d["test"] for d in t["divergences"]] == ["tests/v1/core/test_b.py::test_diverges"]
    assert t["exit_status"] == 1 and t["totals"]["calls_checked"] == 4
    # -k passes through.
    only = peer_run.run_pytest(tree, targets, run_dir, env, plain=True, keyword="test_ok", extra_args=extra,
                         show_progress=False)
    assert list(only.report["tests"]) == ["tests/v1/core/test_a.py::test_ok"] and only.returncode == 0


def test_run_peer_tests_on_a_fake_sdist(tmp_path, fake_sdist):
    cache = tmp_path / "cache"
    for module in peer_environment.TEST_DEPENDENCIES:  # nothing to install: the fake tests import none of them
        (cache / "deps" / module).mkdir(parents=True)
    options = peer_tests.PeerTestOptions(files=["test_a.py"], plain_only=True, sdist=str(fake_sdist), cache=str(cache))
    table = peer_tests.run_peer_tests(options, show_progress=False)
    assert table["modes"] == ["plain"] and table["totals"]["plain"]["passed"] == 1
    assert table["plain_failure_causes"][0]["cause"].startswith("AssertionError: plain failure")
    assert (cache / "hf" / "hub" / "models--facebook--opt-125m" / "refs" / "main").is_file()
    options.keyword = "no_such_test"
    with pytest.raises(UsageError, match="no test selected .* by -k no_such_test") as e:
        peer_tests.run_peer_tests(options, show_progress=False)
    one_line(e)


def fake_peer_run(tmp_path, fake_sdist, monkeypatch):
    """A fake sdist of three files (a plain failure, a test that fails only
    shadowed, a divergence) and the stand-in monitor; returns run(name, **options),
    which runs the whole tree with its own cache folder and gives the table."""
    files = {**FAKE_FILES, "tests/v1/core/test_b.py":
             "import os\n\ndef test_only_plain():\n    assert os.environ.get('STAND_IN_SHADOW') != '1'\n\n"
             "def test_diverges():\n    pass\n",
             "tests/v1/core/test_c.py": "def test_c():\n    pass\n"}
    make_sdist(fake_sdist, files)
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "stand_in_shadow.py").write_text(STAND_IN_PLUGIN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "plug"))
    monkeypatch.delenv("STAND_IN_SHADOW", raising=False)

    def run(name: str, **options):
        cache = tmp_path / f"cache-{name}"
        for module in peer_environment.TEST_DEPENDENCIES:  # nothing to install: the fake tests import none of them
            (cache / "deps" / module).mkdir(parents=True)
        return peer_tests.run_peer_tests(peer_tests.PeerTestOptions(all_files=True, sdist=str(fake_sdist), cache=str(cache),
                                                    extra_pytest_args=("-p", "stand_in_shadow", *QUIET_SESSION), **options),
                                 show_progress=False)
    return run


def test_run_peer_tests_gives_the_same_table_whatever_the_workers(tmp_path, fake_sdist, monkeypatch):
    run = fake_peer_run(tmp_path, fake_sdist, monkeypatch)
    tables = {}
    for workers in (1, 2, 4):
        table = run(f"{workers}", workers=workers)
        assert table["run"]["pytest_sessions"] == {1: 2, 2: 2, 4: 4}[workers]
        tables[workers] = {k: v for k, v in table.items() if k != "run"}
    t = tables[1]
    assert t["totals"]["collected"] == 5 and [d["test"] for d in t["divergences"]] == [
        "tests/v1/core/test_b.py::test_diverges"]
    assert tables[2] == t and tables[4] == t
    assert peer_run.file_groups(["a", "b", "c"], 2) == [["a", "c"], ["b"]] and peer_run.file_groups(["a"], 4) == [["a"]]
    assert peer_run.file_groups(["a::x", "b", "a::y"], 2) == [["a::x", "a::y"], ["b"]]


def test_plain_for_failures_gives_the_full_runs_verdict(tmp_path, fake_sdist, monkeypatch):
    """`--plain-for failures`: shadowed first, then plain only what failed or
    diverged; the verdict, the divergences counted and the pass->fail list are
    those of the full run, and the tests not rerun are marked inferred."""
    run = fake_peer_run(tmp_path, fake_sdist, monkeypatch)
    tables = {plain_for: run(plain_for, workers=1, plain_for=plain_for) for plain_for in ("all", "failures")}
    full, lazy = tables["all"], tables["failures"]
    assert lazy["exit_status"] == full["exit_status"] == 1
    assert lazy["divergences"] == full["divergences"] and lazy["plain_pass_shadow_fail"] == full["plain_pass_shadow_fail"]
    assert [f["test"] for f in lazy["plain_failures"]] == [f["test"] for f in full["plain_failures"]]
    assert lazy["files"] == full["files"]
    # Rerun plain: test_a's plain failure, test_only_plain (fails shadowed) and test_diverges.
    assert lazy["run"]["plain_inferred"] == 2 and full["run"]["plain_inferred"] == 0
    with pytest.raises(UsageError, match="--plain-for"):
        peer_tests.run_peer_tests(peer_tests.PeerTestOptions(plain_for="some", sdist=str(fake_sdist), cache=str(tmp_path / "c")),
                          show_progress=False)


def test_a_failure_on_a_missing_package_before_any_call_is_not_rerun():
    """`--plain-for failures` infers the plain outcome of a test that failed on a
    package this machine lacks before any scheduler call (the monitor acts only
    through those calls), with the failure's message and modules, also where the
    output names no module but the failure's first line is one that did (vLLM
    logs a failed model inspection once); a failure on a missing package after a
    call, one with a monitor error, and another failure are rerun."""
    def calls(n):
        return {name: {"total": n if name == "schedule" else 0, "checked": n}
                for name in ("schedule", "update_from_output", "add_request", "finish_requests")}

    def entry(outcome, n=0, missing=("mistral_common",), errors=(), message="ValidationError: mm model failed"):
        e = {"outcome": outcome, "message": message,
             "stats": {"calls": calls(n), "outside_scope": {}, "divergences": [], "monitor_errors": list(errors)}}
        if missing:
            e["missing_modules"] = list(missing)
        return e

    shadow = {"tests": {"f.py::a_missing": entry("failed"), "f.py::b_missing_setup": entry("error"),
                        "f.py::c_missing_after_call": entry("failed", n=1),
                        "f.py::d_monitor_error": entry("failed", errors=[{"call": "end", "error": "x"}]),
                        "f.py::e_plain_failure": entry("failed", missing=(), message="AssertionError: 1 == 2"),
                        "f.py::h_same_message": entry("failed", missing=()),
                        "f.py::f_passed": entry("passed", missing=()),
                        "f.py::g_no_stats": {**entry("failed"), "stats": None}}}
    rerun = peer_run.needs_plain_run(shadow)
    assert rerun == ["f.py::c_missing_after_call", "f.py::d_monitor_error", "f.py::e_plain_failure",
                     "f.py::g_no_stats"]
    plain = {"tests": {nodeid: {"outcome": "failed", "message": "plain"} for nodeid in rerun}}
    merged = peer_run.plain_report_where_needed(shadow, plain)["tests"]
    assert merged["f.py::a_missing"] == {"outcome": "failed", "inferred": True, "missing_modules": ["mistral_common"],
                                         "message": "ValidationError: mm model failed"}
    assert merged["f.py::h_same_message"] == merged["f.py::a_missing"]
    assert merged["f.py::b_missing_setup"]["outcome"] == "error" and merged["f.py::b_missing_setup"]["inferred"]
    assert merged["f.py::f_passed"] == {"outcome": "passed", "inferred": True}
    assert all(merged[nodeid] == {"outcome": "failed", "message": "plain"} for nodeid in rerun)
    # In the table the inferred failure is a plain failure with its cause, not a spec failure.
    table = peer_report.build_table(peer_run.plain_report_where_needed(shadow, plain), shadow)
    assert {f["test"]: f["missing_modules"] for f in table["plain_failures"]}["f.py::a_missing"] == ["mistral_common"]


# --- the command ---------------------------------------------------------------------------------

def test_cli_errors_are_one_line(tmp_path, capsys):
    from schedspec.cli.main import main

    for argv, needle in ((["peer-tests", "--sdist", str(tmp_path / "none.tar.gz"), "--cache", str(tmp_path)],
                          "no such file"),
                         (["peer-tests", "--all", "--files", "test_scheduler.py"], "not allowed with"),
                         (["peer-tests", "--plain", "--vectors-out", str(tmp_path)], "--vectors-out"),
                         (["peer-tests", "--plain", "--plain-for", "failures"], "--plain-for")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and needle in err and len(err.splitlines()) == 1, err
    existing = tmp_path / "t.json"
    existing.write_text("{}")
    with pytest.raises(SystemExit) as e:
        main(["peer-tests", "--json-out", str(existing), "--sdist", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "not overwriting" in err and existing.read_text() == "{}"
    with pytest.raises(SystemExit) as e:
        main(["peer-tests", "--json-out", str(tmp_path), "--force", "--sdist", str(tmp_path / "none")])
    assert e.value.code == 2 and "is a folder" in capsys.readouterr().err


def test_force_lets_json_out_replace_a_file(tmp_path):
    from schedspec.cli.peer_tests import check_json_out, write_json

    existing = tmp_path / "t.json"
    existing.write_text("{}")
    with pytest.raises(UsageError, match="--force"):
        check_json_out(str(existing), force=False)
    write_json(check_json_out(str(existing), force=True), {"a": 1})
    assert json.loads(existing.read_text()) == {"a": 1}


# --- one real run ----------------------------------------------------------------------------------

REAL_TESTS = ["test_scheduler.py::test_add_requests", "test_scheduler.py::test_finish_request",
              "test_scheduler.py::test_get_num_unfinished_requests", "test_scheduler.py::test_schedule"]


def obtainable_sdist() -> Path | None:
    cached = real_sdist()
    if cached is not None:
        return cached
    try:
        return peer_fetch.fetch_sdist(peer_fetch.cache_root())
    except UsageError:
        return None


# Long: CI runs these tests and the rest of their five files shadowed beside the
# suite (`schedspec peer-tests --plain-for failures` in .ci/run); the fake-sdist
# tests above cover the runner itself.
@pytest.mark.long
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (schedspec install-vllm)")
def test_real_run_of_a_few_vllm_scheduler_tests(tmp_path):
    sdist = obtainable_sdist()
    if sdist is None:
        from conftest import vllm_required

        if vllm_required():
            pytest.fail("vLLM's sdist cannot be obtained (no network, no cached copy), and CI requires it")
        pytest.skip("vLLM's sdist cannot be obtained (no network, no cached copy)")
    shadowed = importlib.util.find_spec("schedspec.monitor.shadow") is not None
    # Plain runs only where a shadowed test fails (CI's mode; the same verdict in half
    # the time): the plain counts are then inferred from the shadowed passes.
    options = peer_tests.PeerTestOptions(files=REAL_TESTS, sdist=str(sdist), plain_only=not shadowed,
                                 plain_for="failures", vectors_dir=str(tmp_path / "vectors"))
    table = peer_tests.run_peer_tests(options, show_progress=False)
    (row,) = table["files"]
    assert row["file"] == "test_scheduler.py" and row["collected"] >= len(REAL_TESTS)
    assert row["plain"]["passed"] == row["collected"], table["plain_failures"]
    if shadowed:
        assert row["calls_total"] > 0, row
        assert table["exit_status"] == 0, peer_report.format_table(table)
        assert row["shadow"]["passed"] == row["collected"]


def test_a_release_environment_running_another_schedspec_is_refused(tmp_path, monkeypatch):
    """A release environment whose schedspec is another checkout's (or gone) would run
    other code than this one without a word: `peer-tests --version X` refuses it in one
    line naming the fix, and this interpreter passes."""
    assert peer_environment.foreign_schedspec(sys.executable) is None
    elsewhere, gone = tmp_path / "elsewhere", tmp_path / "gone"
    elsewhere.write_text("#!/bin/sh\necho /some/other/clone/cli/package/__init__.py\n")
    gone.write_text("#!/bin/sh\necho 'ModuleNotFoundError: schedspec' >&2\nexit 1\n")
    for script in (elsewhere, gone):
        script.chmod(0o755)
    assert "runs schedspec from /some/other/clone/cli/package, not this one" in \
        peer_environment.foreign_schedspec(str(elsewhere))
    assert "cannot import schedspec" in peer_environment.foreign_schedspec(str(gone))
    monkeypatch.setattr(peer_environment, "installed_vllm", lambda: None)
    monkeypatch.setattr(peer_environment, "release_env_python", lambda version: elsewhere)
    with pytest.raises(UsageError, match=r"--version 0\.30\.0: .* runs schedspec from .*install-vllm --version 0\.30\.0") \
            as e:
        peer_environment.release_python("0.30.0")
    one_line(e)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (schedspec install-vllm)")
def test_the_plugin_bridges_vllms_cpu_platform_when_it_is_imported(tmp_path):
    """The plugin's Triton bridge (0.34.0) is made when vLLM's CPU platform is first
    imported, not at the session's start: a session that never imports vLLM does
    not pay torch's import, and one that does finds the platform bridged."""
    from schedspec.monitor.peer_environment import installed_vllm
    from schedspec.reference.vllm_adapter import TRITON_CHECKED_SINCE
    from schedspec.spec.versions import release_key

    bridged = release_key(installed_vllm()) >= release_key(TRITON_CHECKED_SINCE)
    (tmp_path / "test_order.py").write_text(
        "import sys\n\n"
        "def test_vllm_not_imported_by_the_plugin():\n"
        "    assert 'vllm.platforms.cpu' not in sys.modules and 'torch' not in sys.modules\n\n"
        "def test_bridged_once_imported():\n"
        "    from vllm.platforms.cpu import CpuPlatform\n"
        "    hook = CpuPlatform.__dict__['check_and_update_config'].__func__\n"
        f"    assert getattr(hook, 'schedspec_bridge', False) is {bridged}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "schedspec.monitor.pytest_plugin",
                        "--schedspec-plain", "-p", "no:cacheprovider", *QUIET_SESSION, "test_order.py"],
                       cwd=tmp_path, env={**env, "VLLM_TARGET_DEVICE": "cpu"}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "2 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-2000:]
