"""`--impl vllm==X` and `--vllm-version X`: which vLLM release a command models.

Each release X runs from its own virtualenv (`schedspec install-vllm --version X`,
cli/install/install-vllm.sh): vLLM's releases cannot share one interpreter.  A command
that names `vllm==X` while this interpreter has another vLLM re-executes itself
under X's interpreter (`python -m schedspec` with the same arguments), so vLLM X
and the spec run in one process there.  In that process, and with
`--impl spec --vllm-version X`, scenarios whose config names no `vllm_version`
model release X: `apply` says which release, and the command passes it to what
reads or draws scenarios (reference/scenario.py `load_scenario`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator, Sequence

from schedspec.reference.errors import UsageError, shown
from schedspec.gpu.limits import OLDEST_RELEASE as TORCH_OLDEST
from schedspec.spec.versions import DEFAULT_RELEASE, RELEASES, release_key, spec_release_for

PREFIX = "vllm=="
# Set in the re-executed process: a second re-exec would be a loop.
REEXEC_ENV = "SCHEDSPEC_VLLM_REEXEC"
IMPL_FLAGS = ("--impl", "--against")


def cache_root() -> Path:
    env = os.environ.get("SCHEDSPEC_CACHE", "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "schedspec"


def env_dir(version: str) -> Path:
    """Where `schedspec install-vllm --version X` puts release X's virtualenv."""
    return cache_root() / "vllm-envs" / version


def env_python(version: str) -> Path:
    return env_dir(version) / "bin" / "python"


def check_release(version: str, what: str) -> str:
    if version not in RELEASES:
        raise UsageError(f"{what}: {shown(version)} is not a vLLM release schedspec models; "
                         f"use one of {', '.join(RELEASES)}")
    return version


def check_vllm(version: str, what: str) -> str:
    """A vLLM version schedspec can run: a modelled release, or a later one (or a
    development build) that it compares with the newest modelled release at or below it."""
    if spec_release_for(version) is None:
        raise UsageError(f"{what}: {shown(version)} is not a vLLM release schedspec models, nor one after "
                         f"{RELEASES[0]}; use one of {', '.join(RELEASES)}")
    return version


def unmodelled_note(version: str) -> str | None:
    """The one-line note for a vLLM that is not a modelled release, or None."""
    spec = spec_release_for(version)
    if version in RELEASES or spec is None:
        return None
    return (f"schedspec: note: vLLM {version} is not a release schedspec models; it is compared with the spec "
            f"at {spec}, the newest modelled release at or below it (`schedspec keep-up {version}` reports "
            "what the spec would have to learn)")


def split_impl(name: str) -> tuple[str, str | None]:
    """`vllm==0.30.0` -> ("vllm", "0.30.0"); any other name -> (name, None).  X may be a
    release schedspec does not model yet (`check_vllm`)."""
    if name.startswith(PREFIX):
        return "vllm", check_vllm(name[len(PREFIX):], f"--impl {name}")
    return name, None


def installed_vllm() -> str | None:
    """The vLLM version this interpreter has (from its metadata: no import), or None."""
    import importlib.metadata as md

    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def flag_values(argv: Sequence[str], flags: Sequence[str]) -> Iterator[str]:
    """The values of every `FLAG X` / `FLAG=X` in `argv` whose FLAG is one of `flags`, in order."""
    args = list(argv)
    for i, a in enumerate(args):
        for flag in flags:
            if a == flag and i + 1 < len(args):
                yield args[i + 1]
            elif a.startswith(flag + "="):
                yield a[len(flag) + 1:]


def requested_release(argv: Sequence[str]) -> str | None:
    """The X of the first `--impl vllm==X` / `--against vllm==X` in `argv`."""
    return next((v[len(PREFIX):] for v in flag_values(argv, IMPL_FLAGS) if v.startswith(PREFIX)), None)


def refuse_two_releases(versions: set[str]) -> None:
    """A one-line UsageError when a command names more than one modelled release."""
    if len(versions) > 1:
        raise UsageError(f"the command names vLLM releases {' and '.join(sorted(versions))}; one process "
                         "models one release (`schedspec changes A B` compares two)")


def reexec_if_needed(argv: Sequence[str]) -> None:
    """Re-execute `schedspec argv` under release X's interpreter when `argv` asks
    for `vllm==X` and this interpreter has another vLLM (or none).  Returns when
    nothing needs doing; a one-line UsageError when X's env is missing."""
    version = requested_release(argv)
    if version is None:
        return
    check_vllm(version, f"--impl vllm=={version}")
    asked = next(flag_values(argv, ("--vllm-version",)), None)
    if asked is not None and spec_release_for(version) is not None:
        # A usage error whatever is installed: said before asking for an install.
        refuse_two_releases({spec_release_for(version), check_release(asked, "--vllm-version")})
    if installed_vllm() == version:
        return
    if os.environ.get(REEXEC_ENV) == version:
        raise UsageError(f"--impl vllm=={version}: the interpreter {sys.executable} of vLLM {version}'s "
                         f"environment has vllm {installed_vllm()}; reinstall it with "
                         f"`schedspec install-vllm --version {version}`")
    py = env_python(version)
    if not os.access(py, os.X_OK):
        raise UsageError(f"--impl vllm=={version}: vLLM {version} is not installed for schedspec (no "
                         f"{py}); install it with `schedspec install-vllm --version {version}`")
    os.environ[REEXEC_ENV] = version
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(str(py), [str(py), "-m", "schedspec", *argv])


def apply(args) -> str:
    """After parsing: the release the command models.  `--impl vllm==X` (in the
    process that has vLLM X) or `--vllm-version X` make X the release of every
    scenario whose config names none."""
    versions = set()
    names = [n for n in (getattr(args, "impl", None), getattr(args, "against", None)) if isinstance(n, str)]
    for name in names:
        base, version = split_impl(name)
        if version is None and name == "vllm" and spec_release_for(installed_vllm() or "") is not None:
            version = installed_vllm()  # plain `vllm`: the release this interpreter has
        if version is not None:
            note = unmodelled_note(version)
            if note:
                print(note, file=sys.stderr)
            versions.add(spec_release_for(version))
    asked = getattr(args, "vllm_version", None)
    if asked is not None:
        versions.add(check_release(asked, "--vllm-version"))
    refuse_two_releases(versions)
    if "torch" in names and versions and release_key(min(versions, key=release_key)) < release_key(TORCH_OLDEST):
        raise UsageError(f"--impl torch models vLLM {TORCH_OLDEST} and later, not {versions.pop()}")
    return versions.pop() if versions else DEFAULT_RELEASE


def add_vllm_version_argument(parser) -> None:
    parser.add_argument("--vllm-version", default=None, metavar="X",
                        help=f"the vLLM release the spec models for scenarios whose config names none "
                             f"(default {DEFAULT_RELEASE}; {', '.join(RELEASES)}); --impl vllm==X sets it too")


__all__ = ["add_vllm_version_argument", "apply", "check_release", "check_vllm", "unmodelled_note", "env_dir", "env_python", "installed_vllm",
           "reexec_if_needed", "refuse_two_releases", "requested_release", "split_impl"]
