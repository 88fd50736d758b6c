"""Seeded random scenarios and configs for differential testing.

`generate_scenario(rng, index)` draws one valid scenario (formats.md) from the
whole core scope of schedspec/1:

- block sizes 1..16; KV pools from the smallest one vLLM's start-up check
  admits (`num_gpu_blocks - 1 == ceil(max_model_len / block_size)`), which
  forces preemption and self-preemption, to generous ones;
- both policies, mixed (also negative) priorities, `arrival_time` ties (the
  priority queue then orders by request id, where "r10" < "r2");
- chunked prefill on and off, `long_prefill_token_threshold`, watermarks,
  `scheduler_reserve_full_isl` on and off, `max_num_scheduled_tokens` below
  (and sometimes above) `max_num_batched_tokens`, `max_num_active_seqs`;
- arrivals spread over steps; aborts at random steps after arrival, so they
  hit waiting, running, preempted and already-finished requests;
- one scenario in five, drawn after the rest: the priority policy under a
  token budget of a few tokens and a tight pool, later arrivals of higher
  priority, so a victim already granted in the step is refunded and the
  budget then binds for the requests after it;
- EOS finishes (`output_len`), max_tokens finishes, and max_model_len
  finishes (max_tokens above `max_model_len - prompt_len`, prompts near
  `max_model_len`).

With `flags=FLAGS_ALL` (what `schedspec diff` draws unless torch takes part),
vLLM's two engine flags, drawn after everything above so that the scenario
without them is exactly the one `flags=FLAGS_OFF` gives:

- `enable_prefix_caching` and `async_scheduling`, each of the four
  combinations with probability 1/4;
- prefix groups (formats.md "Additions"): shared system prompts (several
  requests of a group with one `prefix_len` and their own suffixes), exact
  duplicates (`prefix_len == prompt_len`, same length), prompts that are a
  prefix of the group's prompt, with shared lengths block-aligned and not
  (less often also without prefix caching, where groups must not matter);
  block sizes drawn smaller so that prompts span several blocks;
- pools at or a few blocks above the start-up minimum, so that freed cached
  blocks are evicted and running requests preempted;
- under async scheduling, extra aborts one to three steps after arrival,
  while the request's batches are in flight.

`release` (default the newest modelled release) is the vLLM release the scenario is for: the
config fields that release lacks (spec/versions.py `FIELDS_SINCE`) are left
out, after every draw, so the scenario of an index differs between releases
only by those fields and older releases run what they can instead of refusing
a quarter of the campaign.

With `features={"spec_decode"}` (what a campaign draws when both its
implementations model speculative decoding, `features_for`), drawn after the
flags and only from 0.33.0 on (versions.FEATURES_SINCE): one scenario in three gets `num_speculative_tokens`
1..4 (sometimes up to 8), sometimes a lookahead, per-request draft and
acceptance patterns, and more one-token prompts, which an admission next to a
running decode pads to 1 + num_speculative_tokens rows.  Such a scenario keeps
`long_prefill_token_threshold` at 0 or above num_speculative_tokens: below, a
padded admission crashes vLLM 0.33.0 (docs/rules.md, speculative decoding).

With "lora" in `features`, after speculative decoding and only from 0.33.0 on (versions.FEATURES_SINCE), one
scenario in four gets `max_loras` 1..3 and up to two adapters more than that among
its requests.

With "structured_output" in `features`, after LoRA and only from 0.33.0 on (versions.FEATURES_SINCE), one
scenario in four gives half its requests a grammar that compiles after 0..8 steps
(sometimes up to 60), and one grammar in eight fails.

With "prefill_throttle" in `features`, after structured output and only from 0.33.0 on (versions.FEATURES_SINCE),
one scenario in four gets `prefill_schedule_interval` 2..8: prefill held on the
steps between, while something decodes (spec/prefill_throttle.py).

With "adaptive_threshold" in `features`, after throttling and only from 0.33.0 on (versions.FEATURES_SINCE), one
scenario in two that has a `long_prefill_token_threshold` gets
`long_prefill_token_threshold_adaptive`.

With "kv_connector" in `features`, after adaptive thresholds and only from 0.33.0 on (versions.FEATURES_SINCE), one scenario in four gives
about half its requests `kv_connector_tokens`: a remote store holding a block-aligned,
mid-block or whole-prompt-but-one prefix, loaded beyond the local hit at admission
(spec/kv_connector.py), which a shared prefix may already cover.  In half of those
scenarios, about 60 % of the held prefixes load asynchronously
(`kv_connector_load_steps` 1 to 6), aborted as any other (one aborted mid-load keeps
its blocks until the load ends).  In one in three, about 40 % of the requests have
their KV sent once they finish (`kv_connector_send_steps` 1 to 6: their blocks held
until the send is reported).  One
scenario in three has a connector requiring KV delivery (`requires_kv_delivery`:
preemptions drop output in flight).

With "encoder_inputs" in `features`, last and only from 0.33.0 on (versions.FEATURES_SINCE) without lookahead block
hashes, one scenario in three gets encoder inputs: about 60 % of its requests one to
three multimodal items from a pool of six identifiers (members of a prefix group mostly
the group's), a small encoder budget and cache, and one in four
`disable_chunked_mm_input`; drawn from a generator of its own, so a seed's scenarios
are those drawn before, with items added.

With "hash_lookahead" in `features`, after the parallel drafter and only from 0.33.0 on (versions.FEATURES_SINCE),
one scenario in four with prefix caching gets `num_hash_lookahead_tokens` 1..3: a
block is hashed, so cached and found, only once that many tokens follow it.  With
"eagle", one scenario in two with speculative decoding has an EAGLE-family drafter:
`num_prefill_lookahead_tokens` 1 (EAGLE-3) or `num_speculative_tokens` (multi-module
MTP, at most the block size with prefix caching); with prefix caching and no
lookahead hashes, two in three of those get `use_eagle_block_drop`.

With "cache_aware" in `features`, last, for 0.34.0 and later, FCFS with prefix caching:
one scenario in three gets `cache_aware_admission_window` 2..64 and a usage threshold
(0.0 in two draws of five, so it reorders on every step); drawn from a generator of its
own, as encoder inputs are.

`FLAGS_OFF` (the default) draws no flag and nothing more from `rng`: the proofs
model neither flag, and the scenario streams pinned by their tests stay as they
were.  A campaign draws the combinations both its implementations model
(`flags_for`; torch: prefix caching on and off, synchronous).

Excluded: in `generate_config_dict` only, `max_model_len = -1`, vLLM's
model-dependent "auto-fit" sentinel (formats.md fixes max_model_len's default
instead).

`generate_config_dict(rng, valid_bias)` draws raw `config` objects near the
acceptance boundaries, valid or invalid, for the config-agreement check.

Every draw depends only on the `random.Random` passed in; `scenario_rng(seed,
index)` gives the generator of campaign scenario `index` of seed `seed`, so one
scenario can be rebuilt without the ones before it.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from .loader import impl_class
from schedspec.spec.versions import (ADAPTIVE_THRESHOLD, DEFAULT_RELEASE, ENCODER_INPUTS, HASH_LOOKAHEAD, KV_CONNECTOR, LORA,
                                     PREFILL_THROTTLE, SPEC_DECODE, STRUCTURED_OUTPUT, checks, fields_lacking, models)

from .scenario import Abort, RequestSpec, Scenario


def scenario_rng(seed: int, index: int) -> random.Random:
    """The generator of scenario `index` of a campaign with `seed`."""
    return random.Random(f"schedspec-scenario/{seed}/{index}")


def config_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"schedspec-config/{seed}/{index}")


def _max_model_len(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.3:
        return rng.randint(2, 24)
    if r < 0.85:
        return rng.randint(24, 128)
    if r < 0.97:
        return rng.randint(128, 400)
    return rng.randint(400, 2048)


def _valid_config(rng: random.Random) -> dict[str, Any]:
    """A config vLLM accepts (every modelled release), with every core knob drawn."""
    L = _max_model_len(rng)
    bs = rng.randint(1, 16)
    per_seq = math.ceil(L / bs)
    min_blocks = per_seq + 1  # the start-up check, with vLLM's null block
    r = rng.random()
    if r < 0.45:  # tight: preemption, self-preemption
        nb = min_blocks + rng.randint(0, max(1, per_seq // 2))
    elif r < 0.8:
        nb = min_blocks + rng.randint(0, 3 * per_seq)
    else:
        nb = min_blocks + rng.randint(0, 20 * per_seq + 20)
    seqs = rng.choice([1, 2, 3, 4, 6, 8, 16, rng.randint(1, 32)])
    chunked = rng.random() < 0.75
    if chunked:
        B = rng.randint(seqs, max(seqs, rng.choice([4, 8, 32, L, 2 * L])))
    else:  # vLLM requires max_num_batched_tokens >= max_model_len then
        lo = max(L, seqs)
        B = rng.randint(lo, lo + rng.choice([0, 8, L]))
    config: dict[str, Any] = {
        "max_num_batched_tokens": B,
        "max_num_seqs": seqs,
        "max_model_len": L,
        "block_size": bs,
        "num_gpu_blocks": nb,
    }
    if not chunked or rng.random() < 0.3:
        config["enable_chunked_prefill"] = chunked
    config["policy"] = rng.choice(["fcfs", "priority"])
    r = rng.random()
    if r < 0.35:
        config["max_num_scheduled_tokens"] = rng.randint(1, B)
    elif r < 0.45:
        config["max_num_scheduled_tokens"] = rng.randint(B, 2 * B)
    if rng.random() < 0.3:
        config["max_num_active_seqs"] = rng.randint(1, seqs)
    if rng.random() < 0.35:
        config["long_prefill_token_threshold"] = rng.choice(
            [rng.randint(1, min(L, 8)), rng.randint(1, L)])
    if rng.random() < 0.3:
        config["watermark"] = rng.choice([0.01, 0.05, 0.1, 0.2, round(rng.uniform(0.0, 0.5), 3)])
    r = rng.random()
    if r < 0.3:
        config["scheduler_reserve_full_isl"] = False
    elif r < 0.45:
        config["scheduler_reserve_full_isl"] = True
    if rng.random() < 0.1:
        config["enable_prefix_caching"] = False
    return config


# (enable_prefix_caching, async_scheduling)
FlagCombination = tuple[bool, bool]
FLAG_COMBINATIONS: tuple[FlagCombination, ...] = ((False, False), (True, False), (False, True), (True, True))
FLAGS_OFF: tuple[FlagCombination, ...] = ((False, False),)
FLAGS_ALL = FLAG_COMBINATIONS
# The combinations an implementation models, where it is not all of them (every
# implementation here models all four now; a plug-in could model fewer).  A
# campaign draws the combinations every implementation in it models.
IMPL_FLAGS: dict[str, tuple[FlagCombination, ...]] = {"torch": FLAG_COMBINATIONS}


# Names of the combinations on the command line (`schedspec diff --flags`) and in coverage.
FLAG_NAMES: dict[str, FlagCombination] = {"sync": (False, False), "sync+prefix": (True, False),
                                          "async": (False, True), "async+prefix": (True, True)}


def flags_for(*impl_names: str) -> tuple[FlagCombination, ...]:
    """The flag combinations a campaign between these implementations draws: those
    every one of them models, in FLAG_COMBINATIONS order."""
    return tuple(f for f in FLAG_COMBINATIONS if all(f in IMPL_FLAGS.get(n, FLAGS_ALL) for n in impl_names))


def unmodelled_flags(flags, *impl_names: str) -> str | None:
    """A one-line reason when one of `impl_names` does not model a combination of
    `flags`, or None."""
    for n in impl_names:
        missing = [f for f in flags if f not in IMPL_FLAGS.get(n, FLAGS_ALL)]
        if missing:
            names = {v: k for k, v in FLAG_NAMES.items()}
            return (f"--flags: {n} does not model {names[missing[0]]}; it models "
                    + ",".join(names[f] for f in IMPL_FLAGS[n]))
    return None


def parse_flags(text: str) -> tuple[FlagCombination, ...]:
    """`all`, or a comma-separated list of FLAG_NAMES (`sync,async+prefix`)."""
    names = [t.strip() for t in text.split(",")]
    if names == ["all"]:
        return FLAGS_ALL
    bad = [n for n in names if n not in FLAG_NAMES]
    if bad:
        raise ValueError(f"unknown flag combination {bad[0][:40]!r}; use all or a comma-separated list of "
                         + ", ".join(FLAG_NAMES))
    # In FLAG_COMBINATIONS order whatever the list's: the draw depends on the order.
    chosen = {FLAG_NAMES[n] for n in names}
    return tuple(f for f in FLAG_COMBINATIONS if f in chosen)


# Scheduler features beyond the two flags.  An implementation that lacks some
# declares them itself (`unmodelled_features`, reference/impl.py; torch's come
# from its table of refusals, gpu/limits.py UNMODELLED).
FEATURES = frozenset({"spec_decode", "lora", "structured_output", "prefill_throttle", "adaptive_threshold",
                      "kv_connector", "hash_lookahead", "eagle", "encoder_inputs", "cache_aware"})
# The spec feature (versions.FEATURES_SINCE) a drawn feature needs; the others are
# drawn where the release has their config fields.
FEATURE_NEEDS = {"spec_decode": SPEC_DECODE, "eagle": SPEC_DECODE, "lora": LORA, "structured_output": STRUCTURED_OUTPUT,
                 "prefill_throttle": PREFILL_THROTTLE, "adaptive_threshold": ADAPTIVE_THRESHOLD,
                 "kv_connector": KV_CONNECTOR, "hash_lookahead": HASH_LOOKAHEAD, "encoder_inputs": ENCODER_INPUTS}


def features_in(release: str) -> frozenset[str]:
    """The features the spec models for `release`: what a search over it may draw."""
    return frozenset(f for f in FEATURES if f not in FEATURE_NEEDS or models(release, FEATURE_NEEDS[f]))


def unmodelled_features(impl_name: str) -> frozenset[str]:
    """The features an implementation declares it does not model: its class's
    `unmodelled_features` (reference/impl.py); none where it declares none, or
    where the class cannot be imported (loading it says why)."""
    return frozenset(getattr(impl_class(impl_name), "unmodelled_features", ()))


def features_for(*impl_names: str) -> frozenset[str]:
    """The features every one of `impl_names` models."""
    return FEATURES.difference(*(unmodelled_features(n) for n in impl_names))


def generate_scenario(rng: random.Random, index: int,
                      flags: Sequence[FlagCombination] = FLAGS_OFF, release: str = DEFAULT_RELEASE,
                      features: frozenset[str] = frozenset()) -> Scenario:
    """One random scenario valid in vLLM `release`; `index` only names it.
    `flags`: the (enable_prefix_caching, async_scheduling) combinations to draw
    from, equally likely; with FLAGS_OFF nothing is drawn after the flag-free
    scenario."""
    flags = tuple(flags)
    if not flags or any(f not in FLAG_COMBINATIONS for f in flags):
        raise ValueError(f"flags: {flags!r} must be a non-empty sequence of (bool, bool) pairs")
    # The draws below come in a fixed order: every helper draws from `rng` in turn,
    # so a seed gives the same scenario as it always has.
    config = _valid_config(rng)
    requests, arrivals = _requests(rng, config)
    aborts = _aborts(rng, arrivals)
    max_steps = rng.choice([150, 300, 600])
    if rng.random() < 0.2:
        config, requests, aborts = _budget_bound_priority(rng, config, requests, aborts)
    if flags != FLAGS_OFF:
        prefix_caching, async_scheduling = flags[0] if len(flags) == 1 else rng.choice(flags)
        config, requests, aborts = _engine_flags(rng, config, requests, aborts, prefix_caching,
                                                 async_scheduling)
    config, requests = _features(rng, config, requests, release, features)
    # Dropped, not drawn differently: the rest of the scenario is the same for every release.
    config = {k: v for k, v in config.items() if k not in fields_lacking(release)}

    return Scenario(
        name=f"random-{index}",
        description="",
        config={**config, "vllm_version": release},
        requests=tuple(requests),
        aborts=tuple(aborts),
        max_steps=max_steps,
    )


def _requests(rng: random.Random, config: dict[str, Any]) -> tuple[list[RequestSpec], list[int]]:
    """The requests of a scenario under `config`, and their arrival steps."""
    L = config["max_model_len"]
    priority_policy = config["policy"] == "priority"
    r = rng.random()
    n = rng.randint(1, 6) if r < 0.35 else rng.randint(2, 16) if r < 0.95 else rng.randint(16, 40)
    horizon = rng.choice([0, 2, 5, 12, 30])
    arrivals = sorted(rng.randint(0, horizon) for _ in range(n))
    ties = rng.random() < 0.4
    requests = []
    for i in range(n):
        r = rng.random()
        if r < 0.25:
            p = rng.randint(1, min(4, L - 1))
        elif r < 0.7:
            p = rng.randint(1, L - 1)
        else:  # near max_model_len
            p = rng.randint(max(1, L - 1 - max(1, L // 8)), L - 1)
        r = rng.random()
        if r < 0.2:
            max_tokens = None  # max_model_len - prompt_len
        elif r < 0.5:
            max_tokens = rng.randint(1, 4)
        else:
            max_tokens = rng.randint(1, L + 8)  # may pass max_model_len
        output_len = None
        if rng.random() < 0.5:
            output_len = rng.randint(1, (max_tokens or (L - p)) + 1)
        priority = 0
        if priority_policy or rng.random() < 0.15:
            priority = rng.randint(-1, 3)
        arrival_time = float(rng.randint(0, max(0, i // 2))) if ties and rng.random() < 0.6 else float(i)
        requests.append(RequestSpec(
            id=f"r{i}", prompt_len=p, arrival_step=arrivals[i], max_tokens=max_tokens,
            output_len=output_len, priority=priority, arrival_time=arrival_time))
    return requests, arrivals


def _aborts(rng: random.Random, arrivals: list[int]) -> list[Abort]:
    """Aborts of some of the requests arriving at `arrivals`, in step order."""
    n = len(arrivals)
    aborts = []
    if rng.random() < 0.7:
        victims = rng.sample(range(n), rng.randint(1, n))
        for i in victims:
            delay = rng.randint(1, rng.choice([2, 5, 10, 40, 120]))
            aborts.append(Abort(f"r{i}", arrivals[i] + delay))
        aborts.sort(key=lambda a: a.step)
    return aborts


def _features(rng: random.Random, config: dict[str, Any], requests: list[RequestSpec], release: str,
              features: frozenset[str]) -> tuple[dict[str, Any], list[RequestSpec]]:
    """The scheduler features of `features` that `release` models, each in some scenarios."""
    if "spec_decode" in features and models(release, SPEC_DECODE) and rng.random() < 1 / 3:
        config, requests = _spec_decode(rng, config, requests)
    if "lora" in features and models(release, LORA) and rng.random() < 1 / 4:
        config, requests = _lora(rng, config, requests)
    if "structured_output" in features and models(release, STRUCTURED_OUTPUT) and rng.random() < 1 / 4:
        requests = _structured_output(rng, requests)
    if "prefill_throttle" in features and models(release, PREFILL_THROTTLE) and rng.random() < 1 / 4:
        config = {**config, "prefill_schedule_interval": rng.choice([2, 2, 3, 4, 8])}
    if "adaptive_threshold" in features and models(release, ADAPTIVE_THRESHOLD) and config.get("long_prefill_token_threshold") \
            and rng.random() < 1 / 2:
        config = {**config, "long_prefill_token_threshold_adaptive": True}
    if "kv_connector" in features and models(release, KV_CONNECTOR) and rng.random() < 1 / 4:
        requests = _kv_connector(rng, config.get("block_size", 16), requests)
        if rng.random() < 1 / 3:  # a connector handing KV on (a producer): preemptions drop output in flight
            config = {**config, "requires_kv_delivery": True}
    config = _drafters(rng, config, release, features)
    if "encoder_inputs" in features and models(release, ENCODER_INPUTS) and not config.get("num_hash_lookahead_tokens"):
        config, requests = _encoder_inputs(random.Random("encoder:" + repr(rng.getstate()[1])), config, requests)
    if "cache_aware" in features and "cache_aware_admission_window" not in fields_lacking(release) \
            and config.get("enable_prefix_caching") and config.get("policy", "fcfs") == "fcfs":
        config = _cache_aware(random.Random("cache-aware:" + repr(rng.getstate()[1])), config)
    return config, requests


def _drafters(rng: random.Random, config: dict[str, Any], release: str, features: frozenset[str]) -> dict[str, Any]:
    """Under speculative decoding: the drafter's rows of its own, lookahead block
    hashes, and an EAGLE-family drafter's lookahead and block drop."""
    if config.get("num_speculative_tokens", 0) >= 2 and rng.random() < 1 / 4:
        # A parallel drafter: K - 1 rows of its own per scheduled request (0.33.0
        # speculative.py:2085-2092); gone from 0.34.0, whose draft model adds one row.
        # (a draft model's row, which needs a batch larger than its lookahead)
        k = config["num_speculative_tokens"]
        rows = (1 if config.get("max_num_batched_tokens", 2048) > k else 0) \
            if checks(release, "drafter_rows_at_most_one") else k - 1
        config = {**config, "max_num_new_slots_for_drafting": rows}
    if "hash_lookahead" in features and models(release, HASH_LOOKAHEAD) and config.get("enable_prefix_caching") \
            and rng.random() < 1 / 4:
        # Block hashes covering the tokens after the block (an EAGLE-family drafter's, config/vllm.py:677-692).
        config = {**config, "num_hash_lookahead_tokens": rng.choice([1, 1, 2, 3])}
    if "eagle" in features and config.get("num_speculative_tokens") and rng.random() < 1 / 2:
        # An EAGLE-family drafter: EAGLE-3 reads one prompt token past a chunk, multi-module
        # MTP num_speculative_tokens (config/vllm.py:654-675), at most a block with prefix caching.
        lookahead = rng.choice([1, config["num_speculative_tokens"]])
        if config.get("enable_prefix_caching") and lookahead > config.get("block_size", 16):
            lookahead = 1
        drop = config.get("enable_prefix_caching") and not config.get("num_hash_lookahead_tokens") \
            and rng.random() < 2 / 3
        # From 0.34.0 a drafter with a row of its own is a draft model, not EAGLE (the
        # draws above are made all the same, so the rest of the scenario does not move).
        if not (config.get("max_num_new_slots_for_drafting") == 1 and checks(release, "drafter_rows_at_most_one")):
            config = {**config, "num_prefill_lookahead_tokens": lookahead}
            if drop:
                # With the legacy hashes: a prefix hit gives back its last block (T:834-842).
                config = {**config, "use_eagle_block_drop": True}
    return config


def _cache_aware(rng: random.Random, config: dict[str, Any]) -> dict[str, Any]:
    """Cache-aware admission (spec/cache_aware_admission.py), in one scenario of three
    where it can act: a window, and a usage threshold that is often met."""
    if rng.random() >= 1 / 3:
        return config
    return {**config, "cache_aware_admission_window": rng.choice([2, 3, 4, 8, 64]),
            "cache_aware_admission_threshold": rng.choice([0.0, 0.0, 0.25, 0.5, 0.9])}


def _budget_bound_priority(rng: random.Random, config: dict[str, Any], requests: list[RequestSpec],
                           aborts: list[Abort]):
    """The priority policy under a token budget of a few tokens and a tight pool,
    with mixed priorities: a victim already granted in the step gives its tokens
    back and the budget then decides what the requests after it get (S:967-973).
    Drawn after everything else, so the rest of the scenario stream is unchanged."""
    L, bs = config["max_model_len"], config["block_size"]
    per_seq = math.ceil(L / bs)
    config = {**config, "policy": "priority", "enable_chunked_prefill": True, "scheduler_reserve_full_isl": False,
              "max_num_seqs": max(config["max_num_seqs"], 4),
              "max_num_batched_tokens": max(config["max_num_batched_tokens"], 4),
              "max_num_scheduled_tokens": rng.randint(2, 6),
              "num_gpu_blocks": per_seq + 1 + rng.randint(0, max(1, per_seq // 2))}
    config.pop("max_num_active_seqs", None)
    config.pop("long_prefill_token_threshold", None)
    # Later arrivals run first: a running request admitted early is then the
    # victim of one admitted after it, and it was granted earlier in the step.
    requests = [dataclasses.replace(r, arrival_step=i // 2, priority=rng.randint(0, 1) - i)
                for i, r in enumerate(requests)]
    arrival = {r.id: r.arrival_step for r in requests}
    aborts = sorted((Abort(a.id, max(a.step, arrival[a.id] + 1)) for a in aborts), key=lambda a: a.step)
    return config, requests, aborts


def _engine_flags(rng: random.Random, config: dict[str, Any], requests: list[RequestSpec], aborts: list[Abort],
                  prefix_caching: bool, async_scheduling: bool):
    """vLLM's engine flags on a drawn scenario, with what makes them matter:
    prefix groups, small blocks and tight pools, aborts with batches in flight."""
    config = dict(config)
    for name, on in (("enable_prefix_caching", prefix_caching), ("async_scheduling", async_scheduling)):
        if on:
            config[name] = True
        elif name not in config and rng.random() < 0.3:
            config[name] = False
    L = config["max_model_len"]
    if prefix_caching and rng.random() < 0.6:
        # A hit is whole blocks and leaves one token to compute: with big blocks and
        # short prompts nothing could ever hit.  Keep the pool's capacity in tokens.
        bs = config["block_size"]
        small = rng.choice([1, 2, 3, 4, 4, 8])
        if small < bs:
            config["block_size"] = small
            config["num_gpu_blocks"] = -(-(config["num_gpu_blocks"] - 1) * bs // small) + 1
    bs = config["block_size"]
    if (prefix_caching or async_scheduling) and rng.random() < 0.4:
        # At the start-up minimum or a few blocks above (vLLM's kv_cache_planning.py:151):
        # cached blocks get evicted, running requests preempted with outputs in flight.
        config["num_gpu_blocks"] = -(-L // bs) + 1 + rng.randint(0, 3)
    if L >= 2 and rng.random() < (0.85 if prefix_caching else 0.3):
        requests = _prefix_groups(rng, L, bs, requests)
    if async_scheduling and requests and rng.random() < 0.4:
        aborts = list(aborts)
        aborted = {a.id for a in aborts}
        free = [r for r in requests if r.id not in aborted]
        for r in rng.sample(free, min(len(free), rng.randint(1, 3))):
            aborts.append(Abort(r.id, r.arrival_step + rng.randint(1, 3)))
        aborts = sorted(aborts, key=lambda a: a.step)
    return config, requests, aborts


def _spec_decode(rng: random.Random, config: dict[str, Any], requests: list[RequestSpec]):
    """Speculative decoding on a drawn scenario: drafts per step, a lookahead,
    per-request draft and acceptance patterns, one-token prompts (padded admissions)."""
    config = dict(config)
    L = config["max_model_len"]
    k = rng.choice([1, 2, 3, 4, rng.randint(1, 8)])
    config["num_speculative_tokens"] = k
    if rng.random() < 0.25:
        config["num_lookahead_tokens"] = rng.randint(1, k + 1)
    threshold = config.get("long_prefill_token_threshold", 0)
    if 0 < threshold <= k:  # vLLM asserts a padded admission is not cut (S:1643)
        config["long_prefill_token_threshold"] = rng.choice([0, min(L, k + 1 + rng.randint(0, 4))])
        if config["long_prefill_token_threshold"] <= k:
            config["long_prefill_token_threshold"] = 0

    def pattern(n: int) -> tuple[int, ...]:
        return tuple(rng.choice([0, k, rng.randint(0, k)]) for _ in range(rng.randint(1, n)))

    out = []
    for r in requests:
        changes: dict[str, Any] = {}
        if rng.random() < 0.6:
            changes["num_accepted_tokens"] = pattern(4)
        if rng.random() < 0.4:
            changes["num_draft_tokens"] = pattern(3)
        if rng.random() < 0.15 and r.prefix_group is None and r.prompt_token_ids is None:
            changes["prompt_len"] = 1
        out.append(dataclasses.replace(r, **changes) if changes else r)
    return config, out


def _lora(rng: random.Random, config: dict[str, Any], requests: list[RequestSpec]):
    """LoRA on a drawn scenario: max_loras 1..3 and more adapters than that among
    the requests, so admissions are held back (S:1128-1140)."""
    config = {**config, "max_loras": rng.choice([1, 1, 2, 3])}
    adapters = rng.randint(1, config["max_loras"] + 2)
    return config, [dataclasses.replace(r, lora_int_id=rng.randint(1, adapters)) if rng.random() < 0.75 else r
                    for r in requests]


def _kv_connector(rng: random.Random, block_size: Any, requests: list[RequestSpec]) -> list[RequestSpec]:
    """KV connector hits on a drawn scenario: about half the requests have a prefix
    in a remote store, whole blocks, mid-block or all the prompt but its last token."""
    bs = block_size if isinstance(block_size, int) and block_size > 0 else 16
    out = []
    for r in requests:
        if r.prompt_len > 1 and rng.random() < 0.5:
            most = r.prompt_len - 1
            held = rng.choice([min(most, bs * rng.randint(1, max(1, most // bs))), rng.randint(1, most), most])
            r = dataclasses.replace(r, kv_connector_tokens=held)
        out.append(r)
    if rng.random() < 1 / 2:  # asynchronous loads, finishing 1 to 6 steps after they start
        out = [dataclasses.replace(r, kv_connector_load_steps=rng.choice([1, 1, 2, 3, 6]))
               if r.kv_connector_tokens and rng.random() < 0.6 else r for r in out]
    # A KV producer's sends, reported 1 to 6 steps after the finish: drawn from a generator
    # of their own, seeded from `rng`'s state without advancing it, so that a seed's
    # scenarios stay those drawn before sends were modelled, with sends added.
    # (A str seed, hashed by `random` itself: hash() of the state varies between processes.)
    sends = random.Random(repr(rng.getstate()[1]))
    if sends.random() < 1 / 3:
        out = [dataclasses.replace(r, kv_connector_send_steps=sends.choice([1, 1, 2, 3, 6]))
               if sends.random() < 0.4 else r for r in out]
    return out


def _encoder_inputs(enc: random.Random, config: dict[str, Any], requests: list[RequestSpec]
                    ) -> tuple[dict[str, Any], list[RequestSpec]]:
    """Encoder inputs on one scenario in three: about 60 % of the requests get one to
    three multimodal items, named from a small pool so that requests share encoder cache
    entries, and members of a prefix group mostly the group's items, so that prefix
    hits cover items (or miss by them).  A small encoder budget and cache, so that
    chunks are cut at items and entries evicted; a chunk kept out of an item now and
    then (disable_chunked_mm_input).  `enc` is a generator of its own, seeded from the
    scenario generator's state without advancing it: a seed's scenarios stay those
    drawn before encoder inputs were modelled, with them added."""
    if enc.random() >= 1 / 3:
        return config, requests
    batched = config.get("max_num_batched_tokens", 2048)
    budget = enc.choice([4, 8, 16, 32, 64, None])
    b = batched if budget is None else budget
    cache = enc.choice([b, b + 5, 2 * b, 4 * b, None])
    longest = min(b, batched if cache is None else cache)
    config = {**config, "max_num_encoder_input_tokens": budget, "encoder_cache_size": cache}
    if enc.random() < 1 / 4:
        config["disable_chunked_mm_input"] = True
    lengths: dict[str, int] = {}  # one identifier, one length (scenario.py)
    by_group: dict[str, tuple] = {}

    def items(prompt_len: int) -> tuple:
        out, pos = [], 0
        for _ in range(enc.randint(1, 3)):
            offset = pos + enc.randint(0, enc.choice([0, 3, 20]))
            ident = f"img{enc.randint(0, 5)}"
            n = lengths.get(ident) or enc.randint(1, max(1, min(longest, enc.choice([2, 8, 24, longest]))))
            if offset + n > prompt_len or n > longest:
                break
            lengths[ident] = n
            out.append((offset, n, ident))
            pos = offset + n
        return tuple(out)

    out = []
    for r in requests:
        if enc.random() < 0.6:
            mine = items(r.prompt_len)
            if r.prefix_group is not None and enc.random() < 0.7:
                shared = by_group.setdefault(r.prefix_group, mine)
                mine = tuple(f for f in shared if f[0] + f[1] <= r.prompt_len)
            r = dataclasses.replace(r, mm_features=mine)
        out.append(r)
    return config, out


def _structured_output(rng: random.Random, requests: list[RequestSpec]) -> list[RequestSpec]:
    """Structured output on a drawn scenario: some requests get a grammar that takes
    0..8 steps (now and then up to 60) to compile, and one in eight of those fails,
    so admissions skip them, keep their order and finish some with an error."""
    out = []
    for r in requests:
        if rng.random() < 0.5:
            steps = rng.randint(0, rng.choice([2, 8, 8, 60]))
            r = dataclasses.replace(r, grammar_compile_steps=steps, grammar_error=rng.random() < 1 / 8)
        out.append(r)
    return out


def _prefix_groups(rng: random.Random, L: int, bs: int, requests: list[RequestSpec]) -> list[RequestSpec]:
    """Put some requests into prefix groups (formats.md "Additions").  Each group
    has a prompt of length P (its system prompt), block-aligned or not; a member
    is that prompt plus its own suffix (prefix_len P), an exact duplicate of it
    (prefix_len == prompt_len == P), or a prefix of it (prefix_len == prompt_len < P)."""
    lengths = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        if L - 1 >= bs and rng.random() < 0.45:
            lengths.append(bs * rng.randint(1, (L - 1) // bs))
        else:
            lengths.append(rng.randint(1, L - 1))
    share = rng.choice([0.5, 0.8, 1.0])
    out = []
    for r in requests:
        if rng.random() >= share:
            out.append(r)
            continue
        g = rng.randrange(len(lengths))
        P = lengths[g]
        kind = rng.random()
        if kind < 0.25 or P >= L - 1:  # an exact duplicate of the group's prompt
            p = shared = P
        elif kind < 0.35:  # a prefix of it
            p = shared = rng.randint(1, P)
        else:  # the system prompt and a suffix of its own
            p, shared = rng.randint(P + 1, min(L - 1, P + rng.choice([1, 4, bs, L]))), P
        out.append(dataclasses.replace(r, prompt_len=p, prefix_group=f"g{g}", prefix_len=shared))
    return out


_POSITIVE = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size", "num_gpu_blocks")


def generate_config_dict(rng: random.Random, valid_bias: float = 0.5) -> dict[str, Any]:
    """A raw scenario `config` object near vLLM's acceptance boundaries: with
    probability about `valid_bias` one that sits on a boundary from the valid
    side, otherwise one that crosses a boundary by the smallest step.  Whether
    it is really valid is for vLLM to say; both kinds are drawn so that an
    off-by-one in either direction shows."""
    c = _valid_config(rng)
    L, B, seqs, bs = c["max_model_len"], c["max_num_batched_tokens"], c["max_num_seqs"], c["block_size"]
    need = math.ceil(L / bs)
    valid = rng.random() < valid_bias
    side = 0 if valid else 1  # how far past the boundary
    kind = rng.randrange(12)
    if kind == 0:  # chunked prefill off needs max_num_batched_tokens >= max_model_len
        c["enable_chunked_prefill"] = False
        c["max_num_batched_tokens"] = max(L - side, 1)
        c["max_num_seqs"] = min(seqs, c["max_num_batched_tokens"])
        c.pop("max_num_active_seqs", None)
    elif kind == 1:  # max_num_batched_tokens >= max_num_seqs
        c["max_num_seqs"] = B + side
        c.pop("max_num_active_seqs", None)
    elif kind == 2:  # max_num_active_seqs <= max_num_seqs
        c["max_num_active_seqs"] = seqs + side
    elif kind == 3:  # long_prefill_token_threshold <= max_model_len
        c["long_prefill_token_threshold"] = L + side
    elif kind == 4:  # start-up check: num_gpu_blocks - 1 >= ceil(max_model_len / block_size)
        c["num_gpu_blocks"] = need + 1 - side
    elif kind == 5:  # watermark in [0, 1)
        c["watermark"] = rng.choice([0.0, 0.999999]) if valid else rng.choice([1.0, -0.001, 1.5])
    elif kind == 6:  # integer fields >= 1
        field = rng.choice(_POSITIVE + ("max_num_scheduled_tokens", "max_num_active_seqs"))
        if valid:
            c[field] = c.get(field) or 1
        else:
            c[field] = rng.choice([0, -1]) if field != "max_model_len" else 0
    elif kind == 7:  # long_prefill_token_threshold >= 0
        c["long_prefill_token_threshold"] = 0 if valid else -1
    elif kind == 8:  # policy
        c["policy"] = rng.choice(["fcfs", "priority"]) if valid else rng.choice(["lifo", "FCFS", "", "Priority"])
    elif kind == 9:  # max_num_scheduled_tokens above max_num_batched_tokens is accepted
        c["max_num_scheduled_tokens"] = B + rng.randint(1, 64)
        if not valid:
            c["max_num_seqs"] = B + 1
            c.pop("max_num_active_seqs", None)
    elif kind == 10:  # defaults: drop the model-dependent fields
        for f in rng.sample(["max_model_len", "num_gpu_blocks", "block_size", "max_num_batched_tokens",
                             "max_num_seqs"], rng.randint(1, 3)):
            c.pop(f, None)
        c.pop("long_prefill_token_threshold", None)
        c.pop("max_num_active_seqs", None)
        if not valid:
            c["max_num_seqs"] = c.get("max_num_batched_tokens", 2048) + 1
    else:  # the pool exactly at, or one block under, a full sequence at another block size
        c["block_size"] = rng.randint(1, 16)
        c["num_gpu_blocks"] = math.ceil(L / c["block_size"]) + 1 - side
    # vLLM's engine flags, drawn last so the configs above stay as they were: the
    # boundaries must sit where they are whatever the flags say.
    for name in ("enable_prefix_caching", "async_scheduling"):
        if rng.random() < 0.5:
            c[name] = rng.random() < 0.5
    return c


__all__ = ["FEATURES", "FLAGS_ALL", "FLAGS_OFF", "FLAG_COMBINATIONS", "FLAG_NAMES", "config_rng", "features_for",
           "flags_for", "generate_config_dict",
           "generate_scenario", "parse_flags", "scenario_rng", "unmodelled_features"]
