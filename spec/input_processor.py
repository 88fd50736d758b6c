"""vLLM's front end as far as the scheduler sees it: a request is checked and
built before `add_request` (IP = v1/engine/input_processor.py)."""

from __future__ import annotations

from typing import Sequence

from .kv_cache_utils import extend_block_hashes
from .config import ConfigError, SchedulerConfig
from .encoder_cache import MultiModalFeature
from .request import Request, RequestStatus
from .structured_output import COMPILING
from .versions import ENCODER_INPUTS, KV_CONNECTOR, STRUCTURED_OUTPUT, models, not_modelled


def make_request(
    config: SchedulerConfig,
    request_id: str,
    num_prompt_tokens: int,
    max_tokens: int | None = None,
    priority: int = 0,
    arrival_time: float = 0.0,
    prompt_token_ids: Sequence[int] | None = None,
    lora_int_id: int = 0,
    structured_output: bool = False,
    kv_connector_tokens: int = 0, kv_connector_async: bool = False, kv_connector_sends: bool = False,
    mm_features: Sequence[MultiModalFeature] = (),
) -> Request:
    """A new WAITING request, after vLLM's front-end checks
    (v1/engine/input_processor.py:476-602).  With prefix caching the prompt's
    token ids are required: they decide which blocks it shares."""
    max_tokens = checked_lengths(config, num_prompt_tokens, max_tokens)
    if lora_int_id and config.max_loras is None:
        # vLLM's front end refuses an adapter when LoRA is not enabled (input_processor.py).
        raise ConfigError("lora_int_id", f"= {lora_int_id}, but LoRA is off; set config.max_loras")
    for field, used, feature in (("grammar_compile_steps", structured_output, STRUCTURED_OUTPUT),
                                 ("kv_connector_tokens", kv_connector_tokens, KV_CONNECTOR),
                                 ("kv_connector_send_steps", kv_connector_sends, KV_CONNECTOR),
                                 ("mm_features", mm_features, ENCODER_INPUTS)):
        if used and not models(config, feature):
            raise ConfigError(field, not_modelled(config, feature))
    if kv_connector_tokens >= num_prompt_tokens:  # vLLM asserts a token is left to compute (S:1258, 1397)
        raise ConfigError("kv_connector_tokens", f"= {kv_connector_tokens}, must be < prompt_len "
                          f"({num_prompt_tokens}): the last prompt token is always computed")
    mm_features = check_mm_features(config, num_prompt_tokens, mm_features)
    tokens, hashes = prompt_hashes(config, num_prompt_tokens, prompt_token_ids, lora_int_id, mm_features)
    return Request(
        request_id=request_id, num_prompt_tokens=num_prompt_tokens, max_tokens=max_tokens,
        priority=priority, arrival_time=arrival_time, prompt_token_ids=tokens, block_hashes=hashes,
        partial_block_token_ids=tokens[len(hashes) * config.block_size:],
        num_hash_lookahead_tokens=config.num_hash_lookahead_tokens, lora_int_id=lora_int_id,
        # A grammar to compile first: the request waits for it (RQ:120-121).
        status=RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR if structured_output else RequestStatus.WAITING,
        grammar=COMPILING if structured_output else "",
        kv_connector_tokens=kv_connector_tokens, kv_connector_async=kv_connector_async,
        kv_connector_sends=kv_connector_sends, mm_features=mm_features,
    )


def checked_lengths(config: SchedulerConfig, num_prompt_tokens: int, max_tokens: int | None) -> int:
    """The front end's length checks (input_processor.py:476-480, 566-602): a prompt of at
    least one token and fewer than max_model_len; returns max_tokens, whose
    default is what max_model_len leaves after the prompt."""
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
    return max_tokens


MAX_MM_FEATURES = 8


def prompt_hashes(config: SchedulerConfig, num_prompt_tokens: int, prompt_token_ids: Sequence[int] | None,
                  lora_int_id: int, mm_features: tuple) -> tuple[tuple, tuple]:
    """The prompt's token ids and block hashes, kept only for prefix caching, which
    needs them: they decide which blocks it shares."""
    if not config.enable_prefix_caching:
        return (), ()
    if prompt_token_ids is None or len(prompt_token_ids) != num_prompt_tokens:
        raise ConfigError("prompt_token_ids", f"prefix caching needs the prompt's {num_prompt_tokens} token ids")
    tokens = tuple(prompt_token_ids)
    # The engine's hasher covers num_hash_lookahead_tokens after each block (E:242-252).
    return tokens, extend_block_hashes((), tokens, config.block_size, lora_int_id, config.num_hash_lookahead_tokens,
                                       mm_features)


def check_mm_features(config: SchedulerConfig, num_prompt_tokens: int, mm_features: Sequence) -> tuple:
    """Encoder inputs as vLLM's input processor hands them on: in the prompt, by offset,
    apart (multimodal/utils.py:122-131 assumes it); and each within one step's encoder
    budget and the cache, which vLLM's MultiModalBudget sizes to the largest item
    (multimodal/encoder_budget.py), so that every item can be encoded."""
    mm_features = tuple(MultiModalFeature(*f) for f in mm_features)
    if len(mm_features) > MAX_MM_FEATURES:
        # vLLM frees a request's cached inputs walking a set of their ids (ECM:255-257, 300-310;
        # S:2961-2973): in ascending order only while every id is below a set's smallest
        # table (8); the spec frees in that order, exact up to 8 items.
        raise ConfigError("mm_features", f"{len(mm_features)} items; schedspec models at most {MAX_MM_FEATURES} "
                          "per request")
    end = 0
    for k, f in enumerate(mm_features):
        where = f"mm_features[{k}]"
        if not (isinstance(f.identifier, str) and f.identifier):
            raise ConfigError(f"{where}.identifier", "must be a non-empty string")
        if f.length < 1 or f.offset < end or f.offset + f.length > num_prompt_tokens:
            raise ConfigError(where, f"= [{f.offset}, {f.offset + f.length}): an item must have length >= 1, lie "
                              f"in the prompt [0, {num_prompt_tokens}) and start at or after the previous one's end {end}")
        if f.length > min(config.encoder_compute_budget, config.encoder_cache_capacity):
            raise ConfigError(f"{where}.length", f"= {f.length} > max_num_encoder_input_tokens "
                              f"({config.encoder_compute_budget}) or encoder_cache_size ({config.encoder_cache_capacity}): "
                              "the item could never be encoded; raise them")
        end = f.offset + f.length
    if mm_features and config.num_hash_lookahead_tokens:
        raise ConfigError("mm_features", "schedspec does not model encoder inputs with num_hash_lookahead_tokens "
                          "(vLLM's lookahead block hashes key items differently, kv_cache_utils.py:1003-1013)")
    return mm_features
