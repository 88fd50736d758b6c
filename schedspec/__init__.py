"""schedspec: an executable specification of vLLM 0.33.0's V1 scheduler."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("schedspec")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
