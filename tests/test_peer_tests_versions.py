"""`schedspec peer-tests --version X`: release X's own tests/v1/core, run by its own
interpreter (`schedspec install-vllm --version X`), against the spec gated to X.

The first tests need no vLLM.  The others run where release X's environment is
on the machine and are skipped with the install command as the reason (as
tests/test_vllm_releases.py does): the shadow module's per-release bridges
checked in each release's interpreter, and a few of vLLM 0.20.0's and 0.30.0's
own scheduler tests run plain and shadowed, the table checked.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from schedspec.reference.errors import UsageError
from helpers import python_of
from schedspec.cli.vllm_version import env_python, installed_vllm
from schedspec.monitor import peer_environment, peer_extract, peer_fetch, peer_report, peer_tests
from schedspec.spec.versions import RELEASES, release_key

ROOT = Path(__file__).resolve().parents[1]


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def make_sdist(path: Path, version: str, files: dict[str, str]) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


OLD_FILES = {  # the default files of 0.20.0 and 0.25.0: no test_priority_preemption_bug.py
    "pyproject.toml": "[tool.pytest.ini_options]\n",
    "tests/v1/core/test_scheduler.py": "def test_a():\n    pass\n",
    "tests/v1/core/test_async_scheduler.py": "def test_b():\n    pass\n",
    "tests/v1/core/test_prefix_caching.py": "def test_c():\n    pass\n",
    "tests/v1/core/test_priority_scheduler_random.py": "def test_d():\n    pass\n",
    "tests/v1/core/test_output.py": "def test_e():\n    pass\n",
}


# --- without vLLM --------------------------------------------------------------------------------

def test_a_release_gets_the_default_files_it_has(tmp_path):
    sdist = make_sdist(tmp_path / "vllm-0.20.0.tar.gz", "0.20.0", OLD_FILES)
    tree = peer_extract.extract_tests(sdist, tmp_path / "cache", version="0.20.0")
    assert tree == tmp_path / "cache" / "vllm-0.20.0"
    have, lacking = peer_extract.default_files(tree)
    assert lacking == ["test_priority_preemption_bug.py"]
    assert have == ["test_scheduler.py", "test_async_scheduler.py", "test_prefix_caching.py",
                    "test_priority_scheduler_random.py"]
    assert peer_extract.resolve_targets(tree, None, False) == [f"{peer_extract.TEST_ROOT}/{f}" for f in have]
    with pytest.raises(UsageError, match="no such test file") as e:
        peer_extract.resolve_targets(tree, ["test_priority_preemption_bug.py"], False)
    one_line(e)


def test_an_sdist_of_another_release_is_refused(tmp_path):
    sdist = make_sdist(tmp_path / "x.tar.gz", "0.30.0", OLD_FILES)
    with pytest.raises(UsageError, match=r"vllm-0\.30\.0's source distribution, not vLLM 0\.20\.0's") as e:
        peer_extract.read_sdist(sdist, "0.20.0")
    one_line(e)
    assert "tests/v1/core/test_scheduler.py" in peer_extract.read_sdist(sdist, "0.30.0")


def test_fetch_takes_the_release_s_sdist_with_pip(tmp_path):
    """`pip download vllm==X`: release X's sdist of those pip finds (offline here:
    no index, one folder of links), kept under its own name."""
    links = tmp_path / "links"
    for v in ("0.20.0", "0.33.0"):
        make_sdist(links / peer_fetch.sdist_name(v), v,
                   {**OLD_FILES, "PKG-INFO": f"Metadata-Version: 2.4\nName: vllm\nVersion: {v}\n"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links))
    got = peer_fetch.fetch_sdist(tmp_path / "cache", env=env, version="0.20.0")
    assert got == tmp_path / "cache" / "vllm-0.20.0.tar.gz" and got.read_bytes() == (links / got.name).read_bytes()
    assert "tests/v1/core/test_scheduler.py" in peer_extract.read_sdist(got, "0.20.0")
    with pytest.raises(UsageError, match=r"No matching distribution found for vllm==0\.30\.0") as e:
        peer_fetch.fetch_sdist(tmp_path / "cache", env=env, version="0.30.0")
    one_line(e)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["vllm-0.20.0.tar.gz", "vllm-0.20.0.tar.gz.sha256"]


def test_names_and_dependencies_per_release(tmp_path):
    assert [peer_fetch.sdist_name(v) for v in ("0.20.0", "0.33.0")] == ["vllm-0.20.0.tar.gz", "vllm-0.33.0.tar.gz"]
    assert peer_fetch.sdist_name() == peer_fetch.SDIST_NAME
    assert peer_environment.release_test_dependencies("0.20.0")["compressed_tensors"] == "compressed-tensors==0.15.0.1"
    assert peer_environment.release_test_dependencies("0.30.0") == peer_environment.TEST_DEPENDENCIES == peer_environment.release_test_dependencies()
    assert peer_environment.deps_dir(tmp_path) == tmp_path / "deps" and peer_environment.deps_dir(tmp_path, "0.25.0") == tmp_path / "deps-0.25.0"
    with pytest.raises(UsageError, match="0.19.0: not a vLLM release") as e:
        peer_fetch.check_version("0.19.0")
    one_line(e)


def test_a_missing_release_environment_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDSPEC_CACHE", str(tmp_path))
    assert all(peer_environment.release_env_python(v) == env_python(v) for v in RELEASES)  # where install-vllm puts it
    missing = next((v for v in RELEASES if v != installed_vllm() and v != peer_fetch.VLLM_VERSION), None)
    with pytest.raises(UsageError, match=rf"schedspec install-vllm --version {missing}`") as e:
        peer_environment.release_python(missing)
    one_line(e)
    options = peer_tests.PeerTestOptions(version=missing, cache=str(tmp_path / "c"))
    with pytest.raises(UsageError, match="not installed for schedspec"):
        peer_tests.prepare(options)
    assert not (tmp_path / "c").exists()  # refused before anything is fetched


def test_cli_version_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from schedspec.cli.main import main

    monkeypatch.setenv("SCHEDSPEC_CACHE", str(tmp_path))
    missing = next(v for v in RELEASES if v != installed_vllm() and v != peer_fetch.VLLM_VERSION)
    for argv, needle in ((["peer-tests", "--version", "0.19.0"], "not a vLLM release"),
                         (["peer-tests", "--version", missing], f"install-vllm --version {missing}")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and needle in err and len(err.splitlines()) == 1, err


def test_scope_init_fields_per_release():
    from schedspec.monitor import scope

    assert scope.init_fields("0.34.0") == scope._INIT_FIELDS
    assert scope.init_fields("0.33.0") == scope.init_fields("0.31.0") == scope._INIT_FIELDS - {"async_kv_waiting"}
    assert "kv_holding_waiting" not in scope.init_fields("0.30.0")
    assert {"hash_block_size", "kv_holding_waiting"}.isdisjoint(scope.init_fields("0.25.0"))
    assert "current_step" not in scope.init_fields("0.20.0") and "current_step" in scope.init_fields("0.25.0")


# --- in each release's interpreter -----------------------------------------------------------------

# What shadow.py bridges in the release's interpreter, as JSON.
PROBE = r'''
import json
from schedspec.monitor import scope, shadow
from vllm.v1.core.sched.scheduler import Scheduler

out = {"release": shadow.RELEASE, "ghost": shadow.GHOST_COUNTERS, "attributes": sorted(shadow.RELEASE_ATTRIBUTES),
       "base": shadow.ShadowScheduler.__mro__[1] is Scheduler, "init_fields": sorted(scope.init_fields())}
shadow.install()
out["installed_attributes"] = sorted(k for k in shadow.RELEASE_ATTRIBUTES if k in Scheduler.__dict__)
shadow.uninstall()
out["after_uninstall"] = sorted(k for k in shadow.RELEASE_ATTRIBUTES if k in Scheduler.__dict__)
out["finished"] = [d.request_id for d in shadow.finished_requests([("a", 0), ("b", 1)])]
# The Triton bridge the pytest plugin applies (pytest_load_initial_conftests): from 0.34.0
# the CPU platform's config hook runs with HAS_TRITON read as true, and only while it runs.
from schedspec.reference import vllm_adapter
from schedspec.spec.versions import release_key
from vllm.platforms.cpu import CpuPlatform
if release_key(shadow.RELEASE) >= release_key(vllm_adapter.TRITON_CHECKED_SINCE):
    vllm_adapter.bridge_cpu_platform_check()
out["triton_bridged"] = getattr(CpuPlatform.__dict__["check_and_update_config"].__func__, "schedspec_bridge", False)
if out["triton_bridged"]:  # a VllmConfig as vLLM's tests build one, through the bridged hook
    from schedspec.reference.vllm_adapter import model_dir
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig
    VllmConfig(model_config=ModelConfig(model=model_dir(64), skip_tokenizer_init=True, max_model_len=64),
               scheduler_config=SchedulerConfig(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=4,
                                                is_encoder_decoder=False))
    import vllm.triton_utils
    out["has_triton_after"] = bool(vllm.triton_utils.HAS_TRITON)
print("PROBE " + json.dumps(out))
'''


@pytest.mark.parametrize("release", RELEASES)
def test_shadow_bridges_in_each_release(release):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    p = subprocess.run([str(python_of(release)), "-c", PROBE], capture_output=True, text=True, env=env,
                       timeout=300, cwd=ROOT)
    lines = [x for x in p.stdout.splitlines() if x.startswith("PROBE ")]
    assert p.returncode == 0 and lines, p.stderr[-3000:]
    got = json.loads(lines[0][6:])
    old = release in ("0.20.0", "0.25.0")
    assert got["release"] == release and got["base"] is True
    assert got["ghost"] is old  # in-flight counters kept by the monitor before 0.28.0
    assert got["attributes"] == (["hash_block_size"] if old else [])
    assert got["installed_attributes"] == got["attributes"] and got["after_uninstall"] == []
    assert got["finished"] == ["a", "b"]
    assert got["triton_bridged"] is (release_key(release) >= release_key("0.34.0"))
    assert got.get("has_triton_after", False) is False
    from schedspec.monitor import scope

    assert got["init_fields"] == sorted(scope.init_fields(release))


def cached_or_fetched_sdist(release: str) -> Path:
    cached = peer_fetch.cache_root() / peer_fetch.sdist_name(release)
    if cached.is_file():
        return cached
    try:
        return peer_fetch.fetch_sdist(peer_fetch.cache_root(), version=release)
    except UsageError as e:
        pytest.skip(f"vLLM {release}'s sdist cannot be obtained: {e}")


# test_preempt_during_execution: two schedule() calls before an update (the in-flight
# counters 0.20.0 lacks); test_finish_request: finish_requests' answer;
# test_scheduler_stats_waiting_queues: requests put in skipped_waiting by hand, with
# a remote-KV status (its schedule() is outside scope: "KV connector"; up to 0.30.0
# scope.py reads the skipped_waiting queue for it).
REAL_TESTS = ["test_scheduler.py::test_add_requests", "test_scheduler.py::test_finish_request",
              "test_scheduler.py::test_preempt_during_execution", "test_scheduler.py::test_stop_via_update_from_output",
              "test_scheduler.py::test_scheduler_stats_waiting_queues"]


# The suite runs plain only where a shadowed test fails (half the time);
# scripts/long-tests.sh runs both in full.
@pytest.mark.parametrize("plain_for", ["failures", pytest.param("all", marks=pytest.mark.long)])
@pytest.mark.parametrize("release", ["0.20.0", "0.30.0"])
def test_real_run_of_a_release_s_own_tests_shadowed(release, plain_for, tmp_path):
    python_of(release)
    sdist = cached_or_fetched_sdist(release)
    options = peer_tests.PeerTestOptions(files=REAL_TESTS, sdist=str(sdist), version=release, workers=2,
                                 plain_for=plain_for, vectors_dir=str(tmp_path / "vectors"))
    table = peer_tests.run_peer_tests(options, show_progress=False)
    assert table["vllm"] == release and table["run"]["python"] == str(python_of(release))
    (row,) = table["files"]
    assert row["file"] == "test_scheduler.py" and row["collected"] >= len(REAL_TESTS)
    assert row["plain"]["passed"] == row["collected"], table["plain_failures"]
    assert row["shadow"]["passed"] == row["collected"], peer_report.format_table(table)
    # test_stop_via_update_from_output's draft tokens are outside too: every other call is checked.
    assert row["outside_scope"] == {"KV connector": 1, "speculative decoding": 4}, peer_report.format_table(table)
    outside = sum(c["outside_scope"] for c in row["calls"].values())
    assert row["calls_checked"] + outside == row["calls_total"] and row["calls_checked"] > 30, peer_report.format_table(table)
    assert table["totals"]["divergences"] == 0 and table["totals"]["monitor_errors"] == 0, peer_report.format_table(table)
    assert table["exit_status"] == 0 and table["run"]["plain_for"] == plain_for
    assert f"vLLM {release}'s tests/v1/core" in peer_report.format_table(table)
