"""Fixtures shared by the test files."""

from __future__ import annotations

import os

import pytest


def vllm_required() -> bool:
    """CI (CI=true) and SCHEDSPEC_REQUIRE_VLLM=1 must have vLLM: a missing install
    is a failure there, a skip elsewhere."""
    return os.environ.get("SCHEDSPEC_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true"


@pytest.fixture(scope="module")
def vllm():
    """The real vLLM 0.33.0 scheduler behind the implementation protocol."""
    try:
        from schedspec.reference.vllm_adapter import VllmScheduler

        impl = VllmScheduler()
    except ImportError as e:
        if vllm_required():
            pytest.fail(f"vLLM is required here (SCHEDSPEC_REQUIRE_VLLM=1 or CI=true) but cannot be imported: {e}")
        pytest.skip(f"vLLM 0.33.0 is not installed ({e}); run `schedspec install-vllm`")
    yield impl
    impl.close()
