"""Campaigns on many workers (issue "Campaigns across every core and across
machines"): the same report whatever runs the campaign, failures charged to
their scenario, interrupted campaigns resumed, and the same on a local Ray cluster.

The implementations under test are tests/campaign_impls.py's: the spec with a
flaw on the scenarios `selected` picks, so what must be reported is known
before the campaign runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from schedspec.reference.workers import Job, WorkerFailure, WorkerInfo, run_job
from schedspec.reference.campaign import random_scenario
from schedspec.reference.generator import FLAGS_ALL
from tests.campaign_impls import selected

ROOT = Path(__file__).resolve().parent.parent
SEED = 3


def schedspec(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SCHEDSPEC_PROGRESS="0")
    return subprocess.run([sys.executable, "-m", "schedspec", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def campaign(cwd: Path, impl: str, n: int, *extra: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return schedspec(cwd, "diff", "--impl", f"tests.campaign_impls:{impl}", "--against", "spec", "--scenarios",
                     str(n), "--seed", str(SEED), "-o", "div", "--shrink-seconds", "60", *extra)


def folder_bytes(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.exists() else {}


def merged_lines(text: str) -> list[str]:
    """stdout without the lines that hold timings."""
    return [ln for ln in text.splitlines()
            if not ln.startswith(("scenarios:", "time per step", "load time", "results:"))]


def selected_indices(n: int) -> list[int]:
    return [i for i in range(n) if selected(random_scenario(SEED, i, FLAGS_ALL).scheduler_config())]


def test_the_report_is_the_same_whatever_the_number_of_workers(tmp_path):
    runs = {w: campaign(tmp_path / f"w{w}", "FewerSeqs", 40, "--workers", str(w), "--results", "res")
            for w in (1, 2, 3)}
    for w, proc in runs.items():
        assert proc.returncode == 1, proc.stderr  # FewerSeqs diverges
    reports = {w: (tmp_path / f"w{w}" / "res" / "report.json").read_bytes() for w in runs}
    report = json.loads(reports[1])
    # Not vacuous: divergences, shrunk ones among them, and steps compared.
    assert len(report["divergences"]) >= 2 and any("minimal" in d for d in report["divergences"])
    assert report["steps_compared"] > 1000 and report["scenarios"] == 40
    assert reports[2] == reports[1] and reports[3] == reports[1]
    files = {w: folder_bytes(tmp_path / f"w{w}" / "div") for w in runs}
    assert files[1] and files[2] == files[1] and files[3] == files[1]
    assert merged_lines(runs[2].stdout) == merged_lines(runs[1].stdout) == merged_lines(runs[3].stdout)
    # Every divergent scenario is one FewerSeqs changes.
    chosen = {f"random-s{SEED}-{i}" for i in selected_indices(40)}
    assert {d["scenario"] for d in report["divergences"]} <= chosen


def test_a_crashing_worker_is_charged_to_its_scenario_and_the_rest_kept(tmp_path):
    n = 12
    proc = campaign(tmp_path, "Crasher", n, "--workers", "2", "--results", "res", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "res" / "report.json").read_text())
    expected = {f"random-s{SEED}-{i}" for i in selected_indices(n)}
    assert expected and len(expected) < n  # some crash, some do not
    assert {f["scenario"] for f in report["failures"]} == expected
    assert all(f["kind"] == "crashed" and "exit code 3" in f["detail"] for f in report["failures"])
    assert not report["divergences"]  # the others ran, and agree
    for f in report["failures"]:  # each written, to be run again alone
        assert json.loads(Path(tmp_path / f["file"]).read_text())["name"] == f["scenario"]
    # A replacement per crash, but for crashes after the last scenario was handed out.
    assert json.loads(proc.stdout)["worker_restarts"] >= len(expected) - 2


def test_a_hung_worker_is_stopped_and_charged_to_its_scenario(tmp_path):
    n = 6
    t = time.monotonic()
    proc = campaign(tmp_path, "Hanger", n, "--workers", "2", "--scenario-timeout", "2", "--results", "res")
    assert time.monotonic() - t < 120
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "res" / "report.json").read_text())
    expected = {f"random-s{SEED}-{i}" for i in selected_indices(n)}
    assert expected and {f["scenario"] for f in report["failures"]} == expected
    assert all(f["kind"] == "hung" for f in report["failures"])
    assert "WORKER HUNG on" in proc.stdout


# Long: in CI's sharded suite its interrupt twice landed after the campaign's last
# scenario (exit 1, not 130), though it passes alone, under load and with CI=true;
# until that race is understood it runs in scripts/long-tests.sh.
@pytest.mark.long
def test_an_interrupted_campaign_resumes_to_the_same_report(tmp_path):
    n = 80
    whole = campaign(tmp_path / "whole", "SlowFewerSeqs", n, "--workers", "2", "--results", "res")
    assert whole.returncode == 1, whole.stderr
    cut = tmp_path / "cut"
    cut.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), SCHEDSPEC_PROGRESS="0")
    p = subprocess.Popen([sys.executable, "-m", "schedspec", "diff", "--impl", "tests.campaign_impls:SlowFewerSeqs",
                          "--against", "spec", "--scenarios", str(n), "--seed", str(SEED), "-o", "div",
                          "--shrink-seconds", "60", "--workers", "2", "--results", "res"],
                         cwd=cut, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = cut / "res" / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        # Early, so that a loaded machine (CI runs two shards beside other work) still
        # interrupts the campaign well before its last scenario.
        if results.exists() and len(results.read_text().splitlines()) >= n // 8:
            break
        time.sleep(0.05)
    assert p.poll() is None, "the campaign ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "--resume res" in err.splitlines()[-1], err
    finished = len(results.read_text().splitlines())
    assert n // 8 <= finished < n
    assert not (cut / "res" / "report.json").exists()
    # A line cut off mid-write is dropped and its scenario run again.
    with results.open("a") as f:
        f.write('{"index": 7')
    again = schedspec(cut, "diff", "--resume", "res")
    assert again.returncode == 1, again.stderr
    assert (cut / "res" / "report.json").read_bytes() == (tmp_path / "whole" / "res" / "report.json").read_bytes()
    assert folder_bytes(cut / "div") == folder_bytes(tmp_path / "whole" / "div")
    assert len(results.read_text().splitlines()) == n


def test_resume_and_results_refuse_what_would_mix_or_lose_results(tmp_path):
    done = campaign(tmp_path, "FewerSeqs", 5, "--workers", "1", "--results", "res", "--no-shrink")
    assert done.returncode in (0, 1), done.stderr
    checks = [
        (["--resume", "res", "--seed", "4"], "drop --seed"),
        (["--resume", "nowhere"], "no campaign.json"),
        (["--impl", "spec", "--against", "tests.campaign_impls:FewerSeqs", "--scenarios", "3", "--results", "res"],
         "is not empty"),
        (["--impl", "torch", "--scenarios", "3", "--workers", "2"], "--workers"),
        (["--impl", "nosuch", "--scenarios", "3"], "unknown implementation"),
        (["--impl", "tests.campaign_impls:BrokenLoad", "--scenarios", "60", "--workers", "2"], "no licence"),
    ]
    for args, words in checks:
        proc = schedspec(tmp_path, "diff", *args)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and err and err[-1].startswith("schedspec: error:") and words in err[-1], \
            (args, proc.stderr)
    (tmp_path / "s.json").write_text(json.dumps(random_scenario(SEED, 0, FLAGS_ALL).to_json()))
    assert campaign(tmp_path / "f", "FewerSeqs", 1).returncode in (0, 1)
    first = schedspec(tmp_path, "diff", "--impl", "spec", "--against", "tests.campaign_impls:FewerSeqs", "s.json",
                      "--results", "fres")
    assert first.returncode in (0, 1), first.stderr
    (tmp_path / "s.json").write_text("{}")
    proc = schedspec(tmp_path, "diff", "--resume", "fres")
    assert proc.returncode == 2 and "changed since the campaign started" in proc.stderr


def test_the_pool_keeps_results_and_charges_failures_to_their_item():
    job = Job("tests.campaign_impls:setup_echo", ("w",), "tests.campaign_impls:run_echo")
    items = list(enumerate(["a", "boom", "c", "die", "e", "f"]))
    got = dict(run_job(job, items, workers=2))
    assert sorted(got) == list(range(6))
    assert got[0] == "w:a" and got[2] == "w:c" and got[4] == "w:e" and got[5] == "w:f"
    assert isinstance(got[1], WorkerFailure) and got[1].kind == "raised" and "boom" in got[1].detail
    assert isinstance(got[3], WorkerFailure) and got[3].kind == "crashed" and "exit code 5" in got[3].detail
    # In this process (one worker) nothing is isolated: run's own exception is the caller's.
    assert dict(run_job(job, items[:1], workers=1)) == {0: "w:a"}
    with pytest.raises(ValueError, match="boom"):
        dict(run_job(job, items[:3], workers=1))


def test_a_worker_dying_once_while_setting_up_is_replaced_and_nothing_lost(tmp_path):
    # The guarantee pebble's pool lacks (reference/workers.py): there, one death in setup while
    # no item runs fails every pending item.  Items take a quarter second each, so work is
    # still left when the death is seen: a replacement starts only then (ProcessPool.replace),
    # and with instant items the other worker could finish them all first.
    marker = tmp_path / "died"
    job = Job("tests.campaign_impls:setup_echo_dying_once", ("w", str(marker)), "tests.campaign_impls:run_echo_slow")
    info = WorkerInfo()
    got = dict(run_job(job, list(enumerate("abcdefgh")), workers=2, info=info))
    assert marker.exists()  # a worker did die in setup
    assert got == {i: f"w:{c}" for i, c in enumerate("abcdefgh")}
    assert info.restarts == 1


# --- a local Ray cluster ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    pytest.importorskip("ray", reason="the Ray extra is not installed: pip install 'schedspec[ray]'")
    ray_bin = Path(sys.executable).parent / "ray"
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    # A session of its own: every process of this cluster (head, raylet, actors) is then in one process
    # group, stopped at the end without `ray stop`, which would stop every Ray cluster of the machine.
    start = subprocess.Popen([str(ray_bin), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                              "--num-cpus", "2",
                              "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    group = start.pid
    try:
        _, err = start.communicate(timeout=180)
        assert start.returncode == 0, err[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            time.sleep(wait)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_local_ray_cluster_gives_the_same_report_as_local_workers(tmp_path, ray_head):
    local = campaign(tmp_path / "local", "FewerSeqs", 30, "--workers", "2", "--results", "res")
    on_ray = campaign(tmp_path / "ray", "FewerSeqs", 30, "--workers", "2", "--ray", ray_head, "--results", "res")
    assert local.returncode == 1 and on_ray.returncode == 1, on_ray.stderr[-2000:]
    a = (tmp_path / "local" / "res" / "report.json").read_bytes()
    assert json.loads(a)["divergences"]
    assert (tmp_path / "ray" / "res" / "report.json").read_bytes() == a
    assert folder_bytes(tmp_path / "ray" / "div") == folder_bytes(tmp_path / "local" / "div")
    # A worker that dies on Ray is charged to its scenario as well.
    crash = campaign(tmp_path / "crash", "Crasher", 10, "--workers", "2", "--ray", ray_head, "--results", "res")
    assert crash.returncode == 1, crash.stderr[-2000:]
    failures = json.loads((tmp_path / "crash" / "res" / "report.json").read_text())["failures"]
    assert {f["scenario"] for f in failures} == {f"random-s{SEED}-{i}" for i in selected_indices(10)}


def test_a_given_file_both_implementations_refuse_is_named_with_the_reason(tmp_path):
    """diff never counts a given file it could not compare as agreement in silence:
    each one both implementations refuse is named with the reason, and when nothing
    at all was compared the exit status is 2 (bad input)."""
    bad = {"format": "schedspec.scenario/1", "name": "too-small", "requests": [{"id": "a", "prompt_len": 4}],
           "config": {"max_model_len": 256, "block_size": 4, "num_gpu_blocks": 40}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    (tmp_path / "good.json").write_text(json.dumps(random_scenario(SEED, 0, FLAGS_ALL).to_json()))
    why = "rejected by both implementations, nothing compared: config.num_gpu_blocks"
    for impl in ("tests.campaign_impls:FewerSeqs", "torch"):  # the process pool's merge, torch's batches
        proc = schedspec(tmp_path, "diff", "--impl", "spec", "--against", impl, "bad.json")
        assert proc.returncode == 2 and f"scenario 'too-small': {why}" in proc.stdout, (impl, proc.stdout)
        proc = schedspec(tmp_path, "diff", "--impl", "spec", "--against", impl, "bad.json", "good.json", "--json")
        report = json.loads(proc.stdout)
        assert proc.returncode in (0, 1) and report["rejected"][0]["scenario"] == "too-small", proc.stdout
