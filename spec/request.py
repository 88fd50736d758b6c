"""Request state, with vLLM's field names (RQ = vllm/v1/request.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from .kv_cache_utils import hash_block, lora_root, mm_block_keys


class RequestStatus(enum.IntEnum):
    """vLLM's status values and their order (RQ:422-438); finished > PREEMPTED."""

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


# Looked up once: an Enum class-attribute lookup costs ~0.3 us per request per step.
WAITING, RUNNING, PREEMPTED = RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.PREEMPTED


# Token id the fake model samples for end-of-sequence; any other id is a normal token.
EOS_TOKEN_ID = 2


@dataclass(eq=True)
class Request:
    """A value: a Request reachable from a state is never changed.  A call that
    changes one works on its own `copy()` (state.py `Working.request`): one dict
    copy per call, where dataclasses.replace per change cost 80 % of a step."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival_time: float = 0.0
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_preemptions: int = 0
    # Only the prefix cache needs token ids and block hashes; else empty (RQ:300-303).
    prompt_token_ids: tuple = ()
    block_hashes: tuple = ()
    # The ids after the last hashed block, all that hashing the next one needs: vLLM
    # keeps every output id, which would cost a copy of them per token here.
    partial_block_token_ids: tuple = ()
    # Tokens after each block its hash covers (its hasher's, KU:970-1012), hashed once they exist.
    num_hash_lookahead_tokens: int = 0
    # Async (RQ:169-180): outputs scheduled, not yet returned; tokens in batches in
    # flight; in-flight tokens a preemption made stale.  0 between synchronous steps.
    num_output_placeholders: int = 0
    num_in_flight_tokens: int = 0
    num_stale_output_tokens: int = 0
    drop_stale_output: bool = False  # async: stale output discarded on return (RQ:175, stale_output.py)
    is_prefill_chunk: bool = False
    # No prefix hit (K:251-253): prompt logprobs need every prompt position (RQ:359-371).
    skip_reading_prefix_cache: bool = False
    # Speculative decoding: the drafts to verify next step (RQ:`spec_token_ids`); under
    # async scheduling -1 placeholders for drafts the worker fills in.
    spec_token_ids: tuple = ()
    # LoRA: the adapter's id, 0 for none (lora.py).
    lora_int_id: int = 0
    grammar: str = ""  # structured output: "" none, else "compiling", "compiled" or "failed"
    kv_connector_tokens: int | None = 0  # prefix a remote store holds; None: cannot tell yet (kv_connector.py)
    # It loads that prefix asynchronously; the worker reported such a load finished (S:3718-3721).
    kv_connector_async: bool = False
    kv_load_finished: bool = False
    mm_features: tuple = ()  # its encoder inputs (encoder_cache.py MultiModalFeature), by offset
    kv_connector_sends: bool = False  # its KV is sent when it finishes, its blocks kept till then (S:3180-3200)
    # Stop tokens (U:101-112): the EOS id (None: none, as with ignore_eos) and the others.
    eos_token_id: int | None = EOS_TOKEN_ID
    stop_token_ids: tuple = ()

    @property
    def num_tokens(self) -> int:
        """len(prompt + outputs) (RQ:333)."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_with_spec(self) -> int:
        """num_tokens + its drafts: what the scheduler tries to compute (RQ:337-339)."""
        return self.num_prompt_tokens + self.num_output_tokens + len(self.spec_token_ids)

    @property
    def priority_key(self) -> tuple[int, float]:
        """Order of the priority victim choice (S:948-952); lower runs first."""
        return (self.priority, self.arrival_time)

    @property
    def queue_key(self) -> tuple[int, float, str]:
        """Heap order of the priority waiting queue (RQ:409-419)."""
        return (self.priority, self.arrival_time, self.request_id)

    def copy(self) -> "Request":
        new = object.__new__(Request)
        new.__dict__.update(self.__dict__)
        return new

    def evolve(self, **changes) -> "Request":
        """A copy with `changes`; unknown field names are an error."""
        unknown = set(changes) - _FIELDS
        if unknown:
            raise TypeError(f"Request has no field {sorted(unknown)[0]!r}")
        new = self.copy()
        new.__dict__.update(changes)
        return new

    def append_output_token(self, token_id: int, block_size: int, prefix_caching: bool) -> None:
        """`append_output_token_ids` (RQ:287-303), on a working copy: token ids and
        block hashes are kept only for the prefix cache."""
        self.num_output_tokens += 1
        if not prefix_caching:
            return
        partial = self.partial_block_token_ids = self.partial_block_token_ids + (token_id,)
        if len(partial) == block_size + self.num_hash_lookahead_tokens:
            parent = self.block_hashes[-1] if self.block_hashes else lora_root(self.lora_int_id)
            keys = mm_block_keys(self.mm_features, len(self.block_hashes) * block_size, block_size) \
                if self.mm_features else ()  # an item at the prompt's end shares a block with outputs
            self.block_hashes += (hash_block(parent, partial, keys),)
            self.partial_block_token_ids = partial[block_size:]


_FIELDS = frozenset(f.name for f in fields(Request))


def last_token_in_flight(r: Request) -> bool:
    """Async: the last token `max_tokens` allows is already scheduled in a batch in
    flight, so the request needs nothing more this step (S:816-830).  One output
    placeholder stands for one token to come; the +2 counts the token being
    sampled and the one after it."""
    return (r.num_output_placeholders > 0
            and r.num_computed_tokens + 2 - r.num_output_placeholders >= r.num_prompt_tokens + r.max_tokens)
