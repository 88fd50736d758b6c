"""Prompt token ids for prefix caching, from a scenario's prefix groups (formats.md).

Only the pattern of equal prefixes may affect scheduling, so the ids are built to
have exactly that pattern: two requests of one `prefix_group` agree on their first
min(prefix_len_a, prefix_len_b) tokens and differ at the next position; requests of
different groups, and requests without one, differ at position 0.  A block hash
chains over its whole prefix, so after the first differing position the ids may be
anything: they are a filler.

Ids: filler 7; the groups' shared tokens 200, 201, ... in order of first
appearance; the requests' first own tokens 1000, 1001, ... in request order (past
800 groups or 40 000 requests, larger ids that stay distinct).  Explicit
`prompt_token_ids` are taken as given, and no synthetic first token is one of them
(the next free id is taken instead): a prompt made here and an explicit one differ
at position 0, whatever ids the file uses (formats.md).

The fake model's output ids are fixed here too: EOS (2) and every other output
token (100).  A file's explicit ids may be neither (reference/scenario.py refuses
them), so no prompt block can equal an output block by the ids' choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from schedspec.spec.request import EOS_TOKEN_ID

if TYPE_CHECKING:
    from .scenario import Scenario

FILLER_TOKEN_ID = 7
NON_EOS_TOKEN_ID = 100  # every output token but EOS (formats.md)
OUTPUT_TOKEN_IDS = (EOS_TOKEN_ID, NON_EOS_TOKEN_ID)


def _fresh(first: int, count: int, far: int, taken: frozenset[int]) -> Iterator[int]:
    """first, first + 1, ... (count of them), then far + count, ...: the ids not in `taken`."""
    j = 0
    while True:
        token = first + j if j < count else far + j
        if token not in taken:
            yield token
        j += 1


def prompt_token_ids(scenario: "Scenario") -> dict[str, tuple[int, ...]]:
    explicit_ids = frozenset(t for r in scenario.requests for t in (getattr(r, "prompt_token_ids", None) or ()))
    group_ids = _fresh(200, 800, 10_000_000, explicit_ids)
    own_ids = _fresh(1000, 40_000, 20_000_000, explicit_ids)
    groups: dict[str, int] = {}
    out: dict[str, tuple[int, ...]] = {}
    for r in scenario.requests:
        explicit = getattr(r, "prompt_token_ids", None)
        if explicit is not None:
            out[r.id] = tuple(explicit)
            next(own_ids)  # the same ids for the others whether or not a request is explicit
            continue
        group = getattr(r, "prefix_group", None)
        shared = min(getattr(r, "prefix_len", 0) or 0, r.prompt_len) if group is not None else 0
        tokens = []
        if shared:
            if group not in groups:
                groups[group] = next(group_ids)
            tokens = [groups[group]] * shared
        own = next(own_ids)
        if shared < r.prompt_len:
            tokens.append(own)
            tokens.extend([FILLER_TOKEN_ID] * (r.prompt_len - shared - 1))
        out[r.id] = tuple(tokens)
    return out
