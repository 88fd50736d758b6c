"""The runtime monitor: each scheduler call vLLM makes, checked against the spec.

Transition checking, not mirroring.  For each call the monitor lifts vLLM's
state before it (reference/vllm_lift.py), lets vLLM make the call, runs the
spec's call on the lifted pre-state, and compares the two answers and the two
post-states (check.py).  With relift (peer-tests) nothing is carried from one
call to the next, so a test that changes the scheduler's internals by hand
between calls cannot put the monitor out of step: the next call is judged from
what vLLM then holds.  In an engine (relift off) a call starts from the last
one's post-state: the lifted one under the full check, the spec's own under the
incremental check, which reads from vLLM only what the call changed
(incremental.py) and compares in full every `full_every` calls and before
reporting anything (`Monitor.post_difference`).

Every call ends in exactly one of: *checked* (and maybe a divergence),
*outside scope* (a feature the spec does not model, named, scope.py; a KV
connector whose answers in the call changed what vLLM did, scope.ConnectorWatch;
or a difference in a call a test's spy may have changed, scope.is_spy), *vLLM
raised* (vLLM's exception goes on to its caller, nothing to compare), or a
*monitor error* (the lift, the spec or the comparison failed), kept apart from
divergences.  A monitor error never reaches vLLM's caller unless the policy is
`raise`: a monitored engine never stops serving because of schedspec.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import Counter, defaultdict
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from schedspec.reference.campaign import safe_stem
from schedspec.reference.vllm_lift import KV_ASYNC_ATTR, KV_CONNECTOR_ATTR, KV_SENDS_ATTR, LiftError, waiting_status, lift_config, lift_output, lift_request, \
    loads_in_flight, mark_held, \
    lift_state, lift_status, sampled_tokens
from schedspec.spec import scheduler as spec
from schedspec.spec import versions
from schedspec.spec.kv_connector import holds_kv_blocks
from schedspec.spec.state import SchedulerOutput

from . import incremental, scope
from .replay import LOG_ATTR, RunLog, replay_and_write, run_log
from .check import Difference, compare_finished, compare_outputs, compare_states, jsonable

POLICIES = ("raise", "log", "count")
CHECKS = ("full", "incremental")
FULL_EVERY = 256  # incremental check: a full lift and comparison every this many calls (docs/monitor.md)
SINCE_FULL_ATTR = "schedspec_since_full"  # on a vLLM scheduler: calls checked incrementally since the last full check
FULL_AT_ATTR = "schedspec_full_at"  # on a vLLM scheduler: the number of the last call a full check agreed on
POST_ATTR = "schedspec_post"  # on a vLLM scheduler: the last call's lifted post-state (relift off)
CALLS = ("schedule", "update_from_output", "add_request", "finish_requests")
log = logging.getLogger("schedspec.monitor")


class SpecDivergence(AssertionError):
    """vLLM's scheduler did something the spec does not allow (policy `raise`)."""


class MonitorError(RuntimeError):
    """The monitor itself failed on a call (re-raised only under policy `raise`)."""


class CallStats:
    """What the monitor saw under one label (a test, or a whole run)."""

    def __init__(self, incremental: bool = False) -> None:
        self.incremental = incremental  # the monitor checks incrementally: its figures are reported too
        self.calls = {c: Counter() for c in CALLS}
        self.outside_scope: Counter = Counter()
        self.divergences: list[dict[str, Any]] = []
        self.monitor_errors: list[dict[str, Any]] = []
        self.call_number = 0
        self.full_checks = 0  # incremental check: calls compared in full (periodic, confirming, or forced)
        # incremental check: differences its reads found that the confirming full lift did not
        # (a fault of the incremental reader, never reported as a divergence)
        self.unconfirmed: list[dict[str, Any]] = []

    def to_json(self) -> dict[str, Any]:
        out = {"calls": {c: {k: n.get(k, 0) for k in ("total", "checked", "outside_scope", "vllm_raised",
                                                         "monitor_error")} for c, n in self.calls.items()},
               "outside_scope": dict(sorted(self.outside_scope.items())),
               "divergences": list(self.divergences), "monitor_errors": list(self.monitor_errors)}
        if self.incremental:
            out["incremental"] = {"full_checks": self.full_checks, "unconfirmed": list(self.unconfirmed)}
        return out


class Monitor:
    """Counts, and on a divergence applies the policy: `raise` a SpecDivergence,
    `log` a warning and count it, or `count` it only.  With `vectors_dir`, each
    divergence is also written there as a state vector (docs/formats.md)."""

    def __init__(self, policy: str = "count", vectors_dir: str | Path | None = None, relift: bool = True,
                 record_all: bool = False, check: str = "full", full_every: int = FULL_EVERY):
        if policy not in POLICIES:
            raise ValueError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")
        # check: "full" lifts vLLM's whole post-state after every call and compares it;
        # "incremental" carries the spec's post-state to the next call and reads from
        # vLLM only what the call changed (incremental.py), with a full check every
        # `full_every` calls, on demand (check_fully_next) and before any divergence
        # is reported.  It needs relift off: it trusts that nothing but the
        # scheduler's own methods changed it between calls.
        if check not in CHECKS:
            raise ValueError(f"check: {check!r} is not one of {', '.join(CHECKS)}")
        if check == "incremental" and relift:
            raise ValueError("check: incremental carries the spec's state from call to call; it cannot relift")
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every: {full_every!r} is not a whole number of calls >= 1")
        self.check_mode, self.full_every, self.full_next = check, full_every, False
        self.policy = policy
        # relift: lift the pre-state of every call from vLLM (exact whatever ran
        # between calls).  Without it a call starts from the previous call's lifted
        # post-state, which is only right when nothing but scheduler methods touches
        # the scheduler between calls, as in an engine; any other public method
        # called in between forgets it (shadow.py).  vLLM's tests edit internals
        # by hand, so peer-tests relift.
        self.relift = relift
        # record_all: every checked call is written as a state vector, not only
        # divergences (a monitored run as test vectors for other implementations).
        if record_all and vectors_dir is None:
            raise ValueError("record_all: needs vectors_dir, the folder to write the vectors to")
        self.record_all = record_all
        self.vectors_dir = Path(vectors_dir) if vectors_dir is not None else None
        self.label = ""
        self.stats = CallStats(check == "incremental")
        self.totals = CallStats(check == "incremental")
        self.local = threading.local()  # calls in progress, so nested ones are not checked twice

    # -- labels ---------------------------------------------------------------

    def begin(self, label: str) -> None:
        """Attribute the calls from now on to `label` (e.g. a test's node id)."""
        self.label, self.stats = label, CallStats(self.check_mode == "incremental")

    def end(self) -> dict[str, Any]:
        """The current label's figures, as JSON; counting goes on under no label."""
        out = self.stats.to_json()
        self.label, self.stats = "", CallStats(self.check_mode == "incremental")
        return out

    def summary(self) -> dict[str, Any]:
        """Everything since the monitor was made."""
        return self.totals.to_json()

    # -- the check of one call -------------------------------------------------

    def run(self, call: str, sched: Any, original: Callable[[], Any],
            prepare: Callable[[], Any], judge: Callable[[Any, Any], Difference | None],
            features: Callable[[], tuple[str, ...]]) -> Any:
        """Run vLLM's `original()` between `prepare()` (before it: what the spec
        needs, e.g. the lifted pre-state) and `judge(prepared, result)` (after it)."""
        depth = getattr(self.local, "depth", 0)
        if depth:  # a call vLLM makes from inside another one: judged as part of it
            return original()
        self.local.depth = 1
        try:
            return self.check(call, sched, original, prepare, judge, features)
        finally:
            self.local.depth = 0

    def pre_state(self, sched: Any):
        """The state before a call: lifted, or the last call's post-state (lifted, or
        the spec's under the incremental check)."""
        if not self.relift:
            post = sched.__dict__.pop(POST_ATTR, None)
            if post is not None:
                return post
        # Read whole: as good as a full check after the call before.
        sched.__dict__[SINCE_FULL_ATTR], sched.__dict__[FULL_AT_ATTR] = 0, self.stats.call_number - 1
        return lift_state(sched)

    def check_fully_next(self) -> None:
        """Under the incremental check: compare the next call's post-state in full."""
        self.full_next = True

    def post_difference(self, sched: Any, p: "Prepared", spec_post, named: Any = (), gone=None,
                        full: bool = False):
        """The first difference between the spec's post-state `spec_post` and vLLM's
        after the call, or None; sets `p.observed_post`, the state the next call
        starts from (relift off).  `named`: the request ids vLLM's answer names;
        `gone`: check.hash_renaming's; `full`: compare in full whatever the check
        (the answers already differ: the report needs vLLM's whole state)."""
        suspected = None
        if self.check_mode == "incremental":
            since = sched.__dict__.get(SINCE_FULL_ATTR, 0) + 1
            if not (full or self.full_next or since >= self.full_every):
                suspected, carried = incremental.check_delta(sched, p.pre, spec_post, named, gone)
                if suspected is None:
                    sched.__dict__[SINCE_FULL_ATTR] = since
                    p.observed_post = carried
                    return None
        p.observed_post = lift_state(sched, p.pre.config, like=spec_post)
        difference = compare_states(p.pre, spec_post, p.observed_post, gone)
        if self.check_mode == "incremental":
            self.full_next = False
            sched.__dict__[SINCE_FULL_ATTR] = 0
            self.stats.full_checks += 1
            self.totals.full_checks += 1
            if difference is None:
                sched.__dict__[FULL_AT_ATTR] = self.stats.call_number
                if suspected is not None:  # the reader's fault, not vLLM's: said, never a divergence
                    record = {"test": self.label, "call": p.call, "call_number": self.stats.call_number,
                              **suspected.to_json()}
                    self.stats.unconfirmed.append(record)
                    self.totals.unconfirmed.append(record)
                    log.warning("schedspec: the incremental check of %s #%d read %s; the full lift agrees with the "
                                "spec", p.call, self.stats.call_number, suspected.describe())
        return difference

    def check(self, call, sched, original, prepare, judge, features):
        number = self.stats.call_number = self.stats.call_number + 1
        self.count(call, "total")
        prepared, outside, run = None, (), None
        if self.vectors_dir is not None:
            try:
                run = run_log(sched, lambda: lift_config(sched))
            except Exception:  # noqa: BLE001 - a scheduler the lift cannot read: no scenario, no harm
                sched.__dict__[LOG_ATTR] = None
        try:
            outside = features()
            if outside:
                sched.__dict__.pop(POST_ATTR, None)
            else:
                prepared = prepare()
        except Exception as e:  # noqa: BLE001 - the monitor never stops vLLM
            sched.__dict__.pop(POST_ATTR, None)
            self.monitor_error(call, number, e)
            return original()
        watch = scope.connector_watch(sched) if not outside else None
        replaced = scope.replacement_watch(sched) if not outside else None
        try:
            with watch or nullcontext(), replaced or nullcontext():
                result = original()
        except BaseException:
            sched.__dict__.pop(POST_ATTR, None)
            self.count(call, "vllm_raised")
            self.unrebuildable(sched, f"{call} #{number} raised in vLLM")
            raise
        if watch is not None or replaced is not None:
            # A connector is judged by what it answered in this call (scope.ConnectorWatch),
            # a replaced scheduler method by whether the call used it (scope.ReplacementWatch).
            outside = (watch.features(result) if watch else ()) + (replaced.features() if replaced else ())
            if outside:
                sched.__dict__.pop(POST_ATTR, None)
            elif watch is not None and watch.answered:
                prepared.external = dict(watch.external)
                self.unrebuildable(sched, f"{call} #{number}: a KV connector's answers are no scenario event")
        if outside:
            self.unrebuildable(sched, f"{call} #{number} is outside the spec's scope")
            self.count(call, "outside_scope")
            for f in outside:
                self.stats.outside_scope[f] += 1
                self.totals.outside_scope[f] += 1
            return result
        prepared.full_at = sched.__dict__.get(FULL_AT_ATTR)
        try:
            difference = judge(prepared, result)
        except Exception as e:  # noqa: BLE001
            sched.__dict__.pop(POST_ATTR, None)
            self.unrebuildable(sched, f"{call} #{number} met a monitor error")
            self.monitor_error(call, number, e)
            return result
        if not self.relift:
            sched.__dict__[POST_ATTR] = prepared.observed_post
        spies = scope.spied(sched) if difference is not None else ()
        if spies:
            # A spy that calls through may still have changed the step (a fault
            # injected once, scope.is_spy): its difference is not vLLM's, so the
            # call is counted outside scope, by name; an agreeing call is checked.
            log.debug("schedspec: %s #%d differs under spies %s: %s", call, number, spies, difference.describe())
            self.unrebuildable(sched, f"{call} #{number} was changed by a spy")
            self.count(call, "outside_scope")
            self.stats.outside_scope[scope.SPY_CHANGED_STEP] += 1
            self.totals.outside_scope[scope.SPY_CHANGED_STEP] += 1
            return result
        self.count(call, "checked")
        if run is not None and not run.broken:
            run.record(call, prepared)
        if difference is not None:
            self.divergence(call, number, difference, prepared, run)
        elif self.record_all:
            try:
                self.write_vector(call, number, None, prepared)
            except Exception as e:  # noqa: BLE001 - the call was checked; the file is extra
                self.monitor_error(call, number, e)
        return result

    def count(self, call: str, what: str) -> None:
        self.stats.calls[call][what] += 1
        self.totals.calls[call][what] += 1

    def monitor_error(self, call: str, number: int, e: BaseException) -> None:
        self.count(call, "monitor_error")
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        text = f"{type(e).__name__}: {e}" + (f" ({Path(where.filename).name}:{where.lineno})" if where else "")
        record = {"test": self.label, "call": call, "call_number": number, "error": text}
        self.stats.monitor_errors.append(record)
        self.totals.monitor_errors.append(record)
        log.warning("schedspec monitor error on %s #%d: %s", call, number, text)
        if self.policy == "raise":
            raise MonitorError(f"{call} #{number}: {text}") from e

    def unrebuildable(self, sched: Any, why: str) -> None:
        run = sched.__dict__.get(LOG_ATTR)
        if run is not None:
            run.stop(why)

    def divergence(self, call: str, number: int, difference: Difference, prepared: Any,
                   run: RunLog | None = None) -> None:
        record = {"test": self.label, "call": call, "call_number": number, **difference.to_json(), "vector": None}
        if self.check_mode == "incremental":
            # The pre-state was the spec's, carried since the last full check that agreed:
            # the run from there, not this call alone, is what differs.
            record["last_full_check"] = getattr(prepared, "full_at", None)
        if self.vectors_dir is not None:
            try:
                record["vector"] = str(self.write_vector(call, number, difference, prepared))
            except Exception as e:  # noqa: BLE001 - the divergence is still reported
                record["vector_error"] = f"{type(e).__name__}: {e}"
            record["scenario"] = None
            if run is None:
                record["scenario_note"] = "the monitor did not watch this scheduler from its start"
            else:
                try:
                    path, why = replay_and_write(run, safe_stem(f"{self.label or 'run'}-{number:05d}-{call}"),
                                                 self.vectors_dir)
                    record["scenario"], record["scenario_note"] = (str(path) if path else None), why
                except Exception as e:  # noqa: BLE001
                    record["scenario_note"] = f"rebuilding the scenario failed: {type(e).__name__}: {e}"
                run.stop("a divergence was reported; the rest of the run starts from a state the spec disagrees with")
        self.stats.divergences.append(record)
        self.totals.divergences.append(record)
        message = f"schedspec: vLLM's {call} #{number} diverges from the spec at {difference.describe()}"
        if self.policy == "raise":
            raise SpecDivergence(message)
        if self.policy == "log":
            log.warning("%s", message)

    def write_vector(self, call: str, number: int, difference: Difference | None, prepared: Any) -> Path:
        from schedspec.reference.vectors import make_vector, write_vector

        source = {"test": self.label, "call": call, "call_number": number}
        if difference is not None:
            source["difference"] = difference.to_json()
        vector = make_vector(prepared.pre, prepared.call_json(), source={"monitor": source})
        if difference is not None:
            vector["observed"] = prepared.observed_json()
        name = f"{self.label or 'run'}-{number:05d}-{call}"
        return write_vector(self.vectors_dir, name, vector)


# -- the four calls, as prepare / judge pairs ------------------------------------


class Prepared:
    """One call's pre-state and what the judge found, for a state vector."""

    def __init__(self, pre, call: str, **args):
        self.pre, self.call, self.args = pre, call, args
        self.observed_result: Any = None
        self.observed_post = None
        self.full_at: int | None = None  # incremental check: the last call a full check agreed on
        self.external: dict[str, int] = {}  # tokens a KV connector loaded in the call (scope.ConnectorWatch)

    def call_json(self) -> dict[str, Any]:
        from schedspec.reference.state_json import output_to_json, request_to_json
        from schedspec.reference.vectors import schedule_call, update_from_output_call

        a = self.args
        if self.call == "schedule":
            return schedule_call(a["throttle_prefills"])
        if self.call == "update_from_output":
            return update_from_output_call(a["output"], a["sampled"], a["finished_recving"], a["finished_sending"])
        if self.call == "add_request":
            return {"name": "add_request", "request": request_to_json(a["request"])}
        return {"name": "finish_requests", "request_ids": list(a["request_ids"]), "status": a["status"].name}

    def observed_json(self) -> dict[str, Any]:
        from schedspec.reference.state_json import output_to_json, state_to_json

        result = self.observed_result
        if isinstance(result, SchedulerOutput):
            result = {"output": output_to_json(result)}
        return {"result": jsonable(result), "post_state": state_to_json(self.observed_post)}


def schedule_check(monitor: Monitor, sched: Any, original: Callable[[], Any], throttle_prefills: bool,
                   preempted: list[str]) -> Any:
    """`schedule()`: the spec's decision on the lifted pre-state against vLLM's."""

    def features():
        return scope.features(sched, throttle_prefills=throttle_prefills) + scope.decode_stagger(sched)

    def prepare():
        pre = monitor.pre_state(sched)
        # 0.33.0's V2 model runner sends resumed requests as new ones (their status before
        # the call tells them apart); 0.34.0 has no such switch and sends them so always, as
        # its spec does (vllm_adapter.VllmScheduler.schedule).
        status_before = {rid: waiting_status(r) for rid, r in sched.requests.items()} \
            if getattr(sched, "use_v2_model_runner", False) else None
        if preempted:  # not a scenario event: the run cannot be rebuilt as a file from here on
            monitor.unrebuildable(sched, "a preemption outside schedule() (reset_prefix_cache or a direct call)")
        return Prepared(pre, "schedule", status_before=status_before, earlier=tuple(preempted),
                        throttle_prefills=throttle_prefills)

    def judge(p: Prepared, out):
        pre = p.pre
        vllm_out = lift_output(out, preempted, prefix_caching=pre.config.enable_prefix_caching,
                               status_before=p.args["status_before"], external=p.external,
                               holders=[w for w in pre.waiting if holds_kv_blocks(pre.requests[w])])
        earlier = p.args["earlier"]
        if earlier:
            # A preemption since the last schedule() (reset_prefix_cache, a direct
            # call) is reported in this output too (S:226, 1853), but was not this
            # call's decision: the lifted pre-state already holds its effect.  The
            # call is judged on the preemptions it made, in order, after those.
            if vllm_out.preempted_req_ids[:len(earlier)] != earlier:
                raise LiftError(f"preemptions before schedule() {list(earlier)} are not the first of "
                                f"{list(vllm_out.preempted_req_ids)}")
            vllm_out = replace(vllm_out, preempted_req_ids=vllm_out.preempted_req_ids[len(earlier):])
        # The KV connector's answers in this call are the spec's kv_connector_tokens (spec/kv_connector.py).
        p.pre = with_connector_answers(p.pre, sched)
        spec_out, spec_post = spec.schedule(p.pre, throttle_prefills)
        p.observed_result = vllm_out
        answer = compare_outputs(spec_out, vllm_out)
        named = [rid for rid, _ in vllm_out.num_scheduled_tokens] + list(vllm_out.preempted_req_ids) + list(earlier)
        state = monitor.post_difference(sched, p, spec_post, named, full=answer is not None)
        return answer or state

    try:
        return monitor.run("schedule", sched, original, prepare, judge, features)
    finally:
        preempted.clear()  # recording starts afresh for the next schedule()


def with_connector_answers(pre, sched: Any):
    """`pre` with each request's kv_connector_tokens, kv_connector_async and
    kv_connector_sends as its connector last answered, in the call just made (the
    pre-state was lifted before it asked; a request it finished may be gone from vLLM)."""
    if getattr(sched, "connector", None) is None:  # no answers: nothing asked (the common case, for free)
        return pre
    changed = {}
    for rid, r in pre.requests.items():
        v = sched.requests.get(rid)
        if v is None:
            continue
        answer = (v.__dict__.get(KV_CONNECTOR_ATTR, 0), v.__dict__.get(KV_ASYNC_ATTR, False),
                  v.__dict__.get(KV_SENDS_ATTR, False))
        if answer != (r.kv_connector_tokens, r.kv_connector_async, r.kv_connector_sends):
            changed[rid] = r.evolve(kv_connector_tokens=answer[0], kv_connector_async=answer[1],
                                    kv_connector_sends=answer[2])
    return replace(pre, requests={**pre.requests, **changed}) if changed else pre


def update_check(monitor: Monitor, sched: Any, original: Callable[[], Any], scheduler_output: Any,
                 model_runner_output: Any) -> Any:
    """`update_from_output()`: the sampled tokens applied by the spec and by vLLM."""
    ids = list(scheduler_output.num_scheduled_tokens)
    read: dict[str, dict] = {}  # the sampled tokens, read once, by features() (called before prepare())

    def features():
        extra = []
        if getattr(scheduler_output, "scheduled_spec_decode_tokens", None) and \
                not scope.newest_rules(versions.SPEC_DECODE):
            extra.append(scope.SPECULATIVE_DECODING)  # drafts verified: modelled from 0.33.0 on
        if getattr(model_runner_output, "pooler_output", None):
            extra.append(scope.POOLING)
        if scope.connector_output_acts(getattr(model_runner_output, "kv_connector_output", None), sched):
            extra.append(scope.KV_CONNECTOR)
        if getattr(model_runner_output, "ec_connector_output", None) is not None and \
                not scope.newest_rules(versions.ENCODER_INPUTS):
            # From 0.33.0: what it reports reaches scheduling only through the connector's own
            # answers, which the watch judges (scope.ConnectorWatch).
            extra.append(scope.EC_CONNECTOR)
        if getattr(sched, "grammar_compile_error_reqs", None) and not scope.newest_rules(versions.STRUCTURED_OUTPUT):
            extra.append(scope.STRUCTURED_OUTPUT)
        held = [sched.requests[rid] for rid in ids if rid in sched.requests]
        # The spec's grammar accepts every token; a real one may reject them (S:2488-2499).
        tokens = read["sampled"] = sampled_tokens(model_runner_output, ids)
        if any(getattr(r, "structured_output_request", None) is not None and tokens.get(r.request_id)
               for r in held):
            extra.append(scope.GRAMMAR_ACCEPTANCE)
        return tuple(dict.fromkeys(list(scope.features(sched, held)) + extra))

    def prepare():
        pre = monitor.pre_state(sched)
        drafts = getattr(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
        output = SchedulerOutput(num_scheduled_tokens=tuple(scheduler_output.num_scheduled_tokens.items()),
                                 scheduled_spec_decode_tokens=tuple((rid, tuple(d)) for rid, d in drafts.items()))
        held = {rid: sched.requests[rid] for rid in ids if rid in pre.requests}
        errors = {rid: sched.requests[rid] for rid in pre.grammar_compile_error_reqs
                  if rid in sched.requests and rid not in held}
        kv_out = getattr(model_runner_output, "kv_connector_output", None)
        return Prepared(pre, "update_from_output", output=output, held=held, errors=errors,
                        # In the order vLLM iterates the set (S:3716): several loads freed in
                        # one update reach the free queue in that order.
                        sampled=read["sampled"],
                        finished_recving=tuple(getattr(kv_out, "finished_recving", None) or ()),
                        finished_sending=tuple(getattr(kv_out, "finished_sending", None) or ()))

    def judge(p: Prepared, _result):
        finished = [(rid, lift_status(r.status)) for rid, r in p.args["held"].items() if r.is_finished()]
        # Then those finished for a failed grammar: vLLM takes them from a set, so
        # they are listed in the spec's order (S:2619-2641).
        finished += [(rid, lift_status(r.status)) for rid, r in p.args["errors"].items() if r.is_finished()]
        # The connector's answers at the finishes of this call are the spec's kv_connector_sends.
        p.pre = with_connector_answers(p.pre, sched)
        spec_finished, spec_post = spec.update_from_output(p.pre, p.args["output"], p.args["sampled"],
                                                           p.args["finished_recving"], p.args["finished_sending"])
        p.observed_result = {"finished": finished}
        answer = compare_finished(spec_finished, finished, "result.finished")
        named = [*p.args["held"], *p.args["errors"]]
        state = monitor.post_difference(sched, p, spec_post, named, finished_hashes(p, spec_finished),
                                        full=answer is not None)
        return answer or state

    return monitor.run("update_from_output", sched, original, prepare, judge, features)


def finished_hashes(p: Prepared, spec_finished) -> dict[str, tuple[tuple, tuple]]:
    """For each request the call finished, under prefix caching: its block hashes
    as the spec's rule extends them with the tokens it kept, and vLLM's request's
    own.  A block it completed in the call and freed is cached under that hash,
    which no request holds afterwards (check.hash_renaming)."""
    if not p.pre.config.enable_prefix_caching:
        return {}
    out = {}
    for rid, _ in spec_finished:
        r, v = p.pre.requests.get(rid), p.args["held"].get(rid)
        if r is not None and v is not None:
            mine = r.copy()
            spec.append_output_tokens(mine, p.args["sampled"].get(rid, ()), p.pre.config)
            out[rid] = (mine.block_hashes, tuple(v.block_hashes))
    return out


def add_request_check(monitor: Monitor, sched: Any, original: Callable[[], Any], request: Any) -> Any:
    """`add_request()`: the request joins the waiting queue as the spec says."""

    def features():
        found = scope.scheduler_features(sched)
        if found == [scope.HAND_ASSEMBLED]:
            return tuple(found)
        hbs = sched.hash_block_size if sched.kv_cache_manager.enable_caching else 0
        extra = [scope.STREAMING_INPUT] if request.request_id in sched.requests else []
        return tuple(dict.fromkeys(found + extra + list(scope.request_features(request, hbs))))

    def prepare():
        pre = monitor.pre_state(sched)
        return Prepared(pre, "add_request", request=lift_request(request, pre.config))

    def judge(p: Prepared, _result):
        spec_post = spec.add_request(p.pre, p.args["request"])
        p.observed_result = {}
        return monitor.post_difference(sched, p, spec_post, [request.request_id])

    return monitor.run("add_request", sched, original, prepare, judge, features)


def finish_check(monitor: Monitor, sched: Any, original: Callable[[], Any], request_ids: Any,
                 finished_status: Any) -> Any:
    """`finish_requests()`: vLLM walks the ids as a set (S:3115-3120), so the spec
    is given them in that set's order, which decides the free order."""

    def order():
        if isinstance(request_ids, str):
            return [request_ids]
        if request_ids is None:
            return list(sched.requests)
        return list(set(request_ids))

    def features():
        ids = order()
        found = scope.features(sched, [sched.requests[rid] for rid in ids if rid in sched.requests])
        # A request finished while its KV load is in flight keeps its blocks until
        # the load ends (S:3153-3164): modelled from 0.33.0 on (spec/kv_connector.py).
        if not scope.newest_rules(versions.KV_CONNECTOR) and loads_in_flight(sched, ids):
            found = tuple(dict.fromkeys(found + (scope.DELAYED_FREE,)))
        return found

    def call():
        # Those vLLM keeps for their load in flight: the lift holds them from now on.
        loading = loads_in_flight(sched, order())
        result = original()
        mark_held(sched, loading)
        return result

    def prepare():
        return Prepared(monitor.pre_state(sched), "finish_requests", request_ids=order(),
                        status=lift_status(finished_status))

    def judge(p: Prepared, result):
        done = [r.request_id for r in (result or ())]
        p.pre = with_connector_answers(p.pre, sched)  # its answers at these finishes: kv_connector_sends
        spec_done, spec_post = spec.finish_requests(p.pre, p.args["request_ids"], p.args["status"])
        p.observed_result = {"finished": done}
        answer = compare_finished(spec_done, done, "result.finished")
        state = monitor.post_difference(sched, p, spec_post, p.args["request_ids"], full=answer is not None)
        return answer or state

    return monitor.run("finish_requests", sched, call, prepare, judge, features)


def totals_by_call(stats: dict[str, Any]) -> dict[str, int]:
    """Calls checked and all calls, over the four calls of a stats dict."""
    out: dict[str, int] = defaultdict(int)
    for counts in stats["calls"].values():
        for k, n in counts.items():
            out[k] += n
    return dict(out)


__all__ = ["CALLS", "CHECKS", "FULL_EVERY", "CallStats", "Monitor", "MonitorError", "POLICIES", "Prepared", "SpecDivergence",
           "add_request_check", "finish_check", "schedule_check", "totals_by_call",
           "update_check"]
