"""Implementations for the campaign tests (`--impl tests.campaign_impls:Name`):
each is the spec with one deterministic flaw, chosen by the scenario's config,
so that which scenarios go wrong is known in advance and the same in every
worker process.

`selected(config)` is the rule: the scenarios whose max_num_batched_tokens is
odd.  The campaign tests compute the expected scenarios from it.
"""

from __future__ import annotations

import dataclasses
import os
import time

from schedspec.reference.impl import SpecScheduler


def selected(config) -> bool:
    return config.max_num_batched_tokens % 2 == 1


class FewerSeqs(SpecScheduler):
    """Caps running requests one lower than asked, on selected scenarios with
    max_num_seqs > 1: a real trace divergence wherever the cap binds."""

    def reset(self, config):
        if selected(config) and config.max_num_seqs > 1:
            config = dataclasses.replace(config, max_num_seqs=config.max_num_seqs - 1)
        return super().reset(config)


class Crasher(SpecScheduler):
    """Kills its own process on selected scenarios, as a segfaulting extension would."""

    def reset(self, config):
        if selected(config):
            os._exit(3)
        return super().reset(config)


class Hanger(SpecScheduler):
    """Never returns on selected scenarios."""

    def reset(self, config):
        if selected(config):
            time.sleep(3600)
        return super().reset(config)


class BrokenLoad(SpecScheduler):
    """Cannot be constructed."""

    def __init__(self):
        raise RuntimeError("no licence for this scheduler")


class SlowFewerSeqs(FewerSeqs):
    """FewerSeqs, 40 ms slower per scenario: a campaign with divergences, long enough to interrupt."""

    def reset(self, config):
        time.sleep(0.04)
        return super().reset(config)


# A job for reference/workers.py itself: items are returned as they are, "boom" raises.
def setup_echo(tag: str) -> str:
    return tag


def setup_echo_dying_once(tag: str, marker: str) -> str:
    """setup_echo, but the first worker to set up dies doing it (a transient failure:
    out of memory while loading, say); `marker` is a path that does not exist yet."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return tag
    os._exit(9)


def run_echo_slow(tag: str, item, heartbeat):
    """run_echo, a quarter second an item: work is still left when a worker's death is seen."""
    time.sleep(0.25)
    return run_echo(tag, item, heartbeat)


def run_echo(tag: str, item, heartbeat):
    if item == "boom":
        raise ValueError("boom")
    if item == "die":
        os._exit(5)
    return f"{tag}:{item}"
