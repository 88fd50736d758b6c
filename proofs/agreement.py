"""Evaluate the z3 encoding on concrete states and compare it with the spec.

`StepEvaluator` builds the symbolic step once (for a rule variant and a slot
bound), then for each concrete `SchedulerState` substitutes the values and reads
back every output field in the spec's own shapes, so a test can compare them
with what spec/scheduler.py computes (`spec_step`).
"""

from __future__ import annotations

from typing import Any, Mapping


from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.request import EOS_TOKEN_ID, RequestStatus
from schedspec.spec.kv_cache import BlockCounts
from schedspec.spec.state import SchedulerState
from schedspec.spec.versions import RESUMED_SENT_AS_NEW

from . import encoding
from .release import DEFAULT, Release
from .symbolic import Evaluator, SymConfig, SymState, slot_assignment, substitution

NON_EOS = 100


def spec_step(state: SchedulerState, output_len: Mapping[str, int | None], scheduler=spec_scheduler):
    """schedule + the fake model + update_from_output, in the comparison shape."""
    output, mid = scheduler.schedule(state)
    sampled = {}
    for rid, _ in output.num_scheduled_tokens:
        r = mid.requests[rid]
        if r.num_computed_tokens >= r.num_tokens:
            sampled[rid] = [EOS_TOKEN_ID if output_len.get(rid) == r.num_output_tokens + 1 else NON_EOS]
    finished, after = scheduler.update_from_output(mid, output, sampled)
    return {
        "num_scheduled_tokens": list(output.num_scheduled_tokens),
        "scheduled_new_reqs": list(output.scheduled_new_reqs),
        "scheduled_resumed_reqs": list(output.scheduled_resumed_reqs),
        "scheduled_running_reqs": list(output.scheduled_running_reqs),
        "preempted_req_ids": list(output.preempted_req_ids),
        "sampled": sorted(sampled),
        "finished": [(rid, int(st)) for rid, st in finished],
        **state_shape(after),
    }, (output, after)


def state_shape(s: SchedulerState) -> dict[str, Any]:
    return {
        "running": list(s.running),
        "waiting": list(s.waiting),
        "requests": {rid: (int(r.status), r.num_computed_tokens, r.num_output_tokens, r.num_preemptions,
                           s.num_blocks(rid))
                     for rid, r in sorted(s.requests.items())},
        "held": {rid: n for rid, n in sorted(s.req_to_num_blocks.items()) if n},
        "num_free_blocks": s.num_free_blocks,
    }


class StepEvaluator:
    def __init__(self, variant: str = "correct", max_running: int = 6, max_waiting: int = 6, extra_terms=None,
                 release: Release = DEFAULT):
        self.R, self.W = max_running, max_waiting
        self.running_slots = list(range(max_running))
        self.waiting_slots = list(range(max_running, max_running + max_waiting))
        self.before = SymState.fresh(max_running + max_waiting, "b", SymConfig.fresh("b.c", release=release))
        self.decision, self.after = encoding.schedule_update(
            self.before, variant, self.running_slots, self.waiting_slots)
        self.extra = list(extra_terms(self) if extra_terms else [])
        self.terms = self.decision.leaves() + [self.after.num_free_blocks]
        for s in self.after.slots:
            self.terms += s.leaves()
        self.eval = Evaluator(self.terms + self.extra)

    def fits(self, state: SchedulerState) -> bool:
        return len(state.running) <= self.R and len(state.waiting) <= self.W

    def pairs(self, state: SchedulerState, output_len):
        slot_of = slot_assignment(state, self.running_slots, self.waiting_slots)
        return slot_of, substitution(self.before, state, slot_of, output_len)

    def evaluate(self, state: SchedulerState, output_len: Mapping[str, int | None]):
        slot_of, pairs = self.pairs(state, output_len)
        vals = self.eval(pairs)
        extra = vals[len(self.terms):]
        vals = vals[:len(self.terms)]
        N = len(self.before.slots)
        d = {}
        i = 0
        for name in self.decision.__dataclass_fields__:
            d[name] = vals[i:i + N]
            i += N
        free = vals[i]
        i += 1
        width = len(self.after.slots[0].leaves())
        fields = list(self.after.slots[0].__dataclass_fields__)
        slot_vals = [dict(zip(fields, vals[i + k * width: i + (k + 1) * width])) for k in range(N)]
        rid_of = {v: k for k, v in slot_of.items()}

        def ordered(flag, key):
            return [rid_of[s] for s in sorted((s for s in range(N) if d[flag][s] and s in rid_of),
                                               key=lambda s: d[key][s])]

        grants = ordered("scheduled", "grant_seq")
        # The encoding marks an admission from PREEMPTED; the output lists it as the release
        # sends it: among the new requests from 0.34.0 (versions.RESUMED_SENT_AS_NEW).
        as_new = self.before.config.release.applies(RESUMED_SENT_AS_NEW)
        new = [r for r in ordered("admitted", "grant_seq") if as_new or not d["resumed"][slot_of[r]]]
        resumed = [r for r in ordered("admitted", "grant_seq") if not as_new and d["resumed"][slot_of[r]]]
        out = {
            "num_scheduled_tokens": [(r, d["num_scheduled_tokens"][slot_of[r]]) for r in grants],
            "scheduled_new_reqs": new,
            "scheduled_resumed_reqs": resumed,
            "scheduled_running_reqs": [r for r in ordered("from_running", "grant_seq")],
            "preempted_req_ids": ordered("preempted", "preempt_seq"),
            "sampled": sorted(rid_of[s] for s in range(N) if d["sampled"][s] and s in rid_of),
            "finished": [(r, d["finish_status"][slot_of[r]]) for r in ordered("finished", "grant_seq")],
        }
        present = {rid_of[s]: v for s, v in enumerate(slot_vals) if v["present"] and s in rid_of}
        out["running"] = [r for r, v in sorted(present.items(), key=lambda kv: kv[1]["pos"]) if v["running"]]
        out["waiting"] = [r for r, v in sorted(present.items(), key=lambda kv: kv[1]["pos"]) if not v["running"]]
        out["requests"] = {r: (v["status"], v["num_computed_tokens"], v["num_output_tokens"], v["num_preemptions"],
                               v["num_blocks"]) for r, v in sorted(present.items())}
        out["held"] = {r: v[4] for r, v in out["requests"].items() if v[4]}
        out["num_free_blocks"] = free
        # Positions must be dense 0..len-1 in each queue, or the order above hides a defect.
        for flag in (True, False):
            ps = sorted(v["pos"] for v in present.values() if v["running"] == flag)
            if ps != list(range(len(ps))):
                out["positions_not_dense"] = ps
        return out, extra


def to_spec_step(before: SchedulerState, got: dict):
    """The evaluated encoding's step as spec objects (SchedulerOutput, state after),
    so the Python predicates can judge the encoding's own step."""
    from schedspec.spec.state import SchedulerOutput

    out = SchedulerOutput(
        num_scheduled_tokens=tuple(got["num_scheduled_tokens"]), scheduled_new_reqs=tuple(got["scheduled_new_reqs"]),
        scheduled_resumed_reqs=tuple(got["scheduled_resumed_reqs"]),
        scheduled_running_reqs=tuple(got["scheduled_running_reqs"]), preempted_req_ids=tuple(got["preempted_req_ids"]))
    reqs = {}
    for rid, (status, ncomp, nout, npre, _) in got["requests"].items():
        reqs[rid] = before.requests[rid].evolve(status=RequestStatus(status), num_computed_tokens=ncomp,
                                                num_output_tokens=nout, num_preemptions=npre)
    after = SchedulerState(config=before.config, requests=reqs, running=tuple(got["running"]), waiting=tuple(got["waiting"]), kv_cache=BlockCounts(got["num_free_blocks"], dict(got["held"])))
    return out, after


def formula_terms(ev: "StepEvaluator") -> list:
    """(applicable, holds) of every property formula, then every invariant formula
    on the state after, for StepEvaluator(extra_terms=...)."""
    from .property_formulas import INVARIANT_FORMULAS, PROPERTY_FORMULAS

    terms = []
    for f in PROPERTY_FORMULAS.values():
        terms += list(f(ev.before, ev.decision, ev.after))
    terms += [f(ev.after) for f in INVARIANT_FORMULAS.values()]
    return terms


# --- add_request, abort and the all-roles step, on any slot assignment ----------------------------


def read_state(sym_vals: list[dict], free: int, rid_of: Mapping[int, str]) -> dict[str, Any]:
    """The comparison shape of a symbolic state's evaluated slots (`state_shape`),
    plus `positions_not_dense` when a queue's positions are not 0..len-1."""
    present = {rid_of[s]: v for s, v in enumerate(sym_vals) if v["present"] and s in rid_of}
    stray = [s for s, v in enumerate(sym_vals) if v["present"] and s not in rid_of]
    by_pos = sorted(present.items(), key=lambda kv: kv[1]["pos"])
    out: dict[str, Any] = {
        "running": [r for r, v in by_pos if v["running"]],
        "waiting": [r for r, v in by_pos if not v["running"]],
        "requests": {r: (v["status"], v["num_computed_tokens"], v["num_output_tokens"], v["num_preemptions"],
                         v["num_blocks"]) for r, v in sorted(present.items())},
    }
    out["held"] = {r: v[4] for r, v in out["requests"].items() if v[4]}
    out["num_free_blocks"] = free
    for flag in (True, False):
        ps = sorted(v["pos"] for v in present.values() if v["running"] == flag)
        if ps != list(range(len(ps))):
            out["positions_not_dense"] = ps
    if stray:
        out["present_without_request"] = stray
    return out


class _StateReader:
    """Evaluates a symbolic state (and extra terms) under a substitution."""

    def __init__(self, before: SymState, after: SymState, extra: list | None = None):
        self.before, self.after = before, after
        self.width = len(after.slots[0].leaves())
        self.fields = list(after.slots[0].__dataclass_fields__)
        self.extra = list(extra or [])
        terms = [after.num_free_blocks]
        for s in after.slots:
            terms += s.leaves()
        self.n_state = len(terms)
        self.eval = Evaluator(terms + self.extra)

    def read(self, pairs, rid_of) -> tuple[dict, list]:
        vals = self.eval(pairs)
        free, rest = vals[0], vals[1:self.n_state]
        slots = [dict(zip(self.fields, rest[k * self.width:(k + 1) * self.width])) for k in range(len(self.after.slots))]
        return read_state(slots, free, rid_of), vals[self.n_state:]


class AddEvaluator:
    """encoding.add_request over `n` slots, any of which may hold a running or a
    waiting request (the all-roles form the add_request obligation uses)."""

    def __init__(self, n: int = 8, variant: str = "correct", release: Release = DEFAULT):
        from .symbolic import SymSlot

        self.n = n
        self.before = SymState.fresh(n, "ab", SymConfig.fresh("ab.c", release=release))
        self.new = SymSlot.fresh("ab.new")
        self.slot = n - 1
        self.after = encoding.add_request(self.before, self.slot, self.new, True, variant)
        self.reader = _StateReader(self.before, self.after)

    def evaluate(self, state: SchedulerState, request, slot_of: Mapping[str, int]) -> dict:
        """The state after adding `request` (a spec Request) to `state`, whose
        requests sit in slots `slot_of` (never slot n-1, which the new one takes)."""
        from .symbolic import const_val, dense_rank

        ids = list(state.requests) + [request.request_id]
        arrivals = [r.arrival_time for r in state.requests.values()] + [request.arrival_time]
        pairs = substitution(self.before, state, dict(slot_of), {}, all_ids=[request.request_id],
                             all_arrivals=[request.arrival_time])
        rid_rank, arr_rank = dense_rank(ids), dense_rank(arrivals)
        for f, v in dict(rid_rank=rid_rank[request.request_id], num_prompt_tokens=request.num_prompt_tokens,
                         max_tokens=request.max_tokens, output_len=0, priority=request.priority,
                         arrival=arr_rank[request.arrival_time], present=True, running=False, pos=0,
                         status=int(request.status), num_computed_tokens=0, num_output_tokens=0,
                         num_preemptions=0, num_blocks=0).items():
            pairs.append((getattr(self.new, f), const_val(v)))
        rid_of = {v: k for k, v in slot_of.items()}
        rid_of[self.slot] = request.request_id
        got, _ = self.reader.read(pairs, rid_of)
        return got


class AbortEvaluator:
    """encoding.abort of slot 0 over `n` all-roles slots."""

    def __init__(self, n: int = 8, variant: str = "correct", release: Release = DEFAULT):
        self.n = n
        self.before = SymState.fresh(n, "ob", SymConfig.fresh("ob.c", release=release))
        self.after = encoding.abort(self.before, 0, True, variant)
        self.reader = _StateReader(self.before, self.after)

    def evaluate(self, state: SchedulerState, slot_of: Mapping[str, int]) -> dict:
        """The state after aborting the request in slot 0 (`slot_of` must put one there)."""
        pairs = substitution(self.before, state, dict(slot_of), {})
        got, _ = self.reader.read(pairs, {v: k for k, v in slot_of.items()})
        return got


class AllRolesStepEvaluator(StepEvaluator):
    """The step over `n` slots that may each hold a running or a waiting request
    (schedule_update with running_slots = waiting_slots = all: the form the BMC
    witnesses use), on a slot assignment the caller chooses."""

    def __init__(self, n: int = 6, variant: str = "correct", release: Release = DEFAULT):
        self.R = self.W = n
        self.running_slots = self.waiting_slots = list(range(n))
        self.before = SymState.fresh(n, "ar", SymConfig.fresh("ar.c", release=release))
        self.decision, self.after = encoding.schedule_update(self.before, variant)
        self.extra = []
        self.terms = self.decision.leaves() + [self.after.num_free_blocks]
        for s in self.after.slots:
            self.terms += s.leaves()
        self.eval = Evaluator(self.terms)
        self.slot_of: dict[str, int] | None = None

    def fits(self, state: SchedulerState) -> bool:
        return len(state.requests) <= self.R

    def pairs(self, state: SchedulerState, output_len):
        slot_of = self.slot_of if self.slot_of is not None else {rid: i for i, rid in enumerate(state.requests)}
        return slot_of, substitution(self.before, state, slot_of, output_len)
