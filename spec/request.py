"""Request state, with vLLM 0.33.0's field names (RQ = vllm/v1/request.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Sequence

from .block_pool import extend_block_hashes, hash_block
from .config import ConfigError, SchedulerConfig


class RequestStatus(enum.IntEnum):
    """vLLM's status values and their order (RQ:370-386); finished > PREEMPTED."""

    WAITING = 1
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = 2
    WAITING_FOR_REMOTE_KVS = 3
    WAITING_FOR_STREAMING_REQ = 4
    RUNNING = 5
    PREEMPTED = 6
    FINISHED_STOPPED = 7
    FINISHED_LENGTH_CAPPED = 8
    FINISHED_ABORTED = 9
    FINISHED_IGNORED = 10
    FINISHED_ERROR = 11
    FINISHED_REPETITION = 12

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED


# The finish reasons a trace reports (formats.md).
FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stopped",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "aborted",
}

# Token id the fake model samples for end-of-sequence; any other id is a normal token.
EOS_TOKEN_ID = 2


@dataclass(frozen=True)
class Request:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    # Token ids and full-block hashes matter only to the prefix cache; without
    # enable_prefix_caching they stay empty and the spec counts tokens (RQ:285-288).
    prompt_token_ids: tuple = ()
    output_token_ids: tuple = ()
    block_hashes: tuple = ()
    # Async scheduling (RQ:162-173): outputs scheduled but not yet returned, tokens
    # scheduled in batches still in flight, and the in-flight tokens a preemption
    # made stale.  All stay 0 between synchronous steps.
    num_output_placeholders: int = 0
    num_in_flight_tokens: int = 0
    num_stale_output_tokens: int = 0
    is_prefill_chunk: bool = False

    @property
    def num_tokens(self) -> int:
        """len(prompt + outputs) (RQ:295)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def priority_key(self) -> tuple[int, float]:
        """Order of the priority victim choice (S:940); lower runs first."""
        return (self.priority, self.arrival_time)

    @property
    def queue_key(self) -> tuple[int, float, str]:
        """Heap order of the priority waiting queue (RQ:357-367)."""
        return (self.priority, self.arrival_time, self.request_id)

    def evolve(self, **changes) -> "Request":
        return replace(self, **changes)

    def with_output_token(self, token_id: int, block_size: int, prefix_caching: bool) -> "Request":
        """The request after `append_output_token_ids` (RQ:272-288); token ids and
        block hashes are kept only for the prefix cache."""
        if not prefix_caching:
            return replace(self, num_output_tokens=self.num_output_tokens + 1)
        outputs = self.output_token_ids + (token_id,)
        hashes = self.block_hashes
        if (self.num_prompt_tokens + len(outputs)) % block_size == 0:
            tail = outputs[-block_size:]
            if len(tail) < block_size:
                tail = self.prompt_token_ids[len(tail) - block_size:] + tail
            hashes = hashes + (hash_block(hashes[-1] if hashes else None, tail),)
        return replace(self, num_output_tokens=self.num_output_tokens + 1,
                       output_token_ids=outputs, block_hashes=hashes)


def make_request(
    config: SchedulerConfig,
    request_id: str,
    num_prompt_tokens: int,
    max_tokens: int | None = None,
    priority: int = 0,
    arrival_time: float = 0.0,
    prompt_token_ids: Sequence[int] | None = None,
) -> Request:
    """A new WAITING request, after vLLM's front-end checks
    (v1/engine/input_processor.py:476-602).  With prefix caching the prompt's
    token ids are required: they decide which blocks it shares."""
    if num_prompt_tokens < 1:
        raise ConfigError("prompt_len", f"= {num_prompt_tokens}: the prompt is empty; use prompt_len >= 1")
    if num_prompt_tokens >= config.max_model_len:
        raise ConfigError(
            "prompt_len",
            f"= {num_prompt_tokens} must be < max_model_len ({config.max_model_len}); vLLM's front end "
            "rejects a prompt of max_model_len or more tokens for a generate model",
        )
    if max_tokens is None:
        max_tokens = config.max_model_len - num_prompt_tokens  # input_processor.py:477
    if max_tokens < 1:
        raise ConfigError("max_tokens", f"= {max_tokens}, must be >= 1")
    tokens: tuple = ()
    hashes: tuple = ()
    if config.enable_prefix_caching:
        if prompt_token_ids is None or len(prompt_token_ids) != num_prompt_tokens:
            raise ConfigError("prompt_token_ids", "prefix caching needs the prompt's "
                              f"{num_prompt_tokens} token ids")
        tokens = tuple(prompt_token_ids)
        hashes = extend_block_hashes((), tokens, config.block_size)
    return Request(
        request_id=request_id,
        num_prompt_tokens=num_prompt_tokens,
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=arrival_time,
        prompt_token_ids=tokens,
        block_hashes=hashes,
    )
