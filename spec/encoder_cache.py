"""The encoder cache: encoder outputs of multimodal items, shared by identifier between
requests and steps (ECM = vllm/v1/core/encoder_cache_manager.py; modelled from vLLM 0.33.0).

Capacity is in embeddings (every placeholder token of an item is one here).  An entry
stays after its last reference goes, *freeable*, and is evicted, oldest freeable
first, only when an allocation needs its room (ECM:148-209).  Free slots are the
capacity less every entry; freeable slots add the unreferenced entries (ECM:77-94).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, NamedTuple


class MultiModalFeature(NamedTuple):
    """An encoder input of the prompt (vLLM's MultiModalFeatureSpec, RQ:`mm_features`): its
    placeholder tokens [offset, offset + length), each one embedding, and the identifier
    (mm_hash) that equal items share, in the encoder cache as in block hashes."""

    offset: int
    length: int
    identifier: str


@dataclass(frozen=True)
class EncoderCache:
    """ECM's bookkeeping as a value."""

    # identifier -> the requests referencing its entry (ECM `cached`; empty: freeable).
    cached: Mapping[str, frozenset] = field(default_factory=dict)
    # identifier -> the embeddings its entry holds (ECM `num_embeds_by_hash`).
    num_embeds: Mapping[str, int] = field(default_factory=dict)
    # request -> {input id: identifier} of its inputs it references (ECM `request_cached_ids`).
    refs: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    # The unreferenced entries, in eviction order (ECM `freeable`, an OrderedDict).
    freeable: tuple[str, ...] = ()

    def work(self) -> "EncoderCacheWork":
        return EncoderCacheWork(self)

    def num_used_slots(self) -> int:
        return sum(self.num_embeds.values())


EMPTY_ENCODER_CACHE = EncoderCache()


class EncoderCacheWork:
    """One call's working copy; `evicted` collects the identifiers evicted meanwhile (ECM `freed`)."""

    def __init__(self, cache: EncoderCache):
        self.base = cache
        self.cached, self.num_embeds = dict(cache.cached), dict(cache.num_embeds)
        self.refs, self.freeable = dict(cache.refs), dict.fromkeys(cache.freeable)
        self.evicted: list[str] = []
        self.changed = False

    def freeze(self) -> EncoderCache:
        if not self.changed:
            return self.base
        return EncoderCache(self.cached, self.num_embeds, self.refs, tuple(self.freeable))

    def num_free_slots(self, cache_size: int) -> int:
        return cache_size - sum(self.num_embeds.values())

    def num_freeable_slots(self, cache_size: int) -> int:
        return self.num_free_slots(cache_size) + sum(self.num_embeds[h] for h in self.freeable)

    def reference(self, rid: str, input_id: int, identifier: str) -> None:
        self.changed = True
        self.cached[identifier] = self.cached[identifier] | {rid}
        self.refs[rid] = {**self.refs.get(rid, {}), input_id: identifier}

    def check_and_update_cache(self, rid: str, input_id: int, identifier: str) -> bool:
        """Whether the item's output is cached; if so `rid` references it, taking it off
        the freeable list (ECM:111-139)."""
        if identifier not in self.cached:
            return False
        self.freeable.pop(identifier, None)
        self.reference(rid, input_id, identifier)
        return True

    def can_allocate(self, num_embeds: int, encoder_compute_budget: int, num_embeds_to_schedule: int,
                     cache_size: int) -> bool:
        """Whether an item of `num_embeds` fits the step's encoder budget and, beside the
        `num_embeds_to_schedule` this request already schedules, the cache; evicting the
        oldest freeable entries as the room needs (ECM:148-209)."""
        if num_embeds > encoder_compute_budget:
            return False
        need = num_embeds + num_embeds_to_schedule
        if need <= self.num_free_slots(cache_size):
            return True
        if need > self.num_freeable_slots(cache_size):
            return False
        while need > self.num_free_slots(cache_size):
            self.changed = True
            oldest = next(iter(self.freeable))
            del self.freeable[oldest], self.cached[oldest], self.num_embeds[oldest]
            self.evicted.append(oldest)
        return True

    def allocate(self, rid: str, input_id: int, identifier: str, num_embeds: int) -> None:
        """A new entry for the item, referenced by `rid` (ECM:211-243)."""
        self.cached.setdefault(identifier, frozenset())
        assert self.num_embeds.setdefault(identifier, num_embeds) == num_embeds  # ECM:230
        self.reference(rid, input_id, identifier)

    def free_encoder_input(self, rid: str, input_id: int) -> None:
        """`rid` drops its reference of one input; an entry no request references any
        more becomes freeable, newest last (ECM:259-298)."""
        held = self.refs.get(rid, {})
        identifier = held.get(input_id)
        if identifier is None:
            return
        self.changed = True
        held = {i: h for i, h in held.items() if i != input_id}
        if held:
            self.refs[rid] = held
        else:
            del self.refs[rid]
        if identifier in held.values() or not self.cached.get(identifier):
            return  # another input of `rid` holds the same item
        self.cached[identifier] = self.cached[identifier] - {rid}
        if not self.cached[identifier]:
            self.freeable[identifier] = None

    def free(self, rid: str) -> None:
        """Every reference of `rid`: at its finish or preemption (ECM:300-310), by input id;
        vLLM walks a set of them, in that order for ids below 8 (input_processor.py)."""
        for input_id in sorted(self.refs.get(rid, ())):
            self.free_encoder_input(rid, input_id)

    def freed_mm_hashes(self) -> tuple[str, ...]:
        """The evicted entries the workers may drop: not cached again since (ECM:312-326)."""
        return tuple(h for h in self.evicted if h not in self.cached)
