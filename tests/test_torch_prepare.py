"""The host-side preparation of a torch batch (gpu/batch.py `prepare`, gpu/hashes.py,
gpu/trace_text.py `quote`): each fast path against the general one it stands for."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest

from schedspec.gpu.batch import num_hash_blocks, prepare
from schedspec.gpu.hashes import grouped_hash_ids, hash_ids, private_hash_ids
from schedspec.gpu.trace_text import dumps, quote
from schedspec.reference.generator import generate_scenario, scenario_rng

PC = ((True, False), (True, True))


def _scenarios(n: int):
    return [generate_scenario(scenario_rng(41, i), i, PC) for i in range(n)]


def test_private_ids_are_the_grouped_numbering_without_groups():
    checked = 0
    for sc in _scenarios(300):
        sc = dataclasses.replace(sc, requests=tuple(
            dataclasses.replace(r, prefix_group=None, prefix_len=0) for r in sc.requests
            if r.prompt_token_ids is None))
        p = prepare(sc)
        if isinstance(p, str):
            continue
        nb = num_hash_blocks(p.config, p.columns["num_prompt_tokens"], p.columns["max_tokens"], sc.max_steps)
        fast, fast_n = private_hash_ids(nb)
        slow, slow_n = grouped_hash_ids(sc, p.config.block_size, nb)
        assert fast_n == slow_n
        np.testing.assert_array_equal(fast, slow)
        checked += 1
    assert checked > 100


def test_private_ids_with_empty_rows_and_no_requests():
    ids, n = private_hash_ids([2, 0, 3])
    np.testing.assert_array_equal(ids, [[0, 1, -1], [-1, -1, -1], [2, 3, 4]])
    assert n == 5
    ids, n = private_hash_ids([])
    assert ids.shape == (0, 1) and n == 0


def test_grouped_scenarios_still_share_their_prefix_ids():
    # The dispatch must not send a scenario with groups down the private path.
    grouped = [sc for sc in _scenarios(300) if any(r.prefix_group for r in sc.requests)
               and not any(r.prompt_token_ids is not None for r in sc.requests)]
    assert grouped
    shared = 0
    for sc in grouped:
        p = prepare(sc)
        if isinstance(p, str):
            continue
        nb = num_hash_blocks(p.config, p.columns["num_prompt_tokens"], p.columns["max_tokens"], sc.max_steps)
        ids, _ = hash_ids(sc, p.config.block_size, nb)
        np.testing.assert_array_equal(ids, grouped_hash_ids(sc, p.config.block_size, nb)[0])
        first = ids[:, 0][ids[:, 0] >= 0]
        shared += len(first) > len(set(first.tolist()))
    assert shared > 0


@pytest.mark.parametrize("text", ["r0", "", "req-12_a.b", 'a"b', "a\\b", "\u00e9t\u00e9", "tab\there", "\x7f",
                                  "~ {}[]"])
def test_quote_is_json_dumps(text):
    assert quote(text) == dumps(text)
    assert json.loads(quote(text)) == text


def test_quote_on_random_strings():
    rng = random.Random(5)
    for _ in range(2000):
        text = "".join(chr(rng.choice([rng.randrange(0, 128), rng.randrange(128, 0x800)]))
                       for _ in range(rng.randrange(0, 8)))
        assert quote(text) == dumps(text), repr(text)


def test_config_memo_keeps_types_and_errors_apart():
    """`prepare` with a batch's memo of configs: a config the release refuses is
    remembered as the same error.  A config of the wrong types (1 for true) never
    gets there: the scenario refuses it when it is built."""
    from schedspec.reference.scenario import ScenarioError

    base = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 128, "block_size": 16,
            "num_gpu_blocks": 64, "enable_prefix_caching": True}
    sc = next(s for s in _scenarios(50) if s.requests)
    good = dataclasses.replace(sc, config=dict(base))
    bad = dataclasses.replace(sc, config={**base, "num_gpu_blocks": 2})
    memo: dict = {}
    first = prepare(good, memo)
    assert not isinstance(first, str), first
    for _ in range(2):
        assert prepare(bad, memo) == prepare(bad)
        assert prepare(bad).startswith("config.num_gpu_blocks: = 2 leaves 1 usable blocks")
    assert not isinstance(prepare(good, memo), str)
    assert len(memo) == 2
    with pytest.raises(ScenarioError, match="^config.enable_prefix_caching: must be true or false, got 1$"):
        dataclasses.replace(sc, config={**base, "enable_prefix_caching": 1})


def test_argsort_orders_like_torch_on_distinct_keys():
    import torch

    from schedspec.gpu.index import argsort

    g = torch.Generator().manual_seed(5)
    keys = torch.randperm(64 * 40, generator=g).reshape(64, 40) - 1000
    for k, dim in ((keys, 1), (keys[:, 3], 0), (keys.t(), 1)):
        assert torch.equal(k.gather(dim, argsort(k, dim)) if k.dim() > 1 else k[argsort(k, dim)],
                           k.sort(dim).values)


def test_nonzero_is_torchs():
    import torch

    from schedspec.gpu.index import nonzero, nonzero_rc

    g = torch.Generator().manual_seed(6)
    for shape, p in (((64, 40), 0.1), ((64, 40), 0.0), ((3, 0), 0.5), ((128, 1), 0.5)):
        mask = torch.rand(shape, generator=g) < p
        assert torch.equal(nonzero(mask), mask.reshape(-1).nonzero()[:, 0])
        for got, want in zip(nonzero_rc(mask), mask.nonzero(as_tuple=True)):
            assert torch.equal(got, want) and got.dtype == want.dtype
    mask = torch.rand((64, 40), generator=g) < 0.5
    assert torch.equal(nonzero(mask[:, 5:9]), mask[:, 5:9].reshape(-1).nonzero()[:, 0])  # a non-contiguous view


def test_request_ranks_by_their_definition():
    """The heap order of (priority, arrival_time, request_id) and the dense rank
    of (priority, arrival_time), from one sort, against the definition."""
    from schedspec.gpu.batch import FrontRequest, request_ranks

    rng = random.Random(8)
    for _ in range(500):
        reqs = [FrontRequest(f"r{rng.randint(0, 30)}", 1, 1, rng.randint(-2, 2), rng.choice([0.0, 1.0, 2.5, -0.0]))
                for _ in range(rng.randint(0, 12))]
        queue_rank, victim_rank = request_ranks(reqs)
        heap = sorted(range(len(reqs)), key=lambda i: (reqs[i].priority, reqs[i].arrival_time, reqs[i].request_id))
        assert [heap.index(i) for i in range(len(reqs))] == queue_rank
        keys = sorted({(r.priority, r.arrival_time) for r in reqs})
        assert [keys.index((r.priority, r.arrival_time)) for r in reqs] == victim_rank


def test_argsort_members_puts_members_first_in_key_order():
    import torch

    from schedspec.gpu.index import argsort_members

    g = torch.Generator().manual_seed(7)
    keys = torch.randperm(64 * 40, generator=g).reshape(64, 40) - 1000
    member = torch.rand((64, 40), generator=g) < 0.6
    order = argsort_members(keys, member, 2**62)
    count = member.sum(1)
    for s in range(64):
        got = order[s, : count[s]]
        assert member[s, got].all()
        assert torch.equal(keys[s, got], keys[s][member[s]].sort().values)
