"""Small builders for hand-made scheduler states."""

from __future__ import annotations

import json
import re

import pytest

from schedspec.reference.vectors import VectorError, read_vector
from schedspec.spec import scheduler as S
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.kv_cache import cdiv
from schedspec.spec.request import EOS_TOKEN_ID, Request, RequestStatus
from schedspec.spec.input_processor import make_request
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState


def config(**kw) -> SchedulerConfig:
    base = dict(max_num_batched_tokens=64, max_num_seqs=16, max_model_len=64, num_gpu_blocks=1000)
    base.update(kw)
    return SchedulerConfig(**base)


def running_state(c: SchedulerConfig, decodes: int, prompt_len: int = 1, **req_kw) -> SchedulerState:
    """`decodes` requests already running, each past its prefill and needing one token."""
    reqs, blocks = {}, {}
    for i in range(decodes):
        rid = f"d{i}"
        r = Request(rid, prompt_len, max_tokens=1000, arrival_time=float(i), status=RequestStatus.RUNNING,
                    num_computed_tokens=prompt_len, num_output_tokens=1, **req_kw)
        reqs[rid] = r
        blocks[rid] = cdiv(prompt_len, c.block_size)
    used = sum(blocks.values())
    return SchedulerState(config=c, requests=reqs, running=tuple(reqs), waiting=(), kv_cache=BlockCounts(c.num_usable_blocks - used, blocks))


def add(state: SchedulerState, rid: str, prompt_len: int, max_tokens: int | None = None, **kw) -> SchedulerState:
    r = make_request(state.config, rid, prompt_len, max_tokens, kw.pop("priority", 0),
                     kw.pop("arrival_time", float(len(state.requests))))
    return S.add_request(state, r)


def step(state: SchedulerState, eos: set[str] = frozenset()):
    """schedule + fake model + update_from_output; returns (output, finished, state)."""
    out, mid = S.schedule(state)
    sampled = {rid: [EOS_TOKEN_ID if rid in eos else 100] for rid, _ in out.num_scheduled_tokens
               if mid.requests[rid].num_computed_tokens >= mid.requests[rid].num_tokens}
    finished, after = S.update_from_output(mid, out, sampled)
    return out, finished, after


def cli(capsys, *args):
    """`schedspec ARGS` in-process: (exit status, stdout, stderr)."""
    from schedspec.cli.main import main

    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *words):
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err


def assert_vector_file_error(vector: dict, tmp_path, message: str) -> None:
    """Written to a file, `vector` is refused by `read_vector` in one line that starts
    with the file's path and then matches the regex `message` (searched)."""
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(vector))
    with pytest.raises(VectorError) as e:
        read_vector(p)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{p}: "), text
    assert re.search(message, text.removeprefix(f"{p}: ")), text


def python_of(release: str):
    """The interpreter that has vLLM `release` (this one, or its install-vllm
    environment); skips the test when the release is not installed."""
    import os
    import sys
    from pathlib import Path

    import pytest

    from schedspec.cli.vllm_version import env_python, installed_vllm

    # CI names the releases it installed itself: a cache that outlives the clone
    # (older releases installed by hand) must not change what a CI run checks.
    chosen = os.environ.get("SCHEDSPEC_TEST_RELEASES")
    if chosen is not None and release not in chosen.split(","):
        pytest.skip(f"vLLM {release} is not among SCHEDSPEC_TEST_RELEASES={chosen}")
    if installed_vllm() == release:
        return Path(sys.executable)
    py = env_python(release)
    if not py.exists():
        pytest.skip(f"vLLM {release} is not installed for schedspec; run `schedspec install-vllm --version {release}`")
    from schedspec.monitor.peer_environment import foreign_schedspec

    problem = foreign_schedspec(str(py))
    if problem:  # its tests would check other code than this checkout's
        pytest.skip(f"vLLM {release}: {problem}; run `schedspec install-vllm --version {release}` to point it here")
    return py
