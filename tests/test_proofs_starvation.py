"""The starvation theorems (proofs/starvation.py): proved on the correct rules,
refuted on each bad variant, witnessed by scenarios that replay, and their two
encodings checked against `spec.scheduler.schedule` on concrete values."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mutants import Mutation, mutated

from schedspec.proofs import starvation as st
from schedspec.proofs.obligation import Obligation
from schedspec.proofs.release import DEFAULT
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import load_scenario, save_scenario, validate_scenario
from schedspec.spec.config import SchedulerConfig
from schedspec.spec.kv_cache import cdiv
from schedspec.spec.properties import PROPERTIES
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.scheduler import schedule, update_from_output
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState

ROOT = Path(__file__).resolve().parents[1]
OBLIGATIONS = st.obligations(DEFAULT)
BY_NAME = {ob.name: ob for ob in OBLIGATIONS}


def test_obligations_are_records_of_a_registered_property():
    assert len(BY_NAME) == len(OBLIGATIONS) >= 6
    for ob in OBLIGATIONS:
        assert isinstance(ob, Obligation) and ob.kind == "theorem" and ob.expected == "proved"
        assert ob.property in PROPERTIES
        assert ob.bad_variants and set(ob.bad_variants) <= set(st.BAD_VARIANTS)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_proved_and_refuted_on_each_bad_variant(name):
    ob = BY_NAME[name]
    r = ob.discharge("correct")
    assert r.status == "proved", r.detail
    for v in ob.bad_variants:
        bad = ob.discharge(v)
        assert bad.status == "refuted", (v, bad.detail)
        assert bad.model  # the counterexample comes back


def test_unknown_is_not_a_pass(monkeypatch):
    # A query z3 cannot settle within the timeout comes back "unknown", never "proved".
    monkeypatch.setattr(st, "SOLVER_TIMEOUT_MS", 50)

    def fermat(z3):
        x, y, z = z3.Ints("x y z")
        return z3.Implies(z3.And(x > 0, y > 0, z > 0), x * x * x + y * y * y != z * z * z)

    assert st.prove(fermat, "Fermat n=3").status == "unknown"


# --- witnesses ----------------------------------------------------------------------------


def _step1_grants(trace):
    return dict((rid, n) for rid, n in trace["steps"][1]["scheduled"])


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_witness_scenario_replays_and_shows_the_condition(name, tmp_path):
    ob = BY_NAME[name]
    r, scenario = ob.witness()
    assert r.status == "proved" and scenario is not None, r.detail
    path = save_scenario(scenario, tmp_path / f"{name}.json")
    loaded = load_scenario(path)
    config = validate_scenario(loaded)  # vLLM would accept it
    trace = run_scenario(loaded, SpecScheduler())
    assert "error" not in trace
    D = sum(1 for q in loaded.requests if q.id != "prompt")
    B = config.token_budget
    P = next(q.prompt_len for q in loaded.requests if q.id == "prompt")
    step1 = trace["steps"][1]
    assert step1["running"][:D] == [f"d{i}" for i in range(D)]
    grants = _step1_grants(trace)
    prompt = grants.get("prompt", 0)
    if name == "starvation.budget_exhausted":
        assert D >= B and prompt == 0
    elif name == "starvation.no_run_slot":
        assert D >= config.max_num_active_reqs and D < B and prompt == 0
    elif name in ("starvation.chunk_grant", "starvation.aggregate_agrees"):
        assert D < B and prompt == min(P, B - D) > 0
        assert all(grants[f"d{i}"] == 1 for i in range(D))
    elif name == "starvation.prefill_steps":
        steps = cdiv(P, B - D)
        assert steps >= 3
        # the prompt's computed tokens after k steps are min(P, k*(B - D))
        for k in range(1, steps + 1):
            assert trace["steps"][k]["num_computed_tokens"]["prompt"] == min(P, k * (B - D))
            assert len([x for x in trace["steps"][k]["running"] if x.startswith("d")]) == D
        assert trace["summary"]["requests"]["prompt"]["first_token_step"] == steps  # arrived at step 1
    elif name == "starvation.chunked_off_admission":
        assert not config.enable_chunked_prefill and P > B - D and prompt == 0
    else:
        pytest.fail(f"no replay check for {name}")
    assert "Reproduce: schedspec run" in loaded.description


def test_witness_file_runs_through_the_cli(tmp_path):
    _, scenario = BY_NAME["starvation.budget_exhausted"].witness()
    path = save_scenario(scenario, tmp_path / "w.json")
    out = tmp_path / "w.trace.json"
    p = subprocess.run([sys.executable, "-m", "schedspec", "run", str(path), "--trace-out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    trace = json.loads(out.read_text())
    assert "prompt" not in _step1_grants(trace)


# --- the encodings against the spec, on concrete values --------------------------------


def _decode(i: int, computed: int) -> Request:
    # a decode: a 1-token prompt and `computed` outputs, all but the last computed
    return Request(f"d{i}", 1, 1000, arrival_time=float(i), status=RequestStatus.RUNNING,
                   num_computed_tokens=computed, num_output_tokens=computed)


def _state(D, B, P, *, chunked, threshold, M, block_size=16, free=None, watermark_blocks=0,
           prompt_computed=0, W_extra=0, batched=None, L=4096, full_isl=True):
    batched = max(B, M, 13) if batched is None else batched
    num_gpu_blocks = 100 if watermark_blocks else 10000
    c = SchedulerConfig(max_num_batched_tokens=batched, max_num_scheduled_tokens=B, max_num_seqs=max(M, 1),
                        enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                        watermark=watermark_blocks / num_gpu_blocks, max_model_len=L, block_size=block_size,
                        num_gpu_blocks=num_gpu_blocks, scheduler_reserve_full_isl=full_isl)
    assert c.watermark_blocks == watermark_blocks
    reqs = {}
    blocks = {}
    running, waiting = [], []
    for i in range(D):
        computed = 1 + (3 * i) % 17  # varied, so some decodes cross a block boundary
        reqs[f"d{i}"] = _decode(i, computed)
        blocks[f"d{i}"] = cdiv(computed, block_size)
        running.append(f"d{i}")
    prompt = Request("prompt", P + prompt_computed, 4, arrival_time=float(D),
                     status=RequestStatus.RUNNING if prompt_computed else RequestStatus.WAITING,
                     num_computed_tokens=prompt_computed)
    reqs["prompt"] = prompt
    if prompt_computed:
        running.append("prompt")
        blocks["prompt"] = cdiv(prompt_computed, block_size)
    else:
        waiting.append("prompt")
    for j in range(W_extra):
        reqs[f"w{j}"] = Request(f"w{j}", 3, 4, arrival_time=float(D + 1 + j))
        waiting.append(f"w{j}")
    if free is None:
        free = c.num_usable_blocks - sum(blocks.values())
    return SchedulerState(config=c, requests=reqs, running=tuple(running), waiting=tuple(waiting), kv_cache=BlockCounts(free, blocks))


def _per_request(s: SchedulerState, prompt_computed: int) -> st.PerRequestState:
    c = s.config
    decodes = [st.Slot(s.requests[r].num_computed_tokens,
                       cdiv(s.requests[r].num_computed_tokens + 1, c.block_size)
                       - cdiv(s.requests[r].num_computed_tokens, c.block_size))
               for r in s.running if r != "prompt"]
    p = s.requests["prompt"]
    return st.PerRequestState(
        D=len(decodes), decodes=decodes, W=len(s.waiting), token_budget=c.token_budget,
        max_num_batched_tokens=c.max_num_batched_tokens, max_model_len=c.max_model_len,
        threshold=c.long_prefill_token_threshold, max_num_active_reqs=c.max_num_active_reqs,
        chunked=c.enable_chunked_prefill, reserve_full_isl=c.scheduler_reserve_full_isl,
        watermark_blocks=c.watermark_blocks, num_free_blocks=s.num_free_blocks,
        prompt_running=prompt_computed > 0, prompt_num_tokens=p.num_tokens,
        prompt_num_computed_tokens=p.num_computed_tokens)


def _check_against_spec(s: SchedulerState, prompt_computed: int, stats: dict, schedule=schedule) -> None:
    o = st.PyOps
    out, _ = schedule(s)
    grants = out.scheduled
    spec_prompt = grants.get("prompt", 0)
    spec_decodes = sum(n for r, n in grants.items() if r.startswith("d"))
    spec_preempted = bool(out.preempted_req_ids)
    pr_state = _per_request(s, prompt_computed)
    bs = s.config.block_size
    assert st.per_request_premises(o, pr_state, bs)
    pr = st.per_request_step(o, pr_state, bs)
    assert pr.prompt_tokens == spec_prompt
    assert pr.preempted == spec_preempted
    if not spec_preempted:
        assert pr.decode_tokens == spec_decodes
    else:  # what the per-request encoding assumes of the rest of a step with a preemption
        assert not out.admitted
    agg = st.aggregate_of(o, pr_state, bs)
    aout = st.aggregate_step(o, agg, st.AggChoice(pr.preempted, pr.decode_tokens, pr.prompt_alloc_ok))
    assert aout.choice_ok and aout.prompt_tokens == spec_prompt
    # the theorems' conclusions, read off the spec directly
    D, B, P = agg.D, st.step_budget(o, agg), agg.P
    c = s.config
    if not prompt_computed and D >= B:
        assert spec_prompt == 0
        stats["budget_exhausted"] += 1
    if not prompt_computed and D >= c.max_num_active_reqs:
        assert spec_prompt == 0
        stats["no_run_slot"] += 1
    premises = D < B and D < c.max_num_active_reqs and agg.enough_blocks
    if premises and c.enable_chunked_prefill:
        assert spec_prompt == min(P, st.chunk_cap(o, agg)) > 0
        assert not spec_preempted and spec_decodes == D
        stats["chunk_grant"] += 1
    if premises and not c.enable_chunked_prefill and not prompt_computed:
        need = st.capped_need(o, agg)
        assert (spec_prompt > 0) == (need <= B - D)
        if not st.threshold_in_force(o, agg):
            assert (spec_prompt > 0) == (P <= B - D)
        stats["chunked_off_admission"] += 1


def _grid(schedule=schedule, small=False):
    """All D <= 12, B <= 12, P <= 40, both chunked settings, with and without a
    threshold and a free run slot, a plentiful pool; the prompt's later chunks; the
    input budget binding; and tight pools (allocation failures, preemption, the
    watermark, the full-ISL gate) on a smaller grid.  `small`: a coarser grid."""
    stats = {k: 0 for k in ("budget_exhausted", "no_run_slot", "chunk_grant", "chunked_off_admission")}
    n = 0
    Ps = range(1, 41, 3) if small else range(1, 41)
    for D, B, P, chunked, threshold, slack in itertools.product(
            range(13), range(1, 13), Ps, (True, False), (0, 3), (0, 1)):
        s = _state(D, B, P, chunked=chunked, threshold=threshold, M=max(D + slack, 1))
        _check_against_spec(s, 0, stats, schedule)
        n += 1
    for D, B, P, computed, threshold in itertools.product(range(7), range(1, 10), range(2, 25), (1, 5), (0, 2)):
        if computed >= P:
            continue
        s = _state(D, B, P - computed, chunked=True, threshold=threshold, M=D + 2, prompt_computed=computed,
                   block_size=4)
        _check_against_spec(s, computed, stats, schedule)
        s = _state(D, B + 3, P, chunked=True, threshold=threshold, M=D + 2, batched=B, W_extra=1)
        _check_against_spec(s, 0, stats, schedule)
        n += 2
    for D, B, P, free, wm, bs, chunked, full_isl in itertools.product(
            range(6), range(1, 8), (1, 3, 6, 11), range(0, 5), (0, 2), (1, 4), (True, False), (True, False)):
        s = _state(D, B, P, chunked=chunked, threshold=0, M=D + 1, block_size=bs, free=free,
                   watermark_blocks=wm, full_isl=full_isl)
        _check_against_spec(s, 0, stats, schedule)
        n += 1
    return n, stats


def test_encodings_agree_with_the_spec_exhaustively():
    n, stats = _grid()
    assert n > 30000
    assert all(v > 500 for v in stats.values()), stats  # every theorem's premises were met often


S, K = "scheduler.py", "kv_cache.py"
# One-line rule changes in the spec the concrete comparison must notice.
M = Mutation
MUTANTS = {
    "chunk capped": [M("scheduler.num_new_tokens_waiting", "min(n, chunk_budget(s))", "min(n, chunk_budget(s), 2)")],
    "budget +1": [M("scheduler.num_new_tokens_waiting", "min(n, chunk_budget(s))", "min(n, chunk_budget(s) + 1)")],
    "no run-slot check": [M("scheduler.schedule_waiting", "len(s.running) < s.config.max_num_active_reqs", "True")],
    "chunked-off skip": [M("guards.stops_admission", "not s.config.enable_chunked_prefill and n > budget",
                           "not s.config.enable_chunked_prefill and n > budget + 1")],
    "decode cap 1 short": [M("scheduler.num_new_tokens_running", "chunk_budget(s)",
                             "min(s.token_budget - 1, s.input_budget - s.draft_slots)")],
    "admission after preemption": [M("scheduler.schedule", "not s.preempted", "True")],
    "threshold with one eligible": [M("config.long_prefill_threshold",
                                      "num_eligible <= 1 and has(c, LONG_PREFILL_THRESHOLD_NEEDS_TWO)", "False")],
    "watermark off": [M("kv_cache.allocate_slots", "config.watermark_blocks if admission else 0", "0")],
    "full-ISL gate off": [M("kv_cache.allocate_slots", "full + num_evictable_hit_blocks + watermark_blocks > num_free_blocks",
                            "False")],
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_concrete_comparison_catches_a_broken_rule(mutant):
    with mutated(MUTANTS[mutant]) as mod, pytest.raises(AssertionError):
        _grid(mod.schedule, small=True)


def test_prefill_takes_ceil_steps_on_the_spec():
    """Run schedule + update_from_output until the prompt's prefill completes."""
    checked = 0
    for D, B, P, threshold in itertools.product(range(6), range(1, 9), range(1, 21), (0, 2)):
        if D >= B:
            continue
        s = _state(D, B, P, chunked=True, threshold=threshold, M=D + 1)
        cap = B - D if not (threshold and D >= 1 and threshold < B - D) else threshold
        for k in itertools.count(1):
            out, s = schedule(s)
            assert s.requests["prompt"].num_computed_tokens == min(P, k * cap)
            assert len(s.running) == D + 1 and not out.preempted_req_ids
            sampled = {r: [7] for r, _ in out.num_scheduled_tokens
                       if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens}
            _, s = update_from_output(s, out, sampled)
            if "prompt" in sampled:
                break
        assert k == cdiv(P, cap)
        checked += 1
    assert checked > 300


def test_agreement_premises_are_satisfiable_at_the_bound():
    import z3

    o = st.Z3Ops()
    for bs in st.AGREEMENT_BLOCK_SIZES:
        s = st.per_request_vars(z3, DEFAULT)
        solver = z3.Solver()
        a = st.aggregate_of(o, s, bs)
        solver.add(st.per_request_premises(o, s, bs), st.agg_domain(z3, a), s.D == st.AGREEMENT_MAX_DECODES,
                   z3.Not(a.enough_blocks), s.prompt_running)
        assert solver.check() == z3.sat
