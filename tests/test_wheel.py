"""schedspec as a package, not a checkout: a wheel built from the repo, installed in a
fresh virtualenv, runs its commands from a folder outside the repo.

The fresh environment gets its third-party packages (z3, jsonschema, vLLM ...) from
this interpreter's site-packages through a .pth file, so nothing is downloaded;
schedspec itself comes only from the wheel (the test checks which file it imports)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """{"bin": the fresh venv's bin folder, "cwd": an empty folder outside the repo, "env": env}."""
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    # A copy of what the package is built from: setuptools builds in the source
    # folder and keeps what an earlier build left in build/, which a wheel of the
    # checkout itself would then ship.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    for folder in folders:
        if not any(Path(f) in Path(folder).parents for f in folders):  # cli/package comes with cli
            shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(dist), str(source)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (wheel,) = dist.glob("schedspec-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this interpreter's packages, read but not processed: its editable schedspec finder stays out
    Path(purelib, "third-party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                        "--disable-pip-version-check", str(wheel)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    cwd = work / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(SCHEDSPEC_CACHE=str(work / "cache"), SCHEDSPEC_PROGRESS="0")
    return {"bin": venv / "bin", "cwd": cwd, "env": env, "purelib": Path(purelib), "work": work}


def schedspec(installed, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(installed["bin"] / "schedspec"), *args], cwd=installed["cwd"],
                          env=installed["env"], capture_output=True, text=True, timeout=timeout)


def test_the_package_comes_from_the_wheel(installed):
    p = subprocess.run([str(installed["bin"] / "python"), "-c",
                        "import schedspec.spec.scheduler as s, schedspec.cli.install_vllm as i; "
                        "print(s.__file__); print(i.SCRIPT)"],
                       cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    scheduler, script = map(Path, p.stdout.split())
    assert installed["purelib"] in scheduler.parents and ROOT not in scheduler.parents
    assert script.is_file() and installed["purelib"] in script.parents  # the install script is package data


def test_examples_diff_and_prove_run(installed):
    p = schedspec(installed, "examples")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = schedspec(installed, "diff", "--impl", "torch", "--scenarios", "5", "--seed", "3")
    assert p.returncode == 0 and "5" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    p = schedspec(installed, "prove", "--only", "step:token_budget_respected", "--jobs", "1", "-o", "witnesses")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert list((installed["cwd"] / "witnesses").glob("*.json")), "prove wrote no witness"


def test_install_vllm_finds_its_script_and_requirements(installed):
    """vLLM is importable in the fresh environment (through the .pth), so the
    packaged script finds it installed and stops there."""
    pytest.importorskip("vllm")
    p = schedspec(installed, "install-vllm")
    assert p.returncode == 0 and "already installed" in p.stdout + p.stderr, p.stdout + p.stderr


def test_explore_serves_its_page(installed):
    proc = subprocess.Popen([str(installed["bin"] / "schedspec"), "explore", "--no-browser", "--port", "0"],
                            cwd=installed["cwd"], env=installed["env"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        for line in proc.stdout:
            if "http://" in line:
                url = line[line.index("http://"):].split()[0]
                break
        assert url, "explore printed no address"
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert "<html" in page.lower()
        assert urllib.request.urlopen(url.rstrip("/") + "/static/app.js", timeout=30).status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_peer_tests_runs_a_test_file(installed):
    """peer-tests on a stand-in sdist of one passing test (the real one is vLLM's,
    downloaded; tests/test_peer_tests.py runs that)."""
    from schedspec.monitor.peer_environment import TEST_DEPENDENCIES

    cache = installed["work"] / "peer-cache"
    for module in TEST_DEPENDENCIES:  # nothing to install: the stand-in test imports none
        (cache / "deps" / module).mkdir(parents=True)
    sdist = installed["work"] / "vllm-0.34.0.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel, text in {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/__init__.py": "", "tests/v1/__init__.py": "", "tests/v1/core/__init__.py": "",
                          "tests/v1/core/test_one.py": "def test_one():\n    assert 1 + 1 == 2\n"}.items():
            info = tarfile.TarInfo(f"vllm-0.34.0/{rel}")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    sdist.write_bytes(buf.getvalue())
    p = schedspec(installed, "peer-tests", "--sdist", str(sdist), "--cache", str(cache), "--files", "test_one.py",
                  "--plain", "--workers", "1")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "test_one.py" in p.stdout


def test_a_release_environment_gets_this_schedspec(installed):
    """`install-vllm --version X` puts the schedspec that runs it into X's own
    environment; from a wheel there is no source tree, so the package folder is
    linked in.  Here X's environment is a fresh one whose other packages are
    already there (the .pth), so pip installs nothing and only the link is made."""
    target = installed["work"] / "release-env"
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=300)
    py = target / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "third-party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = ("import sys; from pathlib import Path; from schedspec.cli.install_vllm import install_schedspec_into, "
            "schedspec_origin; print(schedspec_origin()[0]); install_schedspec_into(Path(sys.argv[1]), Path(sys.argv[2]))")
    p = subprocess.run([str(installed["bin"] / "python"), "-c", code, str(py), str(target)], cwd=installed["cwd"],
                       env=installed["env"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.startswith("package"), p.stdout[-2000:] + p.stderr[-2000:]
    p = subprocess.run([str(py), "-c", "import os, schedspec; print(os.path.realpath(schedspec.__file__))"],
                       cwd=installed["cwd"], env=installed["env"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and installed["purelib"] in Path(p.stdout.strip()).parents, p.stdout + p.stderr
