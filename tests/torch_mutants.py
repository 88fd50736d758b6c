"""Deliberately broken variants ("mutants") of the torch implementation, each a
realistic scheduler bug, as textual replacements of gpu/step.py (or pool.py,
batch.py), and a loader that builds them as module variants (pool, step, batch,
impl) next to the real ones.
Every `old` must occur exactly once, so a mutant cannot silently be the original."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import schedspec.gpu

GPU_DIR = Path(schedspec.gpu.__file__).parent
ST = "step.py"
PL = "pool.py"

# name -> [(file, old, new)]
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    # `<` for `<=` on the budget: chunked prefill off admits only a request that fits with room to spare.
    # (Each admission mutant changes both waiting loops: the vectorised one and the one by one
    # of prefix-caching batches.)
    "budget_lt_for_le": [(ST, "(want <= left)", "(want < left)"),
                         (ST, "(want <= budget))", "(want < budget))")],
    # an off-by-one block ceiling: floor(t / d + 1) instead of ceil(t / d).
    "block_ceiling_off_by_one": [(ST, "return torch.div(t, d).ceil_().to(t.dtype)",
                                  "return (torch.div(t, d) + 1).floor_().to(t.dtype)")],
    # `break` for `continue`: a self-preempted PRIORITY request ends the running loop (vLLM M / Old).
    "self_preempt_break": [(ST, "loop_done = loop_done | (has_fail & self_preempt & ~batch.priority_policy)",
                            "loop_done = loop_done | (has_fail & self_preempt)")],
    # the wrong preemption victim: FCFS takes the head of running instead of the tail.
    "fcfs_victim_head": [(ST, "victim_key.argmax(1), (num_running - 1).clamp(min=0))",
                          "victim_key.argmax(1), torch.zeros_like(num_running))")],
    # the wrong preemption victim: PRIORITY takes the last of equal keys instead of the first.
    "priority_victim_tie_last": [(ST, "* (R + 1) + (R - pos), -1)", "* (R + 1) + pos, -1)")],
    # admitting after a preemption.
    "admit_after_preemption": [(ST, "ok &= (w.active & ~w.preempted)[:, None]", "ok &= w.active[:, None]"),
                               (ST, "batch, state, w, active & ~w.preempted, worder", "batch, state, w, active, worder")],
    # not resetting computed tokens on preemption.
    "preempt_keeps_computed_tokens": [(ST, "    w.ncomp = torch.where(vmask, 0, w.ncomp)\n", "")],
    # forgetting the null block: the whole pool counted as usable.
    "null_block_forgotten": [("batch.py", '"num_usable_blocks": config.num_gpu_blocks - 1,',
                              '"num_usable_blocks": config.num_gpu_blocks,')],
    # the long-prefill threshold applied with one eligible request.
    "threshold_with_one_request": [(ST, "torch.where(num_eligible > 1, batch.long_prefill_token_threshold, 0)",
                                    "torch.where(num_eligible > 0, batch.long_prefill_token_threshold, 0)")],
    # a preempted FCFS request requeued at the back of waiting.
    "requeue_at_back": [(ST, "w.wait_key = torch.where(vmask, w.next_front_key[:, None], w.wait_key)",
                         "w.wait_key = torch.where(vmask, -w.next_front_key[:, None] + 2**40, w.wait_key)")],
    # a PRIORITY victim scheduled earlier in the step keeps its grant's budget (no refund).
    "refund_not_refunded": [(ST, "    w.budget = w.budget + torch.where(vmask, w.grant, 0).sum(1)\n", "")],
    # a refunded PRIORITY victim stays in the step's grants (its tokens still advance).
    "refunded_grant_kept": [(ST, "    w.grant = torch.where(vmask, 0, w.grant)\n", "")],
    # the priority cursor not adjusted when the victim sits before it (before #49206).
    "cursor_not_adjusted": [(ST, "        cursor = torch.where(has_fail & (victim_pos < cursor), cursor - 1, cursor)\n", "")],
    # the watermark charged to the first admission too (running empty).
    "watermark_on_first_admission": [(ST, "batch.watermark_blocks[:, None] * (num_running[:, None] + k > 0)",
                                      "batch.watermark_blocks[:, None] * (num_running[:, None] + k >= 0)"),
                                     (ST, "wm = batch.watermark_blocks * (a.nrun > 0)",
                                      "wm = batch.watermark_blocks * (a.nrun >= 0)")],
    # EOS checked after length: an EOS at the last allowed token reported as "length".
    "length_before_eos": [(ST, "length = sampled & ~eos & (", "length = sampled & (")],
    # --- prefix caching (gpu/pool.py and the admissions of gpu/step.py) ---
    # the hit not capped at num_tokens - 1: a block-aligned full-prompt hit computes nothing.
    "hit_not_capped": [(ST, "floor_div(ntok - 1, bsf) * cont)", "floor_div(ntok, bsf) * cont)")],
    # a request's blocks freed head first: its first blocks, not its last, are evicted first.
    "free_head_first": [(PL, "seq = take(q, s, r) * H + (H - 1 - i)", "seq = take(q, s, r) * H + i")],
    # freed hashed blocks prepended like unhashed ones: the newest cache entries evicted first.
    "hashed_to_front": [(PL, "back = (pool.bhash.view(-1)[ub] >= 0) | ~unhashed_first[us]",
                         "back = ~unhashed_first[us]")],
    # an admission's blocks not hashed within the step: a later admission of the step misses them.
    "no_hashing_within_step": [(ST, "    pool = cache(batch.block_hashes, pool, (upto[:, None] * onehot).to(I32), "
                                    "torch.zeros_like(a.run_pos),\n                 ranked=True)\n", "")],
    # the running loop's blocks cached in reverse running order: a hash filled by two requests in one
    # step keeps the later request's block as the one a lookup finds.
    "cache_rank_reversed": [(ST, "place = torch.empty_like(order).scatter_(1, order, pos.to(order.dtype).expand(S, R))",
                             "place = (R - 1 - pos).to(order.dtype).expand(S, R)")],
    # no prefix-cache lookup for a preempted request: resumption recomputes everything.
    "no_hits_on_resumption": [(ST, "floor_div(ntok - 1, bsf) * cont)",
                               "floor_div(ntok - 1, bsf) * cont * (status[rows, r] == WAITING))")],
    # a popped cached block keeps its hash: a later lookup hits a block that now holds other tokens.
    "no_eviction": [(PL, "    if evicting:\n        _evict(pool, s, b)\n", "")],
    # --- async scheduling (gpu/step.py: schedule's placeholders and guard, deliver, engine_step_async) ---
    # no async max_tokens guard: a request whose last allowed token is in flight is scheduled once more.
    "async_no_max_tokens_guard": [(ST, "schedulable = ~(gt(ph, 0) & ge(ncomp + 2 - ph, batch.num_prompt_tokens "
                                       "+ batch.max_tokens))", "schedulable = None")],
    # the guard off by one (+1 for +2): it passes over a request one token too early.
    "async_guard_off_by_one": [(ST, "ge(ncomp + 2 - ph, batch.num_prompt_tokens",
                                "ge(ncomp + 1 - ph, batch.num_prompt_tokens")],
    # AsyncScheduler's output placeholders not added: a decode is not scheduled while its token is in flight.
    "async_no_placeholders": [(ST, "ph=new.ph + both(sample, batch.async_sched[:, None]))", "ph=new.ph)")],
    # a preemption keeps the request's placeholders: it resumes wanting tokens that will never come.
    "async_preempt_keeps_placeholders": [(ST, "        w.ph = torch.where(vmask, 0, w.ph)\n", "")],
    # stale output (from before a preemption) dropped instead of appended (docs/rules.md §9.3, S:2362-2369).
    "async_stale_output_dropped": [(ST, "    tokens = tokens & mine\n",
                                    "    tokens = tokens & mine & (state.stale == 0)\n")],
    # the output of a request aborted while its batch was in flight is still applied (S:2373-2381).
    "async_aborted_output_applied": [(ST, "    mine = gt(grant, 0) & live\n",
                                      "    mine = gt(grant, 0) & (live | (state.status == ABORTED))\n")],
    # an empty batch does not take a place in flight: the next batch is applied a step early.
    "async_empty_batch_not_queued": [(ST, "stays = is_async & called & (old | tokens | live_any)",
                                      "stays = is_async & called & (tokens | live_any)")],
    # blocks completed by a returned token not hashed on delivery (S:2454-2471).  With two batches
    # in flight the allocation of the next step has hashed them already, or the pool's hashes
    # differ without a trace field showing it; the observed pool shows it (test_torch_async.py).
    "async_no_hashing_on_delivery": [(ST, "    hashing = fresh & had_ph & was_running\n",
                                      "    hashing = fresh & had_ph & was_running & False\n")],
    # the waiting loop does not skip a request whose stale output is in flight (S:1123-1128); the
    # two-batch engine never reaches it (formats.md), a deeper pipeline does (test_torch_async.py).
    "async_no_stale_skip": [(ST, "        in_wait = in_wait & eq(w.stale, 0)\n", "        pass\n")],
}

# Mutants the default campaign cannot see, by the engine's construction, with the test that catches each.
NOT_IN_DEFAULT_CAMPAIGN = {
    "async_no_stale_skip": "tests/test_torch_async.py::test_deep_pipeline_catches_mutant",
    "async_no_hashing_on_delivery": "tests/test_torch_async.py::test_deep_pipeline_catches_mutant",
}


def load_torch_mutant(replacements: list[tuple[str, str, str]], name: str = "mutant") -> types.SimpleNamespace:
    """Variants of gpu/step.py, batch.py and impl.py with `replacements`, wired to
    each other; returns a namespace with `step`, `batch` and `impl` modules."""
    files = ("pool.py", "step.py", "batch.py", "impl.py")
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
        for dep in ("pool", "step", "batch"):
            if dep in mods:
                line = f"from .{dep} import"
                if dep == "pool" and line not in text:
                    continue  # batch.py does not use the pool directly
                assert text.count(line) == 1, f"{f} must import .{dep} exactly once"
                text = text.replace(line, f"from .{dep}_{name} import")
        mod = types.ModuleType(f"{package}.{stem}_{name}")
        mod.__package__ = package
        sys.modules[mod.__name__] = mod
        exec(compile(text, f"<{name}:{f}>", "exec"), mod.__dict__)
        mods[stem] = mod
    return types.SimpleNamespace(**mods)
