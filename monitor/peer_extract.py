"""Unpacking what `schedspec peer-tests` runs from vLLM's source distribution:
tests/v1/core and only the helper modules its files import (found by reading
their imports), with vLLM's pytest settings (pyproject.toml); and the offline
Hugging Face hub cache the tests load their models' configs from.

    extract_tests(sdist, root, version=X)  root/vllm-X/, reused while the sdist is the same
    resolve_targets(tree, files, all)      pytest's arguments for --files / --all / the default files
    write_model_configs(hub)               one config.json per model the tests name
                                           (model_configs.json here; OPT-125m from
                                           reference/vllm_model)

Nothing of vLLM's test suite is kept in this repository: it is extracted from
the source distribution at run time.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping, Sequence

from schedspec import reference
from schedspec.reference.errors import UsageError, shown

from .peer_fetch import VLLM_VERSION, StatusFn, make_dir, quiet, sdist_name, sha256_file

TEST_ROOT = "tests/v1/core"
DEFAULT_FILES = ("test_scheduler.py", "test_async_scheduler.py", "test_prefix_caching.py",
                 "test_priority_scheduler_random.py", "test_priority_preemption_bug.py")
MODEL_CONFIGS = Path(__file__).parent / "model_configs.json"
OPT_125M = "facebook/opt-125m"
OPT_125M_CONFIG = Path(reference.__file__).parent / "vllm_model" / "config.json"
EXTRACTED_MARKER = ".schedspec-peer-tests.json"


# --- the tests out of the sdist ------------------------------------------------------------------

def _members(tar: tarfile.TarFile) -> Iterable[tuple[str, tarfile.TarInfo]]:
    """(path below the top folder, member) for each regular file of a safe name."""
    for m in tar:
        if not m.isfile():
            continue
        parts = PurePosixPath(m.name).parts
        if len(parts) < 2 or m.name.startswith("/") or any(p in ("..", "") for p in parts):
            continue
        yield "/".join(parts[1:]), m


def read_sdist(sdist: Path, version: str = VLLM_VERSION) -> dict[str, bytes]:
    """Every file of the sdist under tests/, and pyproject.toml, by path below
    its top folder.  An sdist whose top folder names another vLLM release
    (vllm-Y/) is refused: its tests are not release `version`'s."""
    files = {}
    tops = set()
    try:
        with tarfile.open(sdist, "r:*") as tar:
            for rel, m in _members(tar):
                tops.add(PurePosixPath(m.name).parts[0])
                if rel.startswith("tests/") or rel == "pyproject.toml":
                    f = tar.extractfile(m)
                    if f is not None:
                        files[rel] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise UsageError(f"{shown(str(sdist), 200)}: not a readable .tar.gz source distribution "
                         f"({shown(str(e) or type(e).__name__, 100)})") from None
    other = sorted(t for t in tops if t.startswith("vllm-") and t != f"vllm-{version}")
    if other:
        raise UsageError(f"{shown(str(sdist), 200)} is {shown(other[0], 40)}'s source distribution, not "
                         f"vLLM {version}'s ({sdist_name(version)}); pass --version to match it")
    if not any(rel.startswith(TEST_ROOT + "/") for rel in files):
        raise UsageError(f"{shown(str(sdist), 200)} holds no {TEST_ROOT}/; give vLLM {version}'s "
                         f"source distribution ({sdist_name(version)})")
    return files


def _module_of(rel: str) -> tuple[str, bool]:
    """("tests.v1.core.utils", is_package) for "tests/v1/core/utils.py"."""
    parts = list(PurePosixPath(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imported_modules(source: bytes, rel: str) -> set[str]:
    """The absolute names of the modules a file imports (and of the names it
    imports from a module, which may be submodules), at any depth."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    module, is_package = _module_of(rel)
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target:
                found.add(target)
            found.update(f"{target}.{a.name}" if target else a.name for a in node.names if a.name != "*")
    return found


def needed_files(files: Mapping[str, bytes], test_root: str = TEST_ROOT) -> list[str]:
    """The files of `files` running `test_root`'s tests needs: all of test_root,
    the conftest.py files above it, the __init__.py files above each module, and
    every module of the `tests` package they import, followed to the end."""
    chosen: set[str] = {rel for rel in files if rel.startswith(test_root + "/")}
    if "pyproject.toml" in files:
        chosen.add("pyproject.toml")
    queue = sorted(rel for rel in chosen if rel.endswith(".py"))

    def add(rel: str) -> None:
        if rel in files and rel not in chosen:
            chosen.add(rel)
            if rel.endswith(".py"):
                queue.append(rel)

    while queue:
        rel = queue.pop()
        parents = PurePosixPath(rel).parents
        for folder in list(parents)[:-1]:  # tests/v1/core, tests/v1, tests (not ".")
            add(f"{folder}/__init__.py")
            if rel.startswith(test_root + "/"):  # pytest loads the conftest.py files above a test
                add(f"{folder}/conftest.py")
        for name in imported_modules(files[rel], rel):
            if name != "tests" and not name.startswith("tests."):
                continue
            path = name.replace(".", "/")
            add(f"{path}.py")
            add(f"{path}/__init__.py")
    return sorted(chosen)


def extract_tests(sdist: Path, root: Path, status: StatusFn = quiet, version: str = VLLM_VERSION) -> Path:
    """The tree pytest runs in: root/vllm-<version>/ with tests/v1/core, its
    helpers and pyproject.toml; reused while the sdist is the same."""
    dest = Path(root) / f"vllm-{version}"
    digest = sha256_file(sdist)
    marker = dest / EXTRACTED_MARKER
    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker.read_text()).get("sdist_sha256") == digest:
            return dest
    status(f"extracting {TEST_ROOT} and its helpers from {sdist.name}")
    files = read_sdist(sdist, version)
    chosen = needed_files(files)
    make_dir(Path(root), "cache folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".vllm-{version}.", dir=root))
    try:
        for rel in chosen:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(files[rel])
        (tmp / EXTRACTED_MARKER).write_text(json.dumps({"sdist_sha256": digest, "files": chosen}, indent=1))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except OSError as e:
        raise UsageError(f"cannot extract the tests into {shown(str(dest), 200)}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def available_files(tree: Path) -> list[str]:
    """The test files of tests/v1/core, relative to it."""
    base = tree / TEST_ROOT
    return sorted(str(p.relative_to(base)) for p in base.rglob("test_*.py"))


def default_files(tree: Path) -> tuple[list[str], list[str]]:
    """(the default files the release's tests/v1/core has, those it lacks):
    0.20.0 and 0.25.0 have no test_priority_preemption_bug.py (from 0.28.0)."""
    known = set(available_files(tree))
    return [f for f in DEFAULT_FILES if f in known], [f for f in DEFAULT_FILES if f not in known]


def resolve_targets(tree: Path, files: Sequence[str] | None, all_files: bool) -> list[str]:
    """pytest's arguments, relative to the tree: the default five files (those
    of them the release has), all of tests/v1/core, or the named files
    ("test_scheduler.py", "test_scheduler", "prefix_cache/test_x.py", a node
    id "test_x.py::test_y")."""
    if all_files:
        return [TEST_ROOT]
    known = available_files(tree)
    targets = []
    for name in files or default_files(tree)[0]:
        path, sep, rest = name.partition("::")
        path = path.strip().removeprefix(TEST_ROOT + "/").removeprefix("./")
        if path and not path.endswith(".py"):
            path += ".py"
        if path not in known:
            hits = [k for k in known if PurePosixPath(k).name == path]
            if len(hits) != 1:
                raise UsageError(f"--files {shown(name)}: no such test file in {TEST_ROOT} "
                                 f"(there are: {', '.join(known)})")
            path = hits[0]
        targets.append(f"{TEST_ROOT}/{path}{sep}{rest}")
    return targets


# --- offline model configs -----------------------------------------------------------------------

def named_models(tree: Path, files: Iterable[str] | None = None) -> list[str]:
    """The model ids ("ORG/NAME" string literals) the release's test files and
    their helpers name, as far as a string can tell: what model_configs()
    must cover for them."""
    import re

    base = tree / TEST_ROOT
    paths = [base / f for f in files] if files is not None else sorted(base.rglob("*.py"))
    found = set()
    pattern = re.compile(r"""["']([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)["']""")
    for p in [*paths, base / "utils.py"]:
        with contextlib.suppress(OSError):
            found.update(m for m in pattern.findall(p.read_text(errors="replace"))
                         if not m.endswith(".py") and "." not in m.split("/")[0])
    return sorted(found)


def model_configs() -> dict[str, dict[str, Any]]:
    """{model id: config.json contents} of the models vLLM's tests name."""
    configs = json.loads(MODEL_CONFIGS.read_text())
    configs.setdefault(OPT_125M, json.loads(OPT_125M_CONFIG.read_text()))
    return configs


def write_model_configs(hub: Path, configs: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """A Hugging Face hub cache at `hub` (HF_HUB_CACHE) holding config.json for
    each model: models--ORG--NAME/snapshots/<rev>/config.json and refs/main.
    The revision is a hash of the config, so a changed config is a new one.
    The model ids written."""
    configs = model_configs() if configs is None else configs
    written = []
    for model_id, config in sorted(configs.items()):
        if model_id.count("/") != 1 or any(p in ("", ".", "..") for p in model_id.split("/")):
            raise ValueError(f"model id {model_id!r} is not ORG/NAME")
        text = json.dumps(config, indent=1, sort_keys=True) + "\n"
        rev = hashlib.sha1(text.encode()).hexdigest()
        repo = hub / ("models--" + model_id.replace("/", "--"))
        snapshot = repo / "snapshots" / rev
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(text)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
        written.append(model_id)
    return written


__all__ = ["DEFAULT_FILES", "EXTRACTED_MARKER", "MODEL_CONFIGS", "OPT_125M", "TEST_ROOT", "available_files",
           "default_files", "extract_tests", "imported_modules", "model_configs", "named_models", "needed_files",
           "read_sdist", "resolve_targets", "write_model_configs"]
