"""vLLM's own scheduler tests (tests/v1/core), run on this machine, plain and
under the shadow monitor (`schedspec peer-tests [--version X]`).

Release X is any of spec/versions.py RELEASES (default DEFAULT_RELEASE, the
newest): its own sdist,
its own tests/v1/core, run by its own interpreter (the one this process has when
its vLLM is X, else the environment of `schedspec install-vllm --version X`), so
the monitor lifts vLLM X's schedulers and the spec models X (the lifted
config's vllm_version is the installed vLLM's, reference/vllm_lift.py), its
version gates applied.  The default files a release lacks are left out and
named (`default_files`: 0.20.0 and 0.25.0 have no
test_priority_preemption_bug.py).

The steps, each a public function that takes values:

    cache_root(override)          where everything below is kept: the override,
                                  else $SCHEDSPEC_CACHE/peer-tests, else
                                  $XDG_CACHE_HOME/schedspec/peer-tests, else
                                  ~/.cache/schedspec/peer-tests
    pip_index_settings(env)       the package indexes and CA bundle pip is
                                  configured with (`pip config list`, PIP_*)
    fetch_sdist(root, version=X)  vllm-X.tar.gz from those indexes (PEP 691
                                  JSON, or the PEP 503 page), sha256 verified,
                                  kept in `root`; `check_sdist(path)` for --sdist
    extract_tests(sdist, root, version=X)  tests/v1/core and only the helper modules its
                                  files import (found by reading their imports),
                                  with vLLM's pytest settings (pyproject.toml)
    write_model_configs(hub)      a Hugging Face hub cache holding one config.json
                                  per model the tests name (model_configs.json
                                  here; OPT-125m from reference/vllm_model)
    release_python(X)             the interpreter of release X (one line naming
                                  `schedspec install-vllm --version X` if none)
    ensure_test_dependencies(root)  the few test-only packages vLLM's tests import
                                  that a scheduler-only vLLM install lacks (and
                                  pytest itself, for a release's environment),
                                  installed by pip into root/deps (deps-X for
                                  release X; never into the interpreter)
    run_pytest(...)               pytest in a subprocess with the plugin
                                  schedspec.monitor.pytest_plugin, offline
    build_table(plain, shadow)    the per-file table from the plugin's reports
    format_table(table)           the table as text
    run_peer_tests(options)       all of it

Nothing of vLLM's test suite is kept in this repository: it is extracted from
the source distribution at run time.

What fails plain on a CPU-only machine with the scheduler's vLLM install
(vLLM's tests or this machine, never the spec; the table lists each cause):
the multimodal models' code (llava, Qwen2.5-VL) imports torchvision, which has
no build for the CPU torch here (llava's also mistral_common); up to 0.33.0
Model Runner V2 needs Triton, so vLLM falls back to the V1 runner, which rejects
async scheduling with pipeline parallelism (0.34.0 has no V1 runner, and its CPU
platform's refusal of an x86 machine without Triton, made before any scheduler
exists, is bridged by the pytest plugin: pytest_plugin.py); the end-to-end tests (LLM engines) need model weights, and
prefix_cache/test_hybrid_prefix_cache_hit_rate.py imports anthropic.  Every failure a user can act on (no
network, a hash mismatch, a file the index lacks, a bad --sdist) is a
UsageError with one line.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import html.parser
import importlib.util
import json
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Mapping, Sequence

from schedspec import reference
from schedspec.reference.errors import UsageError, shown
from schedspec.reference.progress import Progress
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES, spec_release_for

VLLM_VERSION = DEFAULT_RELEASE  # the newest modelled release: the one run without --version
PROJECT = "vllm"
SDIST_NAME = f"vllm-{VLLM_VERSION}.tar.gz"
TEST_ROOT = "tests/v1/core"
DEFAULT_FILES = ("test_scheduler.py", "test_async_scheduler.py", "test_prefix_caching.py",
                 "test_priority_scheduler_random.py", "test_priority_preemption_bug.py")
PLUGIN = "schedspec.monitor.pytest_plugin"
TABLE_FORMAT = "schedspec.peer-tests/1"
MODEL_CONFIGS = Path(__file__).parent / "model_configs.json"
OPT_125M = "facebook/opt-125m"
OPT_125M_CONFIG = Path(reference.__file__).parent / "vllm_model" / "config.json"
EXTRACTED_MARKER = ".schedspec-peer-tests.json"
JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
HTML_ACCEPTS = ("application/vnd.pypi.simple.v1+html", "text/html")

# Modules vLLM's tests (or the model code they reach) import that a scheduler-only
# vLLM install (cli/install/requirements-vllm.txt) lacks: import name -> pinned requirement.
# tblib: tests/conftest.py; compressed-tensors (and its loguru): the hybrid
# (mamba/GDN) model code behind Qwen3-Next, pinned as vLLM 0.33.0 and 0.34.0 pin it
# (requirements/common.txt:45).
TEST_DEPENDENCIES = {"tblib": "tblib==3.2.2", "compressed_tensors": "compressed-tensors==0.17.0",
                     "loguru": "loguru==0.7.3"}
# Bridge (test dependencies): 0.20.0 pins compressed-tensors 0.15.0.1
# (0.20.0 requirements/common.txt); 0.25.0 to 0.34.0 pin 0.17.0.
TEST_DEPENDENCIES_BY_RELEASE = {"0.20.0": {**TEST_DEPENDENCIES, "compressed_tensors": "compressed-tensors==0.15.0.1"}}
# pytest itself, for a release's environment (install-vllm installs vLLM only):
# the versions this project's own environment runs.
PYTEST_DEPENDENCIES = {"pytest": "pytest==9.2.0", "pluggy": "pluggy==1.7.0", "iniconfig": "iniconfig==2.3.1",
                       "pygments": "pygments==2.21.0"}
# What tests/conftest.py needs of tblib, when pip cannot install it: it only
# makes exceptions picklable for tests that run in subprocesses.
TBLIB_STAND_IN = ('"""Stand-in written by schedspec peer-tests: tblib could not be installed."""\n',
                  "def install(*args, **kwargs):\n    return None\n")

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu",
               "HF_HUB_DISABLE_TELEMETRY": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "TOKENIZERS_PARALLELISM": "false"}

StatusFn = Callable[[str], None]


def _quiet(message: str) -> None:
    return None


# --- the cache ----------------------------------------------------------------------------------

def cache_root(override: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The folder peer-tests keeps its downloads and extracted trees in."""
    env = os.environ if env is None else env
    if override is not None and str(override).strip():
        return Path(override).expanduser()
    if env.get("SCHEDSPEC_CACHE", "").strip():
        return Path(env["SCHEDSPEC_CACHE"]).expanduser() / "peer-tests"
    base = env.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "schedspec" / "peer-tests"


def _make_dir(path: Path, what: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the {what} {shown(str(path), 200)}: {e.strerror or e}") from None
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- pip's configuration -------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexSettings:
    """The indexes pip would look in (main first), its CA bundle and timeout."""
    index_urls: tuple[str, ...]
    cert: str | None = None
    timeout: float = 15.0


def pip_config_values(env: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, str]:
    """`pip config list` as {key: value} ("global.index-url", ":env:.cert", ...);
    empty when pip cannot be run."""
    cmd = [python or sys.executable, "-m", "pip", "config", "list"]
    try:
        proc = subprocess.run(cmd, env=dict(os.environ if env is None else env), capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0:
        return {}
    values = {}
    for line in proc.stdout.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip().strip("'\"")
        values[key.strip()] = str(value)
    return values


def _setting(values: Mapping[str, str], env: Mapping[str, str], name: str) -> str | None:
    """pip's precedence: the environment, then the [install] section, then [global]."""
    env_name = "PIP_" + name.upper().replace("-", "_")
    if env.get(env_name, "").strip():
        return env[env_name]
    for key in (f":env:.{name}", f"install.{name}", f"global.{name}"):
        if values.get(key, "").strip():
            return values[key]
    return None


def check_version(version: str) -> str:
    """A release schedspec models (spec/versions.py), or a later one, whose tests run
    against the newest modelled release at or below it (`schedspec keep-up`); else a
    one-line UsageError."""
    if spec_release_for(version) is None:
        raise UsageError(f"--version {shown(version)}: not a vLLM release schedspec models, nor a later one; "
                         f"use one of {', '.join(RELEASES)}")
    return version


def sdist_name(version: str = VLLM_VERSION) -> str:
    return f"vllm-{version}.tar.gz"


def pip_default_index() -> str:
    """The index pip uses when it is configured with none."""
    try:
        from pip._internal.models.index import PyPI
    except ImportError:
        raise UsageError("pip is not installed here, so the package index it would use is unknown; "
                         "download vllm-X.tar.gz yourself and pass --sdist PATH") from None
    return PyPI.simple_url


def pip_index_settings(env: Mapping[str, str] | None = None,
                       values: Mapping[str, str] | None = None) -> IndexSettings:
    """The package indexes and CA bundle pip on this machine is configured with."""
    env = os.environ if env is None else env
    values = pip_config_values(env) if values is None else values
    no_index = _setting(values, env, "no-index")
    if no_index is not None and no_index.strip().lower() in ("1", "true", "yes", "on"):
        raise UsageError("pip is configured with no-index, so there is no package index to fetch "
                         "vLLM's sdist from; pass --sdist PATH")
    main = _setting(values, env, "index-url") or pip_default_index()
    extra = (_setting(values, env, "extra-index-url") or "").split()
    urls = tuple(dict.fromkeys([main.strip(), *extra]))
    timeout_text = _setting(values, env, "default-timeout") or _setting(values, env, "timeout")
    try:
        timeout = float(timeout_text) if timeout_text else 15.0
    except ValueError:
        timeout = 15.0
    return IndexSettings(urls, _setting(values, env, "cert"), timeout)


def ssl_context(cert: str | None) -> ssl.SSLContext:
    if cert is None:
        return ssl.create_default_context()
    if not Path(cert).exists():
        raise UsageError(f"pip's CA bundle {shown(cert, 200)} does not exist (pip config cert / PIP_CERT)")
    try:
        if Path(cert).is_dir():
            return ssl.create_default_context(capath=cert)
        return ssl.create_default_context(cafile=cert)
    except (ssl.SSLError, OSError) as e:
        raise UsageError(f"cannot read pip's CA bundle {shown(cert, 200)}: {e}") from None


# --- the index -----------------------------------------------------------------------------------

class _Absent(Exception):
    """The index has no page for the project (HTTP 404 or no such folder)."""


@dataclass(frozen=True)
class SdistLink:
    index: str
    url: str
    sha256: str | None
    size: int | None = None


def _safe(url: str) -> str:
    """A URL for a message: without user:password."""
    parts = urllib.parse.urlsplit(url)
    if parts.username or parts.password:
        netloc = parts.hostname or ""
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    return shown(urllib.parse.urlunsplit(parts), 200)


def _open(url: str, accept: str, context: ssl.SSLContext, timeout: float):
    """(response-like object, content type, final URL); a folder of a file:// index
    is read as pip reads it, from its index.html."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        if path.is_dir():
            path = path / "index.html"
            url = path.as_uri()
        if not path.is_file():
            raise _Absent(url)
        ctype = "application/json" if path.suffix == ".json" else "text/html"
        return open(path, "rb"), ctype, url
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"package index {_safe(url)}: unsupported URL scheme {shown(parts.scheme, 20)!s}")
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "schedspec-peer-tests"})
    try:
        response = urllib.request.urlopen(request, context=context, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise _Absent(url) from None
        raise
    return response, response.headers.get("Content-Type", ""), response.geturl()


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")
            self._text = []

    def handle_data(self, data) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_project_page(body: bytes, content_type: str, page_url: str, filename: str) -> SdistLink | None:
    """The link to `filename` on a project page: PEP 691 JSON or PEP 503 HTML."""
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type.lower() or text.lstrip().startswith("{"):
        data = json.loads(text)
        for f in data.get("files", []):
            if isinstance(f, dict) and f.get("filename") == filename:
                hashes = f.get("hashes") or {}
                size = f.get("size")
                return SdistLink("", urllib.parse.urljoin(page_url, str(f.get("url", ""))),
                                 hashes.get("sha256"), size if isinstance(size, int) else None)
        return None
    parser = _Anchors()
    parser.feed(text)
    for href, label in parser.links:
        url, _, fragment = href.partition("#")
        name = urllib.parse.unquote(PurePosixPath(urllib.parse.urlsplit(url).path).name)
        if filename in (name, label):
            digest = None
            for part in fragment.split("&"):
                algo, _, value = part.partition("=")
                if algo == "sha256":
                    digest = value
            return SdistLink("", urllib.parse.urljoin(page_url, url), digest)
    return None


def find_sdist(settings: IndexSettings, filename: str = SDIST_NAME, project: str = PROJECT) -> SdistLink:
    """The first of pip's indexes that lists `filename`."""
    context = ssl_context(settings.cert)
    accept = ", ".join([JSON_ACCEPT, f"{HTML_ACCEPTS[0]};q=0.2", f"{HTML_ACCEPTS[1]};q=0.01"])
    problems = []
    for index in settings.index_urls:
        page = index.rstrip("/") + f"/{project}/"
        try:
            response, ctype, final = _open(page, accept, context, settings.timeout)
            with response:
                body = response.read()
            link = parse_project_page(body, ctype, final, filename)
        except _Absent:
            problems.append(f"{_safe(index)}: no project {project}")
            continue
        except (urllib.error.URLError, OSError, ValueError, ssl.SSLError) as e:
            problems.append(f"{_safe(index)}: {_reason(e)}")
            continue
        if link is None:
            problems.append(f"{_safe(index)}: lists no {filename}")
            continue
        return SdistLink(index, link.url, link.sha256, link.size)
    raise UsageError(f"cannot get {filename} from pip's package index ({'; '.join(problems)}); "
                     "pass --sdist PATH to use a copy you have")


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return shown(str(e.reason), 120)
    if isinstance(e, json.JSONDecodeError):
        return "the project page is not valid JSON"
    return shown(str(e) or type(e).__name__, 120)


def download(link: SdistLink, dest: Path, settings: IndexSettings | None = None,
             status: StatusFn = _quiet) -> str:
    """Download `link` to `dest` (replaced only once the whole file has the
    index's sha256); its sha256."""
    if not link.sha256:
        raise UsageError(f"the index gives no sha256 for {dest.name}, so the download cannot be "
                         "verified; pass --sdist PATH to use a copy you have")
    settings = settings or IndexSettings(())
    context = ssl_context(settings.cert)
    _make_dir(dest.parent, "cache folder")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            response, _, _ = _open(link.url, "*/*", context, settings.timeout)
            with response:
                length = link.size or int(getattr(response, "headers", {}).get("Content-Length") or 0)
                status(f"downloading {dest.name} ({length / 2**20:.0f} MiB) from pip's package index"
                       if length else f"downloading {dest.name} from pip's package index")
                progress = Progress(f"downloading {dest.name} (MiB)", max(1, -(-length // 2**20)), min_total=1)
                done = 0
                try:
                    while chunk := response.read(1 << 16):
                        out.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        progress(done // 2**20)
                finally:
                    progress.close()
        digest = h.hexdigest()
        if digest != link.sha256.lower():
            raise UsageError(f"{dest.name} from {_safe(link.url)}: sha256 mismatch (index says "
                             f"{shown(link.sha256, 70)}, the download is {digest}); nothing kept")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for the partial file only
        os.replace(tmp, dest)
        return digest
    except _Absent:
        raise UsageError(f"{dest.name}: {_safe(link.url)} does not exist") from None
    except (urllib.error.URLError, OSError, ssl.SSLError) as e:
        raise UsageError(f"downloading {dest.name} from {_safe(link.url)} failed: {_reason(e)}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def fetch_sdist(root: Path, env: Mapping[str, str] | None = None, status: StatusFn = _quiet,
                settings: IndexSettings | None = None, version: str = VLLM_VERSION) -> Path:
    """vLLM `version`'s source distribution, from `root` when a verified copy is
    there, else from pip's package index (verified against the index's sha256,
    then kept)."""
    dest = Path(root) / sdist_name(version)
    recorded = dest.with_name(dest.name + ".sha256")
    if dest.is_file() and recorded.is_file():
        with contextlib.suppress(OSError):
            if recorded.read_text().strip() == sha256_file(dest):
                return dest
    settings = settings or pip_index_settings(env)
    link = find_sdist(settings, dest.name)
    digest = download(link, dest, settings, status)
    with contextlib.suppress(OSError):
        recorded.write_text(digest + "\n")
    return dest


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


def check_sdist(path: str | os.PathLike) -> Path:
    """--sdist PATH: an existing file (its contents are checked when read)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--sdist {shown(str(path), 200)}: no such file")
    return p


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


def extract_tests(sdist: Path, root: Path, status: StatusFn = _quiet, version: str = VLLM_VERSION) -> Path:
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
    _make_dir(Path(root), "cache folder")
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


# --- test-only dependencies ----------------------------------------------------------------------

def release_test_dependencies(version: str = VLLM_VERSION) -> dict[str, str]:
    """{import name: pinned requirement} release `version`'s tests need beyond a
    scheduler-only vLLM install."""
    return dict(TEST_DEPENDENCIES_BY_RELEASE.get(version, TEST_DEPENDENCIES))


def absent_modules(python: str | os.PathLike, modules: Iterable[str]) -> set[str]:
    """The modules interpreter `python` cannot find (asked in a subprocess: no import)."""
    modules = list(modules)
    if not modules:
        return set()
    if str(python) == sys.executable:
        return {m for m in modules if importlib.util.find_spec(m) is None}
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
    try:
        proc = subprocess.run([str(python), "-c", code, *modules], capture_output=True, text=True,
                              timeout=120, check=False, env={k: v for k, v in os.environ.items()
                                                             if k != "PYTHONPATH"})
        return set(json.loads(proc.stdout.strip().splitlines()[-1])) if proc.returncode == 0 else set(modules)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return set(modules)


def missing_dependencies(deps: Path | None = None,
                         wanted: Mapping[str, str] | None = None,
                         python: str | os.PathLike | None = None) -> dict[str, str]:
    """{import name: requirement} of `wanted` (TEST_DEPENDENCIES) neither the
    interpreter `python` (this one) nor `deps` has."""
    wanted = TEST_DEPENDENCIES if wanted is None else wanted
    candidates = [m for m in wanted
                  if deps is None or not ((deps / m).is_dir() or (deps / f"{m}.py").is_file())]
    absent = absent_modules(python or sys.executable, candidates)
    return {m: wanted[m] for m in candidates if m in absent}


def deps_dir(root: Path, version: str = VLLM_VERSION) -> Path:
    """root/deps for the default release, root/deps-X for release X's environment."""
    return Path(root) / ("deps" if version == VLLM_VERSION else f"deps-{version}")


def ensure_test_dependencies(root: Path, status: StatusFn = _quiet,
                             python: str | None = None, version: str = VLLM_VERSION) -> list[Path]:
    """Folders to put on the tests' PYTHONPATH with the test-only packages the
    interpreter `python` (this one) lacks, and pytest where a release's
    environment lacks it: deps_dir(root, version), installed there by pip
    (--no-deps, pinned); where pip fails, a stand-in for tblib (root/stand-ins)
    so that tests/conftest.py loads."""
    deps = deps_dir(root, version)
    wanted = {**release_test_dependencies(version), **PYTEST_DEPENDENCIES}
    missing = missing_dependencies(deps, wanted, python)
    if missing:
        status(f"installing the test-only packages {', '.join(missing.values())} into {deps} "
               "(not into the interpreter)")
        _make_dir(Path(root), "cache folder")
        tmp = Path(tempfile.mkdtemp(prefix=".deps.", dir=root))
        try:
            cmd = [python or sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   "--no-deps", "--no-compile", "--target", str(tmp), *missing.values()]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            if proc.returncode == 0:
                deps.mkdir(parents=True, exist_ok=True)
                for item in tmp.iterdir():
                    target = deps / item.name
                    if target.exists():
                        shutil.rmtree(target) if target.is_dir() else target.unlink()
                    os.replace(item, target)
            else:
                last = (proc.stderr.strip().splitlines() or ["pip failed"])[-1]
                status(f"could not install {', '.join(missing.values())} ({shown(last, 160)}); "
                       "the tests that import them will fail plain")
        except (OSError, subprocess.SubprocessError) as e:
            status(f"could not run pip to install {', '.join(missing.values())}: {shown(str(e), 160)}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    paths = [deps] if deps.is_dir() else []
    if "tblib" in missing_dependencies(deps, {"tblib": TEST_DEPENDENCIES["tblib"]}, python):
        stand_in = Path(root) / "stand-ins" / "tblib"
        stand_in.mkdir(parents=True, exist_ok=True)
        (stand_in / "__init__.py").write_text(TBLIB_STAND_IN[0])
        (stand_in / "pickling_support.py").write_text("".join(TBLIB_STAND_IN))
        paths.append(stand_in.parent)
    if "pytest" in missing_dependencies(deps, {"pytest": PYTEST_DEPENDENCIES["pytest"]}, python):
        raise UsageError(f"pytest is not installed for vLLM {version}'s interpreter {shown(str(python), 200)}, "
                         f"and pip could not install it into {deps}")
    return paths


def installed_vllm() -> str | None:
    """The vLLM release this interpreter has, from its metadata (no import)."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def release_env_python(version: str) -> Path:
    """Release `version`'s interpreter where `schedspec install-vllm --version X`
    puts it: $SCHEDSPEC_CACHE/vllm-envs/X, default ~/.cache/schedspec/vllm-envs/X
    (cli/vllm_version.py env_python, which the command line owns)."""
    env = os.environ.get("SCHEDSPEC_CACHE", "").strip()
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec"
    return base / "vllm-envs" / version / "bin" / "python"


def release_python(version: str = VLLM_VERSION) -> str:
    """The interpreter that runs release `version`'s tests: this one when its vLLM
    is that release (or, for the default release, when no environment of it
    exists: the tests then show what is missing), else the environment of
    `schedspec install-vllm --version X` (cli/vllm_version.py)."""
    if installed_vllm() == version:
        return sys.executable
    py = release_env_python(version)
    if os.access(py, os.X_OK):
        return str(py)
    if version == VLLM_VERSION:
        return sys.executable
    raise UsageError(f"--version {version}: vLLM {version} is not installed for schedspec (no {py}); "
                     f"install it with `schedspec install-vllm --version {version}`")


# --- running pytest ------------------------------------------------------------------------------

def peer_environment(root: Path, hub: Path, python_path: Sequence[Path] = (),
                     base: Mapping[str, str] | None = None, version: str = VLLM_VERSION) -> dict[str, str]:
    """The environment vLLM's tests run in: offline, CPU, our hub cache and
    vLLM cache, the extra packages importable (schedspec is installed in
    the interpreter that runs them: .venv, or a release's environment)."""
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k.startswith("PYTEST_")]:
        env.pop(key)  # an outer pytest's settings (PYTEST_ADDOPTS, PYTEST_CURRENT_TEST, ...) are not ours
    env.update(OFFLINE_ENV)
    env["HF_HOME"] = str(hub.parent)
    env["HF_HUB_CACHE"] = str(hub)
    env["VLLM_CACHE_ROOT"] = str(Path(root) / ("vllm-cache" if version == VLLM_VERSION else f"vllm-cache-{version}"))
    paths = [str(p) for p in python_path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@dataclass
class PytestRun:
    """One pytest run: its mode, exit status, the plugin's report, its output."""
    mode: str
    returncode: int
    report: dict[str, Any] | None
    log: Path
    seconds: float


def run_pytest(tree: Path, targets: Sequence[str], run_dir: Path, env: Mapping[str, str], *,
               plain: bool, keyword: str | None = None, vectors_dir: Path | None = None,
               policy: str = "count", extra_args: Sequence[str] = (), status: StatusFn = _quiet,
               show_progress: bool | None = None, python: str | None = None,
               vllm_version: str | None = None) -> PytestRun:
    """pytest on `targets` in `tree`, in a subprocess of `python` (this
    interpreter), with the plugin; its output goes to run_dir/pytest-<mode>.log,
    the count of tests done to stderr.  With `vllm_version` the plugin refuses
    to run unless that interpreter's vLLM is that release."""
    mode = "plain" if plain else "shadow"
    run_dir = _make_dir(Path(run_dir), "run folder")
    report = run_dir / f"report-{mode}.json"
    progress_file = run_dir / f"progress-{mode}.txt"
    log = run_dir / f"pytest-{mode}.log"
    work = _make_dir(run_dir / f"cwd-{mode}", "run folder")  # files tests write with relative names
    for p in (report, progress_file):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    python = python or sys.executable
    cmd = [python, "-m", "pytest", *[str(Path(tree) / t) for t in targets],
           "--rootdir", str(tree), "-c", str(Path(tree) / "pyproject.toml"),
           "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rN", "--continue-on-collection-errors",
           "--schedspec-report", str(report), "--schedspec-progress", str(progress_file)]
    if vllm_version:
        cmd += ["--schedspec-vllm-version", vllm_version]
    if plain:
        cmd.append("--schedspec-plain")
    else:
        cmd += ["--schedspec-policy", policy]
        if vectors_dir is not None:
            cmd += ["--schedspec-vectors", str(vectors_dir)]
    if keyword:
        cmd += ["-k", keyword]
    cmd += list(extra_args)
    status(f"running vLLM's tests {'plain (no monitor)' if plain else 'under the shadow monitor'}; "
           f"pytest output in {log}")
    t0 = time.monotonic()
    progress = Progress(f"vLLM tests, {mode}", 1, enabled=show_progress, min_total=1)
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(cmd, cwd=work, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        except OSError as e:
            raise UsageError(f"cannot run {shown(python, 200)} -m pytest: {e.strerror or e}") from None
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    _show_progress(progress_file, progress)
            _show_progress(progress_file, progress)
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            progress.close()
    seconds = time.monotonic() - t0
    data = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(report.read_text())
    if data is None or proc.returncode in (2, 3, 4):
        raise UsageError(f"pytest ({mode}) stopped with exit status {proc.returncode} before finishing: "
                         f"{shown(_last_line(log), 200)} (full output: {log})")
    return PytestRun(mode, proc.returncode, data, log, seconds)


def _show_progress(progress_file: Path, progress: Progress) -> None:
    try:
        lines = progress_file.read_text().splitlines()
    except OSError:
        return
    if not lines or not lines[0].startswith("collected "):
        return
    with contextlib.suppress(ValueError):
        total = int(lines[0].split()[1])
        progress(len(lines) - 1, max(total, 1))


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 20000))
            lines = [ln for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    errors = [ln for ln in lines if ln.startswith(("E ", "ERROR", "ImportError", "error:"))]
    return (errors or lines or ["no output"])[-1].strip()


# --- the table -----------------------------------------------------------------------------------

CALL_NAMES = ("schedule", "update_from_output", "add_request", "finish_requests")


def _file_of(nodeid: str, test_root: str = TEST_ROOT) -> str:
    path = nodeid.split("::", 1)[0]
    return path.removeprefix(test_root + "/")


def _outcome(report: Mapping[str, Any] | None, nodeid: str) -> str | None:
    if report is None:
        return None
    entry = report.get("tests", {}).get(nodeid)
    return entry.get("outcome") if isinstance(entry, Mapping) else None


def _blank_row(name: str) -> dict[str, Any]:
    return {"file": name, "collected": 0,
            "plain": {"passed": 0, "failed": 0, "error": 0, "skipped": 0},
            "shadow": {"passed": 0, "failed": 0, "error": 0, "skipped": 0},
            "calls": {c: {"total": 0, "checked": 0, "outside_scope": 0} for c in CALL_NAMES},
            "calls_total": 0, "calls_checked": 0, "outside_scope": {}, "divergences": 0,
            "divergences_not_counted": 0, "monitor_errors": 0, "plain_pass_shadow_fail": 0}


def _add_stats(row: dict[str, Any], stats: Mapping[str, Any]) -> None:
    for name, counts in (stats.get("calls") or {}).items():
        slot = row["calls"].setdefault(name, {"total": 0, "checked": 0, "outside_scope": 0})
        for key in ("total", "checked", "outside_scope"):
            slot[key] = slot.get(key, 0) + int((counts or {}).get(key, 0) or 0)
    outside = Counter(row["outside_scope"])
    outside.update({k: int(v) for k, v in (stats.get("outside_scope") or {}).items()})
    row["outside_scope"] = dict(sorted(outside.items()))
    row["calls_total"] = sum(c.get("total", 0) for c in row["calls"].values())
    row["calls_checked"] = sum(c.get("checked", 0) for c in row["calls"].values())


def build_table(plain: Mapping[str, Any] | None, shadow: Mapping[str, Any] | None,
                test_root: str = TEST_ROOT, version: str = VLLM_VERSION) -> dict[str, Any]:
    """The per-file table from the plugin's reports (either may be None).

    A test that fails plain is vLLM's test failing on this machine: it is listed
    with its message and nothing it did under the monitor counts against the
    spec.  A test that passes plain and not shadowed, and a divergence in a
    test that passes plain, make the run fail (exit_status 1)."""
    plain_tests = dict((plain or {}).get("tests", {}))
    shadow_tests = dict((shadow or {}).get("tests", {}))
    ids = sorted(set(plain_tests) | set(shadow_tests))
    rows: dict[str, dict[str, Any]] = {}
    plain_failures, pass_fail, divergences, monitor_errors = [], [], [], []
    for nodeid in ids:
        row = rows.setdefault(_file_of(nodeid, test_root), _blank_row(_file_of(nodeid, test_root)))
        row["collected"] += 1
        p_out, s_out = _outcome(plain, nodeid), _outcome(shadow, nodeid)
        if plain is not None and p_out in row["plain"]:
            row["plain"][p_out] += 1
        if shadow is not None and s_out in row["shadow"]:
            row["shadow"][s_out] += 1
        if plain is not None and p_out in ("failed", "error"):
            plain_failures.append({"test": nodeid, "outcome": p_out,
                                   "message": plain_tests[nodeid].get("message"),
                                   "missing_modules": list(plain_tests[nodeid].get("missing_modules") or [])})
        counted = plain is None or p_out == "passed"
        if plain is not None and shadow is not None and p_out == "passed" and s_out != "passed":
            row["plain_pass_shadow_fail"] += 1
            entry = shadow_tests.get(nodeid) or {}
            pass_fail.append({"test": nodeid, "outcome": s_out or "not run", "message": entry.get("message")})
        stats = (shadow_tests.get(nodeid) or {}).get("stats")
        if not isinstance(stats, Mapping):
            continue
        _add_stats(row, stats)
        for d in stats.get("divergences") or []:
            divergences.append({"test": nodeid, "counted": counted, **dict(d)})
            row["divergences" if counted else "divergences_not_counted"] += 1
        for e in stats.get("monitor_errors") or []:
            monitor_errors.append({"test": nodeid, **dict(e)})
            row["monitor_errors"] += 1
    files = [rows[k] for k in sorted(rows)]
    totals = _blank_row("total")
    for row in files:
        totals["collected"] += row["collected"]
        for mode in ("plain", "shadow"):
            for k, v in row[mode].items():
                totals[mode][k] += v
        _add_stats(totals, {"calls": row["calls"], "outside_scope": row["outside_scope"]})
        for k in ("divergences", "divergences_not_counted", "monitor_errors", "plain_pass_shadow_fail"):
            totals[k] += row[k]
    # Grouped by the message; the modules any of a group's outputs names (vLLM
    # logs a failed model inspection once, in the first test that hits it).
    causes = Counter(_first_line(f["message"]) for f in plain_failures)
    modules: dict[str, set[str]] = {}
    for f in plain_failures:
        modules.setdefault(_first_line(f["message"]), set()).update(f["missing_modules"])
    bad = any(d["counted"] for d in divergences) or bool(pass_fail)
    return {"format": TABLE_FORMAT, "vllm": version, "test_root": test_root,
            "modes": [m for m, r in (("plain", plain), ("shadow", shadow)) if r is not None],
            "files": files, "totals": totals,
            "divergences": divergences, "plain_pass_shadow_fail": pass_fail,
            "monitor_errors": monitor_errors, "plain_failures": plain_failures,
            "plain_failure_causes": [{"cause": _cause(c, sorted(modules[c])), "tests": n}
                                     for c, n in causes.most_common()],
            "exit_status": 1 if bad else 0}


def _cause(message: str | None, missing_modules: Sequence[str] = ()) -> str:
    """A failure message cut to what tells failures apart: its first line (for
    pydantic's "1 validation error for X", the error's own line), and the
    modules its output says are not installed."""
    cause = _first_line(message)
    if missing_modules:
        cause += f" (not installed: {', '.join(missing_modules)})"
    return cause


def _first_line(message: str | None) -> str:
    lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    line = lines[0]
    head, sep, model = line.rpartition(" validation error for ")
    if not sep:
        head, sep, model = line.rpartition(" validation errors for ")
    if sep and len(lines) > 1:
        line = f"{head.split(':')[0].rsplit('.', 1)[-1]} ({model}): {lines[1]}"
    for cut in (" [type=", ", input_value="):
        line = line.split(cut)[0]
    return line[:240]


def format_table(table: Mapping[str, Any], vectors_dir: str | None = None) -> str:
    """The table as text, for a terminal."""
    modes = table.get("modes", [])
    has_plain, has_shadow = "plain" in modes, "shadow" in modes
    rows = [*table["files"], table["totals"]]
    width = max([len("file"), *(len(r["file"]) for r in rows)])
    head = f"{'file':<{width}}  {'tests':>5}"
    if has_plain:
        head += f"  {'plain: pass':>11} {'fail':>5} {'skip':>5}"
    if has_shadow:
        head += f"  {'shadow: pass':>12} {'calls checked/total':>20} {'outside':>8} {'diverg.':>7} {'mon.err':>7}"
        if has_plain:
            head += f" {'pass->fail':>10}"
    lines = [f"vLLM {table.get('vllm', VLLM_VERSION)}'s {table.get('test_root', TEST_ROOT)} tests on this machine"
             + (" (plain: without the monitor; shadow: every scheduler call checked against the spec)"
                if has_shadow else " (plain: without the monitor)"), head, "-" * len(head)]
    for r in rows:
        if r is table["totals"]:
            lines.append("-" * len(head))
        line = f"{shown(r['file'], 60):<{width}}  {r['collected']:>5}"
        if has_plain:
            p = r["plain"]
            line += f"  {p['passed']:>11} {p['failed'] + p['error']:>5} {p['skipped']:>5}"
        if has_shadow:
            s = r["shadow"]
            outside = sum(c.get("outside_scope", 0) for c in r["calls"].values())
            line += (f"  {s['passed']:>12} {str(r['calls_checked']) + '/' + str(r['calls_total']):>20} "
                     f"{outside:>8} {r['divergences']:>7} {r['monitor_errors']:>7}")
            if has_plain:
                line += f" {r['plain_pass_shadow_fail']:>10}"
        lines.append(line)
    totals = table["totals"]
    if has_shadow:
        calls = ", ".join(f"{name} {c.get('checked', 0)}/{c.get('total', 0)}"
                          for name, c in totals["calls"].items())
        lines.append(f"\nscheduler calls checked/made: {calls or 'none'}")
        # Cut only what no feature name of scope.py reaches (the longest is 47 characters).
        features = ", ".join(f"{shown(k, 60)} {v}" for k, v in totals["outside_scope"].items())
        lines.append(f"calls outside the spec's scope, by feature: {features or 'none'}")
    divs = table.get("divergences", [])
    if divs:
        lines.append(f"\ndivergences ({sum(d['counted'] for d in divs)} counted):")
        for d in divs:
            where = f"{d.get('call', '?')} #{d.get('call_number', '?')}"
            field_ = f" field {shown(d.get('field'), 60)}" if d.get("field") else ""
            vector = f"; state vector {shown(d.get('vector'), 300)}" if d.get("vector") else ""
            note = "" if d["counted"] else " (test fails plain: not counted)"
            lines.append(f"  {shown(d['test'], 160)}  {where}{field_}{vector}{note}")
    if table.get("plain_pass_shadow_fail"):
        lines.append("\npassed plain, not under the monitor (failures of this run):")
        for t in table["plain_pass_shadow_fail"]:
            msg = f": {shown(_cause(t.get('message')), 160)}" if t.get("message") else ""
            lines.append(f"  {shown(t['test'], 160)}  {t['outcome']}{msg}")
    if table.get("monitor_errors"):
        lines.append(f"\nmonitor errors ({len(table['monitor_errors'])}):")
        for e in table["monitor_errors"][:20]:
            lines.append(f"  {shown(e['test'], 160)}  {e.get('call', '?')} #{e.get('call_number', '?')}: "
                         f"{shown(e.get('error'), 160)}")
        if len(table["monitor_errors"]) > 20:
            lines.append(f"  ... {len(table['monitor_errors']) - 20} more (--json-out lists them all)")
    if table.get("plain_failures"):
        lines.append(f"\nfailing plain, on vLLM alone ({len(table['plain_failures'])} tests; not counted "
                     "against the spec), by cause:")
        for c in table["plain_failure_causes"]:
            lines.append(f"  {c['tests']:>4}  {shown(c['cause'], 240)}")
    if has_shadow:
        verdict = ("FAIL: " + ", ".join(x for x in (
            f"{totals['divergences']} divergences" if totals["divergences"] else "",
            f"{totals['plain_pass_shadow_fail']} tests pass plain and fail shadowed"
            if totals["plain_pass_shadow_fail"] else "") if x)) if table["exit_status"] else \
            "ok: no divergence, and every test that passes plain passes under the monitor"
        lines.append(f"\n{verdict}")
    return "\n".join(lines)


# --- all of it -----------------------------------------------------------------------------------

@dataclass
class PeerTestOptions:
    """What `schedspec peer-tests` runs (the command's flags, as values)."""
    files: Sequence[str] | None = None
    all_files: bool = False
    keyword: str | None = None
    plain_only: bool = False
    plain_for: str = "all"  # or "failures": plain only where the shadowed run failed or diverged
    sdist: str | None = None
    cache: str | None = None
    vectors_dir: str | None = None
    policy: str = "count"
    extra_pytest_args: Sequence[str] = field(default_factory=tuple)
    workers: int = 1
    version: str = VLLM_VERSION


def prepare(options: PeerTestOptions, status: StatusFn = _quiet) -> tuple[Path, Path, dict[str, str], str]:
    """(cache root, extracted tree, the tests' environment, the interpreter),
    everything fetched and written, for release options.version."""
    version = check_version(options.version)
    python = release_python(version)  # before anything is fetched: a missing environment is one line
    root = _make_dir(cache_root(options.cache), "cache folder")
    sdist = check_sdist(options.sdist) if options.sdist else fetch_sdist(root, status=status, version=version)
    tree = extract_tests(sdist, root, status, version)
    hub = root / "hf" / "hub"
    try:
        write_model_configs(hub)
    except OSError as e:
        raise UsageError(f"cannot write the model configs into {shown(str(hub), 200)}: {e.strerror or e}") from None
    paths = ensure_test_dependencies(root, status, python=python, version=version)
    return root, tree, peer_environment(root, hub, paths, version=version), python


def new_run_dir(root: Path, keep: int = 10) -> Path:
    """root/runs/<time>-<pid>, the older runs beyond the last `keep` removed."""
    runs = _make_dir(Path(root) / "runs", "cache folder")
    old = sorted(p for p in runs.iterdir() if p.is_dir())
    for p in old[: max(0, len(old) - keep + 1)]:
        shutil.rmtree(p, ignore_errors=True)
    return _make_dir(runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", "run folder")


def file_groups(targets: Sequence[str], groups: int) -> list[list[str]]:
    """`targets` dealt round-robin by file into at most `groups` non-empty
    groups, in order: the node ids of one file stay in one group."""
    files: dict[str, list[str]] = {}
    for t in targets:
        files.setdefault(t.partition("::")[0], []).append(t)
    per_file = list(files.values())
    groups = max(1, min(groups, len(per_file)))
    return [[t for f in per_file[k::groups] for t in f] for k in range(groups)]


def merge_runs(mode: str, runs: Sequence[PytestRun]) -> PytestRun:
    """One mode's pytest runs over groups of files, as one run: the plugin's
    reports joined (each test is in one group), the exit status pytest gives a
    whole session (1 if any test failed, 5 only if none was collected anywhere)."""
    if len(runs) == 1:
        return runs[0]
    tests: dict[str, Any] = {}
    for r in runs:
        tests.update((r.report or {}).get("tests", {}))
    codes = [r.returncode for r in runs]
    code = 5 if all(c == 5 for c in codes) else (1 if 1 in codes else 0)
    report = {**(runs[0].report or {}), "tests": tests}
    return PytestRun(mode, code, report, runs[0].log, max(r.seconds for r in runs))


def _untouched_failure(entry: Any) -> bool:
    """A shadowed test that failed before any scheduler call, with nothing from
    the monitor (no divergence, no monitor error)."""
    if not isinstance(entry, Mapping) or entry.get("outcome") not in ("failed", "error"):
        return False
    stats = entry.get("stats")
    if not isinstance(stats, Mapping):
        return False
    calls = stats.get("calls")
    if not isinstance(calls, Mapping) or any(not isinstance(c, Mapping) or c.get("total") != 0
                                             for c in calls.values()):
        return False
    return not stats.get("divergences") and not stats.get("monitor_errors")


def missing_package_failures(shadow: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """node id -> missing modules, for the shadowed tests that failed on a package
    this machine lacks before any scheduler call: those whose output names a
    module not installed, and those failing the same way (the same first line)
    without saying it again (vLLM remembers a model it failed to inspect and
    logs the cause once).  The monitor acts only through the scheduler's
    methods, so such a test fails the same way plain: `--plain-for failures`
    infers that outcome instead of running it again."""
    tests = (shadow or {}).get("tests") or {}
    untouched = {nodeid: entry for nodeid, entry in tests.items() if _untouched_failure(entry)}
    causes: dict[str, set[str]] = {}
    for entry in untouched.values():
        if entry.get("missing_modules"):
            causes.setdefault(_first_line(entry.get("message")), set()).update(entry["missing_modules"])
    out = {}
    for nodeid, entry in untouched.items():
        modules = set(entry.get("missing_modules") or ()) | causes.get(_first_line(entry.get("message")), set())
        if modules:
            out[nodeid] = sorted(modules)
    return out


def needs_plain_run(shadow: Mapping[str, Any] | None) -> list[str]:
    """The node ids of a shadowed run whose verdict needs the plain outcome: the
    tests that did not pass or skip under the monitor (did they fail plain too?),
    except those that failed on a missing package before any scheduler call
    (missing_package_failures), and those with a divergence (does it count?),
    in order."""
    out = []
    inferred = missing_package_failures(shadow)
    for nodeid, entry in sorted(((shadow or {}).get("tests") or {}).items()):
        stats = entry.get("stats") if isinstance(entry, Mapping) else None
        diverged = isinstance(stats, Mapping) and bool(stats.get("divergences"))
        if diverged or (_outcome(shadow, nodeid) not in ("passed", "skipped") and nodeid not in inferred):
            out.append(nodeid)
    return out


def plain_report_where_needed(shadow: Mapping[str, Any] | None, plain: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plain report of a `--plain-for failures` run: the plain outcome of
    the tests rerun plain, and for the others the shadowed outcome, marked
    `inferred`: for those that passed or skipped under the monitor with no
    divergence (a monitor that only observes cannot make a failing test pass),
    and for those that failed on a missing package before any scheduler call
    (missing_package_failures), with the shadowed failure's message and the
    missing modules.  A rerun test that was not reported plain (deselected, not
    collected) stays absent, so the table shows it and does not count it as
    passing."""
    tests: dict[str, Any] = {}
    rerun = set(needs_plain_run(shadow))
    missing = missing_package_failures(shadow)
    for nodeid, entry in ((shadow or {}).get("tests") or {}).items():
        if nodeid not in rerun:
            tests[nodeid] = {"outcome": _outcome(shadow, nodeid), "inferred": True}
            if nodeid in missing:
                tests[nodeid].update(message=entry.get("message"), missing_modules=missing[nodeid])
    tests.update(((plain or {}).get("tests") or {}))
    return {**(plain or {}), "tests": tests}


def run_peer_tests(options: PeerTestOptions, status: StatusFn = _quiet,
                   show_progress: bool | None = None) -> dict[str, Any]:
    """Fetch, extract, run plain (and, unless plain_only, under the monitor); the table.

    With `options.workers` > 1 the pytest sessions run at once: plain beside
    shadowed, and with 4 or more workers each mode split into groups of files
    (each pytest process imports vLLM, about 10 s, so files are split only
    where there are cores to pay for it).  Tests never share a session across
    groups that they would not share in one: a file is never split."""
    from concurrent.futures import ThreadPoolExecutor

    root, tree, env, python = prepare(options, status)
    version = options.version
    targets = resolve_targets(tree, options.files, options.all_files)
    lacking = default_files(tree)[1] if not (options.files or options.all_files) else []
    if lacking:
        status(f"vLLM {version}'s {TEST_ROOT} has no {', '.join(lacking)}: left out of the default files")
    paths = None if targets == [TEST_ROOT] else \
        sorted({t.partition("::")[0].removeprefix(TEST_ROOT + "/") for t in targets})
    unconfigured = [m for m in named_models(tree, paths) if m not in model_configs()]
    if unconfigured:
        status(f"no offline config for {', '.join(unconfigured)} (named by vLLM {version}'s tests): "
               "the tests that load them fail plain")
    run_dir = new_run_dir(root)
    vectors = Path(options.vectors_dir) if options.vectors_dir else run_dir / "vectors"
    if options.plain_for not in ("all", "failures"):
        raise UsageError(f"--plain-for: {shown(options.plain_for)} is neither all nor failures")
    modes = ["plain"] if options.plain_only else ["shadow"] if options.plain_for == "failures" else \
        ["plain", "shadow"]
    if "shadow" in modes:
        _make_dir(vectors, "--vectors-out folder")
    workers = max(1, options.workers)
    wanted = max(1, workers // len(modes))
    if wanted > 1 and targets == [TEST_ROOT]:  # --all: the files, so that they can be dealt out
        targets = [f"{TEST_ROOT}/{f}" for f in available_files(tree)]
    groups = file_groups(targets, wanted)
    jobs = [(mode, k, group) for mode in modes for k, group in enumerate(groups)]
    alone = workers == 1 or len(jobs) == 1

    def job(mode: str, k: int, group: list[str]) -> PytestRun:
        where = run_dir if len(groups) == 1 else run_dir / f"group-{k}"
        return run_pytest(tree, group, where, env, plain=mode == "plain", keyword=options.keyword,
                          vectors_dir=vectors if mode == "shadow" else None, policy=options.policy,
                          extra_args=options.extra_pytest_args, status=status,
                          show_progress=show_progress if alone else False, python=python,
                          vllm_version=None if python == sys.executable and version == VLLM_VERSION else version)

    if alone:
        done = [job(*j) for j in jobs]
    else:
        status(f"{len(jobs)} pytest sessions, {min(workers, len(jobs))} at a time")
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            done = list(pool.map(lambda j: job(*j), jobs))
    runs = {mode: merge_runs(mode, [r for (m, _, _), r in zip(jobs, done) if m == mode]) for mode in modes}
    if options.plain_for == "failures" and not options.plain_only:
        rerun = needs_plain_run(runs["shadow"].report)
        if rerun:
            status(f"{len(rerun)} tests failed or diverged under the monitor: running them plain")
            plain = run_pytest(tree, rerun, run_dir, env, plain=True, keyword=options.keyword,
                               extra_args=options.extra_pytest_args, status=status,
                               show_progress=show_progress, python=python,
                               vllm_version=None if python == sys.executable and version == VLLM_VERSION
                               else version)
        else:
            plain = PytestRun("plain", 0, {"tests": {}}, runs["shadow"].log, 0.0)
        runs = {"plain": PytestRun("plain", plain.returncode,
                                   plain_report_where_needed(runs["shadow"].report, plain.report),
                                   plain.log, plain.seconds), **runs}
    first = runs["plain" if options.plain_only else "shadow"] if options.plain_for == "failures" else runs["plain"]
    if first.returncode == 5 or not first.report.get("tests"):
        raise UsageError(f"no test selected in {', '.join(targets)}"
                         + (f" by -k {shown(options.keyword)}" if options.keyword else ""))
    table = build_table(runs["plain"].report, runs["shadow"].report if "shadow" in runs else None,
                        version=version)
    table["run"] = {"targets": targets, "default_files_absent": lacking, "python": python,
                    "models_without_config": unconfigured,
                    "keyword": options.keyword, "run_dir": str(run_dir),
                    "vectors_dir": str(vectors) if "shadow" in runs else None, "workers": workers,
                    "pytest_sessions": len(jobs), "plain_for": options.plain_for,
                    "plain_inferred": sum(1 for e in runs["plain"].report.get("tests", {}).values()
                                          if isinstance(e, Mapping) and e.get("inferred")),
                    **{f"{mode}_seconds": round(r.seconds, 1) for mode, r in runs.items()},
                    **{f"{mode}_pytest_exit": r.returncode for mode, r in runs.items()},
                    **{f"{mode}_log": str(r.log) for mode, r in runs.items()}}
    return table


__all__ = ["DEFAULT_FILES", "IndexSettings", "PYTEST_DEPENDENCIES", "PeerTestOptions", "PytestRun",
           "SDIST_NAME", "SdistLink", "TEST_DEPENDENCIES", "TEST_ROOT", "VLLM_VERSION", "absent_modules",
           "available_files", "build_table", "cache_root", "check_sdist", "check_version", "default_files",
           "deps_dir", "download", "ensure_test_dependencies", "extract_tests", "fetch_sdist", "file_groups",
           "find_sdist", "format_table", "imported_modules", "installed_vllm", "merge_runs",
           "missing_dependencies", "model_configs", "named_models", "needed_files", "needs_plain_run", "new_run_dir",
           "parse_project_page", "peer_environment", "pip_config_values", "pip_default_index",
           "pip_index_settings", "plain_report_where_needed", "prepare", "read_sdist", "release_env_python", "release_python",
           "release_test_dependencies", "resolve_targets", "run_peer_tests", "run_pytest", "sdist_name",
           "sha256_file", "ssl_context", "write_model_configs"]
