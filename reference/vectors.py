"""State vectors (docs/formats.md, "State vectors"): one JSON file per scheduler
transition, which any implementation in any language can replay.

A vector holds the scheduler's state before one call (`pre_state`), the call,
what the specification returns (`expected`) and its state afterwards
(`post_state`); a divergence written by a monitor also holds what the
implementation under test did (`observed`).  Replaying one: set the
implementation to `pre_state`, make the call, compare its result with
`expected` and its state with `post_state`.

    make_vector(pre_state, call, *, source) -> dict       the spec on one call, as a vector
    apply_call(state, call) -> (result_json, post_state)   the spec on one call
    write_vector(directory, name, vector) -> Path          a fresh file, never overwriting
    read_vector(path) -> dict                              parsed and validated (schema + rules)
    validate_vector(obj) -> None                           the same checks on parsed JSON
    check_vector(vector, impl) -> list[str]                an implementation's differences
    export_campaign(directory, scenarios, impl_name="spec", ...) -> int
        run scenarios with the engine, one vector per scheduler call

A call in JSON is built with `schedule_call()`, `add_request_call(request)`,
`finish_requests_call(ids, status)` and `update_from_output_call(output,
sampled)`.  Every error about a vector's content is a `VectorError`, a
ValueError with a one-line message naming the JSON path of the bad field.
"""

from __future__ import annotations

import codecs
import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from .errors import shown
from schedspec.spec import scheduler as spec_scheduler
from schedspec.spec.config import ConfigError, excerpt, field_path
from schedspec.spec.output import SchedulerOutput
from schedspec.spec.request import Request, RequestStatus
from schedspec.spec.state import SchedulerState
from schedspec.spec.versions import DEFAULT_RELEASE

from .campaign import safe_stem
from .engine import run_scenario
from .impl import SpecScheduler, StateLoadable, takes_finished_recving, takes_finished_sending
from .scenario import Scenario
from .state_json import (LEGACY_RELEASE, STATUS_NAMES, StateJsonError, index_path, output_from_json, output_to_json, read_bool,
                         read_list, read_object, read_str, read_str_list, request_from_json, request_to_json,
                         sampled_from_json, sampled_to_json, state_from_json, state_to_json, status_from_json,
                         status_to_json)
from .strict_json import (TYPE_WORDS, DuplicateKeys, Refused, StrictValidator, fast_valid, is_json_integer, object_pairs,
                          refuse_constant)

VECTOR_FORMAT = "schedspec.state-vector/1"
VLLM_VERSION = DEFAULT_RELEASE  # what a config that names no release models
SCHEMA_PATH = Path(__file__).parent / "schemas" / "state-vector.schema.json"
CALL_NAMES = ("add_request", "finish_requests", "schedule", "update_from_output")
# A vector holds two whole states, with prefix caching every prompt's token ids
# twice: a scenario at the prompt-token bound of formats.md comes to tens of MiB.
MAX_VECTOR_BYTES = 256 * 2**20
# Differences listed per vector before "... and N more".
MAX_DIFFERENCES = 20


class VectorError(ValueError):
    """A vector (or a file meant to be one) that cannot be read or replayed;
    the message is one line and names the file and field where it can."""


# --- calls ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One scheduler call, decoded: `name` and the arguments that call takes."""

    name: str
    request: Request | None = None  # add_request
    request_ids: tuple[str, ...] = ()  # finish_requests
    status: RequestStatus | None = None  # finish_requests
    output: SchedulerOutput | None = None  # update_from_output
    sampled_token_ids: Mapping[str, list[int]] | None = None  # update_from_output
    finished_recving: tuple[str, ...] = ()  # update_from_output: KV loads the worker reports finished
    finished_sending: tuple[str, ...] = ()  # update_from_output: KV sends the worker reports finished
    throttle_prefills: bool = False  # schedule: a data-parallel engine's off-cadence step


def schedule_call(throttle_prefills: bool = False) -> dict[str, Any]:
    """`throttle_prefills` is written only when true: vectors from before it read alike."""
    return {"name": "schedule", **({"throttle_prefills": True} if throttle_prefills else {})}


def add_request_call(request: Request) -> dict[str, Any]:
    return {"name": "add_request", "request": request_to_json(request)}


def finish_requests_call(request_ids: Iterable[str], status: RequestStatus) -> dict[str, Any]:
    return {"name": "finish_requests", "request_ids": list(request_ids), "status": status_to_json(status)}


def update_from_output_call(output: SchedulerOutput, sampled_token_ids: Mapping[str, Sequence[int]],
                            finished_recving: Iterable[str] = (), finished_sending: Iterable[str] = ()
                            ) -> dict[str, Any]:
    """`finished_recving` and `finished_sending` are written only when some load or send
    finished: vectors from before them read alike."""
    return {"name": "update_from_output", "output": output_to_json(output),
            "sampled_token_ids": sampled_to_json(sampled_token_ids),
            **({"finished_recving": list(finished_recving)} if finished_recving else {}),
            **({"finished_sending": list(finished_sending)} if finished_sending else {})}


_CALL_FIELDS = {
    "schedule": ("name", "throttle_prefills"),
    "add_request": ("name", "request"),
    "finish_requests": ("name", "request_ids", "status"),
    "update_from_output": ("name", "output", "sampled_token_ids", "finished_recving", "finished_sending"),
}
_OPTIONAL_CALL_FIELDS = {"schedule": ("throttle_prefills",),
                         "update_from_output": ("finished_recving", "finished_sending")}


def call_from_json(obj: Any, where: str = "call") -> Call:
    raw = read_object(obj, where, ("name",))
    name = raw["name"]
    if name not in _CALL_FIELDS:
        raise StateJsonError(field_path(where, "name"), f"= {excerpt(name)}, must be one of {', '.join(CALL_NAMES)}")
    optional = _OPTIONAL_CALL_FIELDS.get(name, ())
    read_object(raw, where, tuple(f for f in _CALL_FIELDS[name] if f not in optional), _CALL_FIELDS[name])
    f = lambda key: field_path(where, key)  # noqa: E731 - the path of one field
    if name == "add_request":
        return Call(name, request=request_from_json(raw["request"], f("request")))
    if name == "finish_requests":
        status = status_from_json(raw["status"], f("status"))
        if not status.is_finished:
            raise StateJsonError(f("status"), f"= {excerpt(raw['status'])}, must be a finished status: "
                                              + ", ".join(n for n in STATUS_NAMES if RequestStatus[n].is_finished))
        return Call(name, request_ids=read_str_list(raw["request_ids"], f("request_ids")), status=status)
    if name == "update_from_output":
        return Call(name, output=output_from_json(raw["output"], f("output")),
                    sampled_token_ids=sampled_from_json(raw["sampled_token_ids"], f("sampled_token_ids")),
                    finished_recving=read_str_list(raw.get("finished_recving", []), f("finished_recving")),
                    finished_sending=read_str_list(raw.get("finished_sending", []), f("finished_sending")))
    return Call(name, throttle_prefills=read_bool(raw.get("throttle_prefills", False), f("throttle_prefills")))


def call_to_json(call: Call) -> dict[str, Any]:
    if call.name == "add_request":
        return add_request_call(call.request)
    if call.name == "finish_requests":
        return finish_requests_call(call.request_ids, call.status)
    if call.name == "update_from_output":
        return update_from_output_call(call.output, call.sampled_token_ids, call.finished_recving,
                                       call.finished_sending)
    return schedule_call(call.throttle_prefills)


def result_to_json(name: str, value: Any) -> dict[str, Any]:
    """A call's return value in the vector's `expected` form."""
    if name == "schedule":
        return {"output": output_to_json(value)}
    if name == "update_from_output":
        return {"finished": [[rid, status_to_json(status)] for rid, status in value]}
    if name == "finish_requests":
        return {"finished": [str(rid) for rid in value]}
    return {}


def result_from_json(name: str, obj: Any, where: str) -> Any:
    """Check a result's shape for call `name`; the decoded value."""
    if name == "schedule":
        raw = read_object(obj, where, ("output",), ("output",))
        return output_from_json(raw["output"], field_path(where, "output"))
    if name == "update_from_output":
        raw = read_object(obj, where, ("finished",), ("finished",))
        out = []
        p = field_path(where, "finished")
        for i, pair in enumerate(read_list(raw["finished"], p)):
            q = index_path(p, i)
            if not isinstance(pair, list) or len(pair) != 2:
                raise StateJsonError(q, f"must be a pair [request id, status name], got {excerpt(pair)}")
            out.append((read_str(pair[0], index_path(q, 0)), status_from_json(pair[1], index_path(q, 1))))
        return tuple(out)
    if name == "finish_requests":
        raw = read_object(obj, where, ("finished",), ("finished",))
        return read_str_list(raw["finished"], field_path(where, "finished"))
    read_object(obj, where, (), ())
    return None


# --- the spec on one call ---------------------------------------------------------------------


def run_spec(state: SchedulerState, call: Call) -> tuple[Any, SchedulerState]:
    """The spec's pure functions on one decoded call: (return value, post-state)."""
    if call.name == "schedule":
        return spec_scheduler.schedule(state, call.throttle_prefills)
    if call.name == "add_request":
        return None, spec_scheduler.add_request(state, call.request)
    if call.name == "finish_requests":
        return spec_scheduler.finish_requests(state, call.request_ids, call.status)
    return spec_scheduler.update_from_output(state, call.output, call.sampled_token_ids, call.finished_recving,
                                             call.finished_sending)


def apply_call(state: SchedulerState, call: Mapping[str, Any]) -> tuple[dict[str, Any], SchedulerState]:
    """The spec on one call (its JSON form): the result as `expected` holds it,
    and the state after.  VectorError when the call cannot be read or the spec
    refuses it on this state (a duplicate request id, a state it cannot hold)."""
    try:
        decoded = call_from_json(call)
    except StateJsonError as e:
        raise VectorError(str(e)) from None
    try:
        value, post = run_spec(state, decoded)
    except (ConfigError, AssertionError, KeyError, IndexError, ValueError) as e:
        raise VectorError(f"call: the spec cannot apply {decoded.name} to this pre-state: "
                          f"{type(e).__name__}: {shown(str(e), 200)}") from None
    return result_to_json(decoded.name, value), post


def vector_json(pre_state: SchedulerState, call: Mapping[str, Any], expected: Mapping[str, Any],
                post_state: SchedulerState, source: Mapping[str, Any]) -> dict[str, Any]:
    """A vector from its parts; `format` first, as readers that sniff files expect."""
    # The release the spec modelled: the pre-state's (spec/versions.py).
    return {"format": VECTOR_FORMAT, "vllm_version": pre_state.config.vllm_version, "source": dict(source),
            "pre_state": state_to_json(pre_state), "call": dict(call), "expected": dict(expected),
            "post_state": state_to_json(post_state)}


def make_vector(pre_state: SchedulerState, call: Mapping[str, Any], *, source: Mapping[str, Any]) -> dict[str, Any]:
    """The vector of `call` on `pre_state`: the spec gives `expected` and `post_state`."""
    expected, post = apply_call(pre_state, call)
    return vector_json(pre_state, call_to_json(call_from_json(call)), expected, post, source)


# --- files ------------------------------------------------------------------------------------


def _scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)


def _one_line_list(v: Any) -> bool:
    """Lists of scalars and lists of short scalar lists (pairs) go on one line."""
    return _scalar_list(v) or (isinstance(v, list) and all(_scalar_list(x) and len(x) <= 2 for x in v))


def dumps_vector(obj: Any, indent: int = 0) -> str:
    """JSON, one key per line, but lists of ids, token ids and pairs on one line:
    a state stays readable without a line per token."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dumps_vector(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and not _one_line_list(obj):
        return "[\n" + ",\n".join(inner + dumps_vector(v, indent + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, separators=(", ", ": "))


def write_vector(directory: str | Path, name: str, vector: Mapping[str, Any]) -> Path:
    """Write `vector` to directory/<name>.json, or to <name>-2.json, -3, ... when
    that exists: never over a file.  The folder is created if needed."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = safe_stem(name)
    text = dumps_vector(vector) + "\n"
    k = 1
    while True:
        p = d / (f"{stem}.json" if k == 1 else f"{stem}-{k}.json")
        try:
            with open(p, "x", encoding="utf-8") as f:  # "x": fails rather than replace a file made meanwhile
                f.write(text)
            return p
        except FileExistsError:
            k += 1


def json_path(parts: Sequence[Any]) -> str:
    """A JSON path as the messages write it: `pre_state.requests.r3`, `[0]` for an index."""
    out = ""
    for p in parts:
        out = index_path(out, p) if isinstance(p, int) else field_path(out, p)
    return out


def _check_parsed(data: Any) -> None:
    """Refused values and duplicate keys, in document order, without recursion."""
    stack = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, Refused):
            raise VectorError(f"{json_path(path) or 'the top level'}: {value.message}")
        if isinstance(value, DuplicateKeys):
            raise VectorError(f"{json_path(path + (value.duplicate,))}: the key appears more than once in one "
                              "object; give each key once")
        if isinstance(value, dict):
            stack.extend((v, path + (k,)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(value))))


def parse_vector_bytes(raw: bytes) -> Any:
    """The JSON value of a vector file: UTF-8 (a BOM is skipped), strict JSON."""
    if len(raw) > MAX_VECTOR_BYTES:
        raise VectorError(f"larger than {MAX_VECTOR_BYTES // 2**20} MiB, the most a vector file may be")
    try:
        text = raw.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as e:
        raise VectorError(f"not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start}") from None
    try:
        data = json.loads(text, object_pairs_hook=object_pairs, parse_constant=refuse_constant)
    except json.JSONDecodeError as e:
        raise VectorError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits; absurd nesting
        raise VectorError(f"not accepted as JSON: {shown(str(e), 120)}") from None
    _check_parsed(data)
    return data


_Validator = StrictValidator  # integers exclude 4.0 and true (strict_json.py)


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with every `#/$defs/...` reference replaced by its target.
    The vector schema has no recursion, and jsonschema resolving references
    took half of the validation time."""
    defs = schema.get("$defs", {})

    def walk(x: Any) -> Any:
        if isinstance(x, list):
            return [walk(v) for v in x]
        if not isinstance(x, dict):
            return x
        out = {k: walk(v) for k, v in x.items() if k not in ("$ref", "$defs")}
        if "$ref" in x:
            target = walk(defs[x["$ref"].removeprefix("#/$defs/")])
            if set(target) & set(out) - {"description"}:
                return {"allOf": [target], **out}
            return {**target, **out}
        return out

    return walk(schema)


@lru_cache(maxsize=1)
def schema_validator():
    """The validator of schemas/state-vector.schema.json, integers strict."""
    return _Validator(inline_refs(json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))))



def schema_error_text(e: jsonschema.ValidationError) -> str:
    """One schema error as `path: problem`, in the words of the other readers."""
    path = list(e.absolute_path)
    v, want, got = e.validator, e.validator_value, e.instance
    if v == "type":
        kinds = want if isinstance(want, list) else [want]
        problem = f"must be {' or '.join(TYPE_WORDS.get(k, k) for k in kinds)}, got {excerpt(got)}"
    elif v == "required":
        path.append(next((k for k in want if k not in got), want[0]))
        problem = "missing; this field is required"
    elif v == "additionalProperties" and want is False:
        known = list(e.schema.get("properties", {}))
        path.append(next((k for k in got if k not in known), "?"))
        problem = f"unknown field; known fields are {', '.join(known)}" if known else "must be empty"
    elif v == "minimum":
        problem = f"must be an integer >= {want}, got {excerpt(got)}" if is_json_integer(None, want) \
            else f"= {excerpt(got)}, must be >= {want}"
    elif v in ("maximum", "exclusiveMaximum"):
        problem = f"= {excerpt(got)}, must be {'<=' if v == 'maximum' else '<'} {want}"
    elif v == "const":
        problem = f"= {excerpt(got)}, must be {json.dumps(want)}"
    elif v == "enum":
        problem = f"= {excerpt(got)}, must be one of {', '.join(map(str, want))}"
    elif v == "pattern":
        problem = f"= {excerpt(got)} does not match {want} ({e.schema.get('description', 'the format')})"
    elif v in ("minItems", "maxItems"):
        problem = f"= {excerpt(got)} must have {'at least' if v == 'minItems' else 'at most'} {want} items"
    else:
        problem = f"{excerpt(' '.join(e.message.split()), 120)} (schema rule {v!r})"
    return f"{json_path(path) or 'the top level'}: {problem}"


def _error_order(e: jsonschema.ValidationError):
    return [(0, p) if isinstance(p, int) else (1, str(p)) for p in e.absolute_path]


def _at(obj: Any, path: Iterable[Any]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def validate_vector(obj: Any) -> None:
    """The JSON Schema, then the rules a schema cannot say (state_json.py's
    readers on every state, the call and each result); VectorError names the
    first bad field."""
    validator = schema_validator()
    errors = [] if fast_valid(validator.schema, obj) else sorted(validator.iter_errors(obj), key=_error_order)
    if errors:
        e = errors[0]
        holder = _at(obj, e.absolute_path)
        if isinstance(holder, dict) and isinstance(e.instance, str) and e.instance in holder \
                and e.validator == "pattern":
            # A `propertyNames` error: it sits at the object and is about one of its keys.
            raise VectorError(f"{json_path(list(e.absolute_path)) or 'the top level'}: the key "
                              f"{excerpt(e.instance)} does not match {e.validator_value} "
                              f"({e.schema.get('description', 'the format')})")
        raise VectorError(schema_error_text(e))
    try:
        pre = state_from_json(obj["pre_state"], "pre_state")
        if pre.config.vllm_version != obj["vllm_version"]:
            raise VectorError(f"vllm_version: = {excerpt(obj['vllm_version'])}, but pre_state.config models vLLM "
                              f"{pre.config.vllm_version} (its vllm_version, default {LEGACY_RELEASE}); they must agree")
        call = call_from_json(obj["call"])
        result_from_json(call.name, obj["expected"], "expected")
        state_from_json(obj["post_state"], "post_state")
        if "observed" in obj:
            result_from_json(call.name, obj["observed"]["result"], "observed.result")
            state_from_json(obj["observed"]["post_state"], "observed.post_state")
    except StateJsonError as e:
        raise VectorError(str(e)) from None


def read_vector(path: str | Path) -> dict[str, Any]:
    """A vector file, parsed and validated; VectorError is one line starting with the path."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_VECTOR_BYTES + 1)
    except OSError as e:
        raise VectorError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = parse_vector_bytes(raw)
        validate_vector(data)
    except VectorError as e:
        raise VectorError(f"{path}: {e}") from None
    return data


def vector_files(paths: Iterable[str | Path]) -> list[Path]:
    """Every vector file the paths name: a file as given, a folder's *.json files
    at any depth, in name order."""
    out: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.json") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise VectorError(f"{given}: no such file or folder")
    return out


# --- checking an implementation --------------------------------------------------------------


def implementation_name(impl: Any) -> str:
    return str(getattr(impl, "name", type(impl).__name__))


def can_load_state(impl: Any) -> bool:
    return isinstance(impl, StateLoadable) and callable(impl.load_state)


def require_load_state(impl: Any) -> None:
    if not can_load_state(impl):
        raise VectorError(f"implementation {implementation_name(impl)} cannot be set to a given state: it has no load_state()")


def invoke(impl: Any, call: Call) -> Any:
    """The call on a stateful implementation (reference/impl.py's protocol)."""
    if call.name == "schedule":
        if call.throttle_prefills:
            if "throttle_prefills" not in inspect.signature(impl.schedule).parameters:
                raise VectorError(f"call.throttle_prefills: implementation {implementation_name(impl)}'s "
                                  "schedule() takes no throttle_prefills argument")
            return impl.schedule(throttle_prefills=True)
        return impl.schedule()
    if call.name == "add_request":
        return impl.add_request(call.request)
    if call.name == "finish_requests":
        return impl.finish_requests(list(call.request_ids), call.status)
    # The call's output is the one to apply: an implementation that schedules
    # differently still gets the spec's batch.
    reports = {}
    for field, takes in (("finished_recving", takes_finished_recving), ("finished_sending", takes_finished_sending)):
        if getattr(call, field):
            if not takes(impl):
                raise VectorError(f"call.{field}: implementation {implementation_name(impl)}'s "
                                  f"update_from_output() takes no {field} argument")
            reports[field] = getattr(call, field)
    return impl.update_from_output(call.output, call.sampled_token_ids, **reports)


def diff_json(expected: Any, got: Any, path: str = "") -> list[str]:
    """Where `got` differs from `expected`, as `path: expected X, got Y` lines:
    a short value (a queue, a pair) whole, a long one field by field."""
    if expected == got and type(expected) is type(got) or (
            _is_number(expected) and _is_number(got) and expected == got):
        return []
    if isinstance(expected, dict) and isinstance(got, dict):
        out = []
        for k, v in expected.items():
            p = field_path(path, k)
            out += [f"{p}: missing, expected {excerpt(v, 80)}"] if k not in got else diff_json(v, got[k], p)
        out += [f"{field_path(path, k)}: unexpected, got {excerpt(v, 80)}" for k, v in got.items() if k not in expected]
        return out
    short = len(json.dumps(expected, default=str)) <= 120 and len(json.dumps(got, default=str)) <= 120
    if isinstance(expected, list) and isinstance(got, list) and not short:
        if len(expected) != len(got):
            return [f"{path}: expected {len(expected)} items, got {len(got)}"]
        out = []
        for i, (a, b) in enumerate(zip(expected, got)):
            out += diff_json(a, b, index_path(path, i))
        return out
    return [f"{path or 'the top level'}: expected {_shown_json(expected)}, got {_shown_json(got)}"]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shown_json(v: Any) -> str:
    text = json.dumps(v, default=str)
    return text if len(text) <= 160 else text[:160] + "\u2026"


def canonical_state(state: Any) -> Any:
    """A state's JSON with a block pool's free queue spelt one way: all of it in
    `free_front`.  The spec keeps never-used blocks as the range `next_fresh ..
    num_gpu_blocks - 1`; a state lifted from vLLM lists them; both are one queue."""
    if not isinstance(state, dict) or not isinstance(state.get("kv_cache"), dict):
        return state
    kv = state["kv_cache"]
    if kv.get("kind") != "blocks" or kv.get("next_fresh") == kv.get("num_gpu_blocks"):
        return state
    try:
        queue = list(kv["free_front"]) + list(range(kv["next_fresh"], kv["num_gpu_blocks"])) + list(kv["free_back"])
    except (KeyError, TypeError):
        return state  # not a pool this can respell: compared as it is
    return {**state, "kv_cache": {**kv, "free_front": queue, "next_fresh": kv["num_gpu_blocks"], "free_back": []}}


def compare_answer(expected: Any, post_state: Any, result: Any, observed_post: Any) -> list[str]:
    """An answer's differences from the vector's, named by the vector's fields."""
    found = diff_json({"expected": expected, "post_state": canonical_state(post_state)},
                      {"expected": result, "post_state": canonical_state(observed_post)})
    if len(found) > MAX_DIFFERENCES:
        found = found[:MAX_DIFFERENCES] + [f"... and {len(found) - MAX_DIFFERENCES} more"]
    return found


def check_vector(vector: Mapping[str, Any], impl: Any) -> list[str]:
    """Set `impl` to the vector's pre-state (its `load_state`), make the call and
    compare the result with `expected` and its state (`observe()`) with
    `post_state`: the differences, empty when it agrees.  A crash of the
    implementation is a difference.  VectorError when `impl` has no load_state()
    or the vector cannot be read."""
    require_load_state(impl)
    try:
        pre = state_from_json(vector["pre_state"], "pre_state")
        call = call_from_json(vector["call"])
    except StateJsonError as e:
        raise VectorError(str(e)) from None
    except KeyError as e:
        raise VectorError(f"{e.args[0]}: missing; this field is required") from None
    name = implementation_name(impl)
    stage = "load_state()"
    try:
        impl.load_state(pre)
        stage = f"{call.name}()"
        value = invoke(impl, call)
        stage = f"the result of {call.name}()"
        result = result_to_json(call.name, value)
        stage = "observe()"
        post = state_to_json(impl.observe())
    except Exception as e:  # noqa: BLE001 - the implementation under test may raise anything: a difference
        return [f"{name} failed in {stage}: {type(e).__name__}: {shown(str(e), 200)}"]
    return compare_answer(vector.get("expected"), vector.get("post_state"), result, post)


# --- export: one vector per scheduler call of a run -----------------------------------------


class ExportError(RuntimeError):
    """The implementation being recorded failed; the message is one line."""


class Recorder:
    """Wraps an implementation for the engine (reference/engine.py) and writes one
    vector per scheduler call it passes on.  With the spec, its own answer is the
    vector's; with another implementation the spec computes `expected` from the
    implementation's pre-state, and where they differ `observed` says what the
    implementation did."""

    def __init__(self, impl: Any, directory: Path, source: Mapping[str, Any]):
        self.impl = impl
        self.name = implementation_name(impl)
        self.directory = directory
        self.source = dict(source)
        self.is_spec = type(impl) is SpecScheduler  # a subclass may answer differently
        self.step = 0  # the engine step the next call belongs to (set through `at_step`)
        self.calls = 0
        if takes_finished_recving(impl) and takes_finished_sending(impl):  # async KV loads, KV sends
            self.update_from_output = self._update_with_reports
        elif takes_finished_recving(impl):  # async KV loads
            self.update_from_output = self._update_with_loads
        self.written: list[Path] = []

    def at_step(self, step: int, total: int | None = None) -> None:
        """run_scenario's progress callback: told the next step before its calls."""
        self.step = step

    def reset(self, config):
        return self.impl.reset(config)

    def observe(self):
        return self.impl.observe()

    def close(self) -> None:
        pass  # the caller owns the implementation

    def _record(self, call: dict[str, Any], run: Callable[[], Any]) -> Any:
        pre = self.impl.observe()
        try:
            value = run()
        except Exception as e:  # noqa: BLE001 - said in one line, with where
            raise ExportError(f"{self.name} failed in {call['name']}() (call {self.calls} of scenario "
                              f"{self.source.get('scenario')!r}): {type(e).__name__}: {shown(str(e), 200)}") from None
        post = self.impl.observe()
        source = {**self.source, "step": self.step, "call": self.calls}
        result = result_to_json(call["name"], value)
        if self.is_spec:
            vector = vector_json(pre, call, result, post, source)
        else:
            vector = make_vector(pre, call, source=source)
            observed = {"result": result, "post_state": state_to_json(post)}
            if compare_answer(vector["expected"], vector["post_state"], observed["result"], observed["post_state"]):
                vector["observed"] = observed
        self.written.append(write_vector(self.directory, f"{self.calls:05d}-{call['name']}", vector))
        self.calls += 1
        return value

    def add_request(self, request):
        return self._record(add_request_call(request), lambda: self.impl.add_request(request))

    def finish_requests(self, request_ids, status):
        ids = list(request_ids)
        return self._record(finish_requests_call(ids, status), lambda: self.impl.finish_requests(ids, status))

    def schedule(self):
        return self._record(schedule_call(), self.impl.schedule)

    def update_from_output(self, output, sampled_token_ids):
        return self._record(update_from_output_call(output, sampled_token_ids),
                            lambda: self.impl.update_from_output(output, sampled_token_ids))

    def _update_with_loads(self, output, sampled_token_ids, finished_recving=()):
        return self._record(update_from_output_call(output, sampled_token_ids, finished_recving),
                            lambda: self.impl.update_from_output(output, sampled_token_ids,
                                                                 finished_recving=finished_recving))

    def _update_with_reports(self, output, sampled_token_ids, finished_recving=(), finished_sending=()):
        return self._record(update_from_output_call(output, sampled_token_ids, finished_recving, finished_sending),
                            lambda: self.impl.update_from_output(output, sampled_token_ids,
                                                                 finished_recving=finished_recving,
                                                                 finished_sending=finished_sending))

    def update_draft_token_ids(self, draft_token_ids):
        """Passed on, not written: the state vector format has no call for the drafter
        yet; the next vector's pre-state holds the drafts it set."""
        update = getattr(self.impl, "update_draft_token_ids", None)
        if update is None:
            raise ExportError(f"{self.name} does not model speculative decoding (no update_draft_token_ids)")
        update(draft_token_ids)

    def grammar_compiled(self, request_ids, failed=False):
        """Passed on, not written, as the drafter's call: the next vector's pre-state
        holds where each grammar stands."""
        compiled = getattr(self.impl, "grammar_compiled", None)
        if compiled is None:
            raise ExportError(f"{self.name} does not model structured output (no grammar_compiled)")
        compiled(request_ids, failed)


def fresh_folder(parent: Path, name: str) -> Path:
    """parent/<safe name>, or -2, -3, ... when that exists: a folder of its own."""
    stem = safe_stem(name)
    k = 1
    while True:
        d = parent / (stem if k == 1 else f"{stem}-{k}")
        try:
            d.mkdir(parents=True)
            return d
        except FileExistsError:
            k += 1


def export_campaign(directory: str | Path, scenarios: Iterable[Scenario], impl_name: str = "spec", *,
                    impl: Any = None, on_scenario: Callable[[int, int], None] | None = None) -> int:
    """Run each scenario on the engine (formats.md) and write one vector per
    scheduler call to directory/<scenario name>/<NNNNN>-<call>.json, NNNNN the
    call's number in the run.  `impl` (default: the implementation `impl_name`
    names, loaded with no arguments) is the one run; the spec gives each
    vector's `expected`.  `on_scenario(done, vectors_so_far)` after each
    scenario.  A scenario whose config the implementation rejects makes no
    call and no folder.  The number of vectors written."""
    if impl is None:
        if impl_name == "spec":
            impl = SpecScheduler()
        else:
            from .loader import load_impl

            impl = load_impl(impl_name)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for done, scenario in enumerate(scenarios, 1):
        source = {"kind": "scenario", "scenario": scenario.name, "implementation": impl_name}
        if scenario.description:
            source["description"] = scenario.description
        folder = fresh_folder(out, scenario.name)
        rec = Recorder(impl, folder, source)
        run_scenario(scenario, rec, progress=rec.at_step)
        if not rec.written:
            folder.rmdir()  # ours and empty: made just above
        count += len(rec.written)
        if on_scenario is not None:
            on_scenario(done, count)
    return count


__all__ = [
    "CALL_NAMES", "Call", "ExportError", "canonical_state", "compare_answer", "MAX_DIFFERENCES", "Recorder", "VECTOR_FORMAT", "VLLM_VERSION",
    "VectorError", "add_request_call", "apply_call", "call_from_json", "call_to_json", "can_load_state",
    "check_vector", "diff_json", "dumps_vector", "export_campaign", "finish_requests_call", "fresh_folder",
    "implementation_name", "invoke", "json_path", "make_vector", "parse_vector_bytes", "read_vector", "require_load_state",
    "result_from_json", "result_to_json", "run_spec", "schedule_call", "schema_error_text", "schema_validator",
    "update_from_output_call", "validate_vector", "vector_files", "vector_json", "write_vector",
]
