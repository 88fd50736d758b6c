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
