"""What torch does not model, from one table (gpu/limits.py UNMODELLED): the
refusals of `prepare` (run_batch) and of `TorchScheduler`, their messages, and
the features random campaigns against torch leave out (generator.py
`features_for`, through the implementation's `unmodelled_features`)."""

import dataclasses
import sys

import pytest

from schedspec.gpu.batch import prepare
from schedspec.gpu.impl import TorchScheduler
from schedspec.gpu.limits import UNMODELLED, UNMODELLED_FEATURES, unmodelled_in_config
from schedspec.reference.campaign import random_scenario
from schedspec.reference.generator import FEATURES, FLAGS_ALL, features_for, unmodelled_features

SEED = 0


def _first_use(scenario):
    """The table row and the place (`config` or `requests[i]`) of the first field
    of `scenario` that a row says torch does not model, in the table's order
    (the config's rows, then each request's), or None."""
    config = scenario.scheduler_config()
    for u in UNMODELLED:
        if u.request_attr is None and u.used(getattr(config, u.field)):
            return u, "config", getattr(config, u.field)
    for i, r in enumerate(scenario.requests):
        for u in UNMODELLED:
            if u.request_attr is not None and u.used(getattr(r, u.field)):
                return u, f"requests[{i}]", getattr(r, u.field)
    return None


def test_every_row_refuses_its_field_with_its_message():
    """Scenarios drawn with every feature: each row is met, and prepare() refuses
    the scenario with the message of the first row it uses; TorchScheduler
    refuses a config row at reset with the same message."""
    met = set()
    for i in range(400):
        sc = random_scenario(SEED, i, FLAGS_ALL, FEATURES)
        try:
            first = _first_use(sc)
        except Exception:  # noqa: BLE001 - a config vLLM rejects: not this test's concern
            continue
        if first is None:
            continue
        u, where, value = first
        met.add(u.field)
        message = (f"{where}.{u.field}: {u.shown(value)}: the torch implementation does not model {u.what}; "
                   "use --impl spec or vllm")
        assert prepare(sc) == message
        if where == "config":
            with pytest.raises(ValueError) as e:
                TorchScheduler(device="cpu").reset(sc.scheduler_config())
            assert str(e.value) == message
    assert met == {u.field for u in UNMODELLED}, {u.field for u in UNMODELLED} - met


def test_messages_are_those_torch_always_gave():
    config = random_scenario(SEED, 0).scheduler_config()
    assert unmodelled_in_config(config) is None
    assert unmodelled_in_config(dataclasses.replace(config, max_loras=2)) == (
        "config.max_loras: = 2: the torch implementation does not model LoRA; use --impl spec or vllm")
    assert unmodelled_in_config(dataclasses.replace(config, long_prefill_token_threshold_adaptive=True)) == (
        "config.long_prefill_token_threshold_adaptive: = true: the torch implementation does not model the "
        "adaptive long-prefill threshold; use --impl spec or vllm")


def test_torch_declares_the_tables_features_and_campaigns_leave_them_out():
    assert UNMODELLED_FEATURES <= FEATURES
    assert TorchScheduler.unmodelled_features == UNMODELLED_FEATURES == unmodelled_features("torch")
    assert features_for("torch", "spec") == FEATURES - UNMODELLED_FEATURES == features_for("spec", "torch")
    assert unmodelled_features("spec") == frozenset() and unmodelled_features("vllm==0.33.0") == frozenset()


def test_a_plugins_declaration_is_read_from_its_class(tmp_path, monkeypatch):
    (tmp_path / "unmodelled_plugin_mod.py").write_text(
        "class Lacks:\n    unmodelled_features = frozenset({'lora', 'eagle'})\n\nclass Plain:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert features_for("unmodelled_plugin_mod:Lacks", "spec") == FEATURES - {"lora", "eagle"}
        assert features_for("unmodelled_plugin_mod:Plain") == FEATURES
        # a class that cannot be imported declares nothing: loading it says why
        assert features_for("no_such_module_here:Sched", "spec") == FEATURES
    finally:
        sys.modules.pop("unmodelled_plugin_mod", None)
