"""Prompt token ids for prefix caching, from a scenario's prefix groups (formats.md).

Only the pattern of equal prefixes may affect scheduling, so the ids are built to
have exactly that pattern: two requests of one `prefix_group` agree on their first
min(prefix_len_a, prefix_len_b) tokens and differ at the next position; requests of
different groups, and requests without one, differ at position 0.  A block hash
chains over its whole prefix, so after the first differing position the ids may be
anything: they are a filler.

Ids: filler 7; group g's shared tokens 200 + g; request i's first own token
1000 + i (past 40 000 groups or requests, larger ids that stay distinct).  Explicit
`prompt_token_ids` are taken as given.
"""

from __future__ import annotations

from .scenario import Scenario

FILLER_TOKEN_ID = 7


def _group_token(g: int) -> int:
    return 200 + g if g < 800 else 10_000_000 + g


def _own_token(i: int) -> int:
    return 1000 + i if i < 40_000 else 20_000_000 + i


def prompt_token_ids(scenario: Scenario) -> dict[str, tuple[int, ...]]:
    groups: dict[str, int] = {}
    out: dict[str, tuple[int, ...]] = {}
    for i, r in enumerate(scenario.requests):
        explicit = getattr(r, "prompt_token_ids", None)
        if explicit is not None:
            out[r.id] = tuple(explicit)
            continue
        group = getattr(r, "prefix_group", None)
        shared = min(getattr(r, "prefix_len", 0) or 0, r.prompt_len) if group is not None else 0
        tokens = []
        if shared:
            g = groups.setdefault(group, len(groups))
            tokens = [_group_token(g)] * shared
        if shared < r.prompt_len:
            tokens.append(_own_token(i))
            tokens.extend([FILLER_TOKEN_ID] * (r.prompt_len - shared - 1))
        out[r.id] = tuple(tokens)
    return out
