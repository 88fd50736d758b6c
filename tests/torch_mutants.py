"""Deliberately broken variants ("mutants") of the torch implementation, each a
realistic scheduler bug, as textual replacements of gpu/step.py, and a loader
that builds them as module variants (step, batch, impl) next to the real ones.
Every `old` must occur exactly once, so a mutant cannot silently be the original."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import schedspec.gpu

GPU_DIR = Path(schedspec.gpu.__file__).parent
ST = "step.py"

# name -> [(file, old, new)]
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    # `<` for `<=` on the budget: chunked prefill off admits only a request that fits with room to spare.
    "budget_lt_for_le": [(ST, "(want <= left)", "(want < left)")],
    # an off-by-one block ceiling: floor((a + b) / b) instead of ceil(a / b).
    "block_ceiling_off_by_one": [(ST, "return (a + b - 1) // b", "return (a + b) // b")],
    # `break` for `continue`: a self-preempted PRIORITY request ends the running loop (vLLM M / Old).
    "self_preempt_break": [(ST, "loop_done = loop_done | (has_fail & self_preempt & ~batch.priority_policy)",
                            "loop_done = loop_done | (has_fail & self_preempt)")],
    # the wrong preemption victim: FCFS takes the head of running instead of the tail.
    "fcfs_victim_head": [(ST, "victim_key.argmax(1), (num_running - 1).clamp(min=0))",
                          "victim_key.argmax(1), torch.zeros_like(num_running))")],
    # the wrong preemption victim: PRIORITY takes the last of equal keys instead of the first.
    "priority_victim_tie_last": [(ST, "* (R + 1) + (R - pos), -1)", "* (R + 1) + pos, -1)")],
    # admitting after a preemption.
    "admit_after_preemption": [(ST, "ok &= (active & ~preempted)[:, None]", "ok &= active[:, None]")],
    # not resetting computed tokens on preemption.
    "preempt_keeps_computed_tokens": [(ST, "        ncomp = torch.where(vmask, 0, ncomp)\n", "")],
    # forgetting the null block: the whole pool counted as usable.
    "null_block_forgotten": [("batch.py", '"num_usable_blocks": config.num_gpu_blocks - 1,',
                              '"num_usable_blocks": config.num_gpu_blocks,')],
    # the long-prefill threshold applied with one eligible request.
    "threshold_with_one_request": [(ST, "torch.where(num_eligible > 1, batch.long_prefill_token_threshold, 0)",
                                    "torch.where(num_eligible > 0, batch.long_prefill_token_threshold, 0)")],
    # a preempted FCFS request requeued at the back of waiting.
    "requeue_at_back": [(ST, "wait_key = torch.where(vmask, next_front_key[:, None], wait_key)",
                         "wait_key = torch.where(vmask, -next_front_key[:, None] + 2**40, wait_key)")],
    # a PRIORITY victim scheduled earlier in the step keeps its grant's budget (no refund).
    "refund_not_refunded": [(ST, "        budget = budget + torch.where(vmask, grant, 0).sum(1)\n", "")],
    # a refunded PRIORITY victim stays in the step's grants (its tokens still advance).
    "refunded_grant_kept": [(ST, "        grant = torch.where(vmask, 0, grant)\n", "")],
    # the priority cursor not adjusted when the victim sits before it (before #49206).
    "cursor_not_adjusted": [(ST, "        cursor = torch.where(has_fail & (victim_pos < cursor), cursor - 1, cursor)\n", "")],
    # the watermark charged to the first admission too (running empty).
    "watermark_on_first_admission": [(ST, "batch.watermark_blocks[:, None] * (num_running[:, None] + k > 0)",
                                      "batch.watermark_blocks[:, None] * (num_running[:, None] + k >= 0)")],
    # EOS checked after length: an EOS at the last allowed token reported as "length".
    "length_before_eos": [(ST, "length = sampled & ~eos & (", "length = sampled & (")],
}


def load_torch_mutant(replacements: list[tuple[str, str, str]], name: str = "mutant") -> types.SimpleNamespace:
    """Variants of gpu/step.py, batch.py and impl.py with `replacements`, wired to
    each other; returns a namespace with `step`, `batch` and `impl` modules."""
    files = ("step.py", "batch.py", "impl.py")
    src = {f: (GPU_DIR / f).read_text() for f in files}
    for file, old, new in replacements:
        count = src[file].count(old)
        assert count == 1, f"mutation target occurs {count} times in {file}: {old!r}"
        src[file] = src[file].replace(old, new)
    package = "schedspec.gpu"
    mods = {}
    for f in files:
        stem = f[:-3]
        text = src[f]
        for dep in ("step", "batch"):
            if dep in mods:
                line = f"from .{dep} import"
                assert text.count(line) == 1, f"{f} must import .{dep} exactly once"
                text = text.replace(line, f"from .{dep}_{name} import")
        mod = types.ModuleType(f"{package}.{stem}_{name}")
        mod.__package__ = package
        sys.modules[mod.__name__] = mod
        exec(compile(text, f"<{name}:{f}>", "exec"), mod.__dict__)
        mods[stem] = mod
    return types.SimpleNamespace(**mods)
