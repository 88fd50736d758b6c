"""The vLLM release a proof run models (`schedspec prove --vllm-version X`).

The spec asks `versions.has(config, GATE)` with the release in the config.  In
the z3 encodings the config is symbolic but the release is not: it is a
constant of the whole run, like the block size of a case, so it is set once
here before the obligations are built and every rule site of the encodings
asks `applies(GATE)` (the same gates, spec/versions.py).  Fork workers of
`prove --jobs` inherit it; `set_release` is also called in each worker.

What a release changes in the proofs:
- its rules (the gates);
- its config checks: a release that accepts more configs (no
  `long_prefill_token_threshold <= max_model_len` check before 0.28.0) is
  proved over all of them.  Two looser bounds stay restricted, and each
  obligation's bound says so (`restriction`): `max_num_scheduled_tokens` <= 0
  (accepted before 0.32.0; a step then schedules nothing) and a negative
  `long_prefill_token_threshold` (accepted in 0.20.0; it caps nothing, as 0);
- bad variants that are the release's own rule (`SAME_AS_RULE_OF`): there they
  are not bad, so they are dropped from that release's list;
- properties the release violates (`FINDINGS`): a vLLM bug the proofs show,
  fixed in a later release.  Expected refuted on those releases, with the
  scenario that shows it on the real release.
"""

from __future__ import annotations

from schedspec.spec import versions
from schedspec.spec.versions import (ADAPTIVE_THRESHOLD, DEFAULT_RELEASE, ENCODER_INPUTS, GATES, HASH_LOOKAHEAD, INPUT_BUDGET, LORA,
                                     LONG_PREFILL_THRESHOLD_NEEDS_TWO, PREFILL_THROTTLE,
                                     PRIORITY_SELF_PREEMPTION_CONTINUES, RELEASES, SPEC_DECODE, STRUCTURED_OUTPUT,
                                     UNHASHED_FREE_BLOCKS_FIRST, checks, field_minimum, has, models)

_release = [DEFAULT_RELEASE]


def set_release(version: str) -> None:
    if version not in RELEASES:
        raise ValueError(f"vllm_version: {version!r} is not a modelled release ({', '.join(RELEASES)})")
    _release[0] = version


def release() -> str:
    return _release[0]


def applies(gate: str) -> bool:
    """Does the modelled release apply rule `gate` as changed at its release?"""
    return has(_release[0], gate)


def checks_config(check: str) -> bool:
    """Does the modelled release make config check `check` (versions.CHECKS_SINCE)?"""
    return checks(_release[0], check)


def fields_lacking() -> frozenset[str]:
    """The config fields the modelled release lacks (versions.FIELDS_SINCE)."""
    return versions.fields_lacking(_release[0])


def models_lora() -> bool:
    """Does schedspec model LoRA for the modelled release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], LORA)


def models_structured_output() -> bool:
    """Does schedspec model structured output for the modelled release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], STRUCTURED_OUTPUT)


def models_encoder_inputs() -> bool:
    """Does schedspec model encoder inputs for the modelled release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], ENCODER_INPUTS)


def models_spec_decode() -> bool:
    """Does schedspec model speculative decoding for the modelled release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], SPEC_DECODE)


def models_prefill_throttle() -> bool:
    """Does schedspec model prefill throttling (a step that holds prefill) for the
    modelled release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], PREFILL_THROTTLE)


def models_adaptive_threshold() -> bool:
    """Does schedspec model `long_prefill_token_threshold_adaptive` for the modelled
    release?  From the release versions.FEATURES_SINCE names on."""
    return models(_release[0], ADAPTIVE_THRESHOLD)


def models_hash_lookahead() -> bool:
    """Does schedspec model lookahead block hashes for the modelled release?"""
    return models(_release[0], HASH_LOOKAHEAD)


def scenario_config(config: dict) -> dict:
    """A witness scenario's config for the modelled release: without the fields
    it lacks, and naming the release unless it is the default."""
    out = {k: v for k, v in config.items() if k not in fields_lacking()}
    if _release[0] != DEFAULT_RELEASE:
        out["vllm_version"] = _release[0]
    return out


def restriction() -> str:
    """What the proofs of the modelled release leave out of the configs it accepts."""
    if _release[0] == DEFAULT_RELEASE:
        return ""
    out = [f"{field} >= {bound}" for field, bound in (("max_num_scheduled_tokens", 1),
                                                      ("long_prefill_token_threshold", 0))
           if field_minimum(_release[0], field, bound) != bound]
    return f"vLLM {_release[0]}" + (f"; {', '.join(out)}" if out else "")


# Bad variant -> the gate whose older rule it is (not bad where the gate is off).
SAME_AS_RULE_OF = {
    "threshold_with_one_eligible": LONG_PREFILL_THRESHOLD_NEEDS_TWO,  # encoding.py / variants.py
    "threshold_one_eligible": LONG_PREFILL_THRESHOLD_NEEDS_TWO,  # starvation.py
    # pool_invariants.py: before the gate every freed block goes to the back, so
    # where a freed hashed block goes changes nothing
    "hashed_freed_to_front": UNHASHED_FREE_BLOCKS_FIRST,
}


# Bad variant -> does the modelled release have the feature it breaks?  Without
# it the variant is the rules themselves (loop_config.py: a drafter's rows
# exist only with speculative decoding, which schedspec models from 0.33.0 on).
NEEDS_FEATURE = {"drafter_rows_not_charged": models_spec_decode}


def bad_variants(variants) -> tuple[str, ...]:
    """`variants` less those that are the modelled release's own rule, or break a
    feature it does not have."""
    return tuple(v for v in variants if (v not in SAME_AS_RULE_OF or applies(SAME_AS_RULE_OF[v]))
                 and (v not in NEEDS_FEATURE or NEEDS_FEATURE[v]()))


# Property -> (the gate that fixed it, the command that shows it on the real
# release, {release} standing for it; its scenario file is in the repository's
# docs/changes).  A step:/loop: obligation of the property is expected refuted on
# every release before the gate's, and proved from it.
FINDINGS = {
    # A step grants more than max_num_batched_tokens (no input budget before 0.28.0).
    "token_budget_respected": (INPUT_BUDGET, "schedspec check --impl vllm=={release} docs/changes/input_budget.json"),
    # Under PRIORITY a self-preemption ended the running loop, so the running requests
    # after the victim stay running with no token that step (0.32.0 scheduler.py:846-848).
    "running_never_starved": (PRIORITY_SELF_PREEMPTION_CONTINUES,
                              "schedspec run --impl vllm=={release} docs/changes/priority_self_preemption_continues.json"
                              " (step 3: r1 stays running with no token)"),
}


def finding(prop: str) -> str | None:
    """The vLLM bug the modelled release has for `prop`, said in one line, or None."""
    if prop not in FINDINGS or applies(FINDINGS[prop][0]):
        return None
    gate, replay = FINDINGS[prop]
    return (f"vLLM {_release[0]} violates {prop} (fixed in {GATES[gate].since}, gate {gate}); "
            f"on the real release: {replay.format(release=_release[0])}")


__all__ = ["FINDINGS", "SAME_AS_RULE_OF", "applies", "bad_variants", "checks_config", "fields_lacking", "finding",
           "models_lora", "models_spec_decode", "models_structured_output", "release", "restriction", "scenario_config", "set_release"]
