"""schedspec: an executable specification of vLLM's V1 scheduler (releases 0.20.0 to 0.34.0)."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("schedspec")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
