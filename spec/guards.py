"""The scheduler step's guards and the rules both loops share: pure functions of the
step's working state (scheduler.py `ScheduleWork`) that change nothing; scheduler.py makes
every effect, after the guards that decide it.  S = vllm/v1/core/sched/scheduler.py,
K = vllm/v1/core/kv_cache_manager.py (docs/rules.md)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from . import kv_connector, lora, spec_decode, stale_output, structured_output
from .request import Request

if TYPE_CHECKING:  # the working state of scheduler.py, which imports this module
    from .scheduler import ScheduleWork


class Admission(Enum):
    """What the waiting loop does with the request at its head (S:1066-1687)."""

    ADMITTED = "admitted"  # it runs from this step
    LOAD_STARTED = "load started"  # its asynchronous KV load began: it waits, out of this step's loop
    SKIPPED = "skipped"  # it keeps its place, and the loop goes on behind it (S:1675-1681)
    STOPPED = "stopped"  # admission ends for this step: it never preempts


class PrefixHit(NamedTuple):
    """Where an admission starts: the local hit's blocks, the connector's tokens beyond
    them, and the tokens computed with both; `looked_up`: from zero computed tokens."""

    blocks: list[int]
    external: int
    num_computed_tokens: int
    looked_up: bool


def has_budget(s: ScheduleWork) -> bool:
    """Both loops' budget guard: tokens left, and input rows beyond a drafter's (S:811-813, 1094-1113)."""
    return s.token_budget > 0 and s.input_budget > s.draft_slots


def chunk_budget(s: ScheduleWork) -> int:
    """The most tokens one request gets, in both loops (S:862-864, 1345)."""
    return min(s.token_budget, s.input_budget - s.draft_slots)


def cap_long_prefill(s: ScheduleWork, n: int) -> int:
    """The long-prefill threshold's cap on a chunk, in both loops (S:860, 1382)."""
    return s.threshold if 0 < s.threshold < n else n


def skips_head(s: ScheduleWork, rid: str, loras: set[int]) -> bool:
    """Guard: the head is skipped, keeping its place: its KV load in flight (S:1117-1121),
    a grammar compiling or failed [seam: streaming input]; async: output from before its
    preemption in flight, which resuming could resample (S:1123); LoRA: one adapter too
    many (S:1128-1140); KV connector undecided, asked only from zero computed tokens (S:1149, 1185)."""
    r = s.requests[rid]
    return (kv_connector.load_in_flight(r) or structured_output.waits_for_grammar(s, rid) or stale_output.pending(r)
            or lora.exceeds_max_loras(s.config, loras, r) or (r.num_computed_tokens == 0 and kv_connector.undecided(r)))


def prefix_hit(s: ScheduleWork, r: Request) -> PrefixHit:
    """The prefix an admission starts from, looked up from zero computed tokens (S:1149-1166;
    a KV holder's are loaded, S:1301-1311), not for a request that reads no cached prefix
    (K:251-253); the KV connector's tokens beyond it (S:1169-1257)."""
    c = s.config
    lookup = r.num_computed_tokens == 0
    hits = spec_decode.eagle_block_drop(c, s.kv.get_computed_blocks(r.block_hashes, r.num_tokens, c.block_size)) \
        if lookup and not r.skip_reading_prefix_cache else []
    external = kv_connector.external_tokens(r, len(hits) * c.block_size) if lookup else 0
    return PrefixHit(hits, external, r.num_computed_tokens + len(hits) * c.block_size + external, lookup)


def wanted_tokens_waiting(s: ScheduleWork, r: Request, num_computed_tokens: int) -> int:
    """What an admission asks before its budget: the tokens left, num_tokens, not
    num_prompt_tokens, as a resumed request replays its outputs (S:1356), or a padded new
    decode's 1 + num_speculative_tokens (S:1358-1380); under the long-prefill cap (S:1382)."""
    n = r.num_tokens - num_computed_tokens
    if spec_decode.pads_new_decode(s, r, num_computed_tokens):
        n = 1 + s.config.num_speculative_tokens
    return cap_long_prefill(s, n)


def stops_admission(s: ScheduleWork, r: Request, num_computed_tokens: int) -> bool:
    """Guard: admission stops rather than cut the request: a padded new decode over the
    budget, rather nothing than an unpadded decode (S:1376-1378), or, with chunked prefill
    off, a request that does not fit whole (S:1387-1394)."""
    budget = chunk_budget(s)  # S:1345
    if spec_decode.pads_new_decode(s, r, num_computed_tokens) and 1 + s.config.num_speculative_tokens > budget:
        return True
    n = wanted_tokens_waiting(s, r, num_computed_tokens)
    return not s.config.enable_chunked_prefill and n > budget
