"""The vLLM release a proof run models (`schedspec prove --vllm-version X`).

The spec asks `versions.has(config, GATE)` with the release in the config.  In
the z3 encodings the config is symbolic but the release is not: it is a
constant of the obligation, like the block size of a case, so it is a value
(`Release`) that `build_obligations(release)` hands down on the objects the
encodings already pass around (the symbolic config, a LoopConfig, a pool or an
aggregate state), and every rule site asks `rel.applies(GATE)` (the same gates,
spec/versions.py).  Nothing here is process state: a run of `prove --jobs` gives
each worker the release with its task.

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

from dataclasses import dataclass

from schedspec.spec import versions
from schedspec.spec.versions import (DEFAULT_RELEASE, GATES, INPUT_BUDGET, LONG_PREFILL_THRESHOLD_NEEDS_TWO,
                                     PRIORITY_SELF_PREEMPTION_CONTINUES, RELEASES, SPEC_DECODE,
                                     UNHASHED_FREE_BLOCKS_FIRST, checks, field_minimum, has, models)


@dataclass(frozen=True)
class Release:
    """The vLLM release a proof run models, as a value: every encoding asks it at
    its rule sites (`rel.applies(GATE)`), carried on the config-like object the
    encoding already receives (the symbolic config, a LoopConfig, a pool or an
    aggregate state) from `build_obligations(release)` down."""

    version: str

    def __post_init__(self):
        if self.version not in RELEASES:
            raise ValueError(f"vllm_version: {self.version!r} is not a modelled release ({', '.join(RELEASES)})")

    def applies(self, gate: str) -> bool:
        """Does the release apply rule `gate` as changed at its release?"""
        return has(self.version, gate)

    def checks_config(self, check: str) -> bool:
        """Does the release make config check `check` (versions.CHECKS_SINCE)?"""
        return checks(self.version, check)

    def fields_lacking(self) -> frozenset[str]:
        """The config fields the release lacks (versions.FIELDS_SINCE)."""
        return versions.fields_lacking(self.version)

    def models(self, feature: str) -> bool:
        """Does schedspec model `feature` for the release?  From the release
        versions.FEATURES_SINCE names on."""
        return models(self.version, feature)

    def scenario_config(self, config: dict) -> dict:
        """A witness scenario's config for the release: without the fields it
        lacks, and naming the release unless it is the default."""
        out = {k: v for k, v in config.items() if k not in self.fields_lacking()}
        if self.version != DEFAULT_RELEASE:
            out["vllm_version"] = self.version
        return out

    def restriction(self) -> str:
        """What the proofs of the release leave out of the configs it accepts."""
        if self.version == DEFAULT_RELEASE:
            return ""
        out = [f"{field} >= {bound}" for field, bound in (("max_num_scheduled_tokens", 1),
                                                          ("long_prefill_token_threshold", 0))
               if field_minimum(self.version, field, bound) != bound]
        return f"vLLM {self.version}" + (f"; {', '.join(out)}" if out else "")

    def bad_variants(self, variants) -> tuple[str, ...]:
        """`variants` less those that are the release's own rule, or break a
        feature it does not have."""
        return tuple(v for v in variants if (v not in SAME_AS_RULE_OF or self.applies(SAME_AS_RULE_OF[v]))
                     and (v not in NEEDS_FEATURE or self.models(NEEDS_FEATURE[v])))

    def finding(self, prop: str) -> str | None:
        """The vLLM bug the release has for `prop`, said in one line, or None."""
        if prop not in FINDINGS or self.applies(FINDINGS[prop][0]):
            return None
        gate, replay = FINDINGS[prop]
        return (f"vLLM {self.version} violates {prop} (fixed in {GATES[gate].since}, gate {gate}); "
                f"on the real release: {replay.format(release=self.version)}")


# The release `schedspec prove` models unless told (--vllm-version).
DEFAULT = Release(DEFAULT_RELEASE)


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
NEEDS_FEATURE = {"drafter_rows_not_charged": SPEC_DECODE}  # a feature of spec/versions.py


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


__all__ = ["DEFAULT", "FINDINGS", "NEEDS_FEATURE", "SAME_AS_RULE_OF", "Release"]
