"""The fields of a scenario file besides its config, in one table: JSON type, schedspec's bounds, meaning.

The config's fields are spec/config.py's table (SchedulerConfig); these are the
rest of docs/formats.md's `schedspec.scenario/1`: the top level, a request, an
encoder item, an abort.  From this table come the scenario JSON Schema's parts
for them (`field_schema`, written by scripts/write-scenario-schema.py), the
reader's structural check with its one-line errors (`check_field`, which the
reader and `check_bounds` share) and the bounds table of docs/formats.md
(`bounds_table`).

Bounds here are schedspec's (vLLM has none): the torch implementation keeps token
counts in int32, and every integer up to 2**53 is exact in a float.  A lower end
left out (`minimum` None) is vLLM's own check (spec/input_processor.py, through
`validate_scenario`), with vLLM's message; `vllm_minimum` only names it in the docs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from schedspec.spec.config import CONFIG_TABLE, INT32_MAX, MAX_DRAFTS_BOUND, TYPE_WORDS, excerpt, unknown_field

TOKENS_BOUND = 2**30 - 1  # a prompt's tokens, as the torch implementation's int32 sums allow
ARRIVAL_TIME_BOUND = 2**53  # |arrival_time|; every integer up to it is exact in a float
MAX_PATTERN_LEN = 4096  # entries of a speculative-decoding pattern
BOUND = "(schedspec's bound, docs/formats.md)"


@dataclass(frozen=True)
class Field:
    """One field of a scenario file (an object's key, or an array's entries)."""

    name: str
    kind: str  # its JSON type: integer, number, string, boolean, array or object
    nullable: bool = False  # null allowed too
    required: bool = False
    minimum: int | None = None  # schedspec's least value; None: none, or vLLM's own check
    maximum: int | None = None  # schedspec's bound
    min_size: int | None = None  # a string's characters or an array's entries
    max_size: int | None = None
    const: str | None = None  # the one value allowed
    items: Field | None = None  # an array's entries
    fields: tuple[Field, ...] | None = None  # an object's fields; None: checked elsewhere (the config)
    doc: str = ""  # what it means (the JSON Schema's description)
    vllm_minimum: int | None = None  # the docs' bracketed lower end: vLLM's own check
    rule: str = ""  # the docs: what `schedspec validate` checks beside the bounds

    @property
    def json_types(self) -> str | list[str]:
        return [self.kind, "null"] if self.nullable else self.kind

    @cached_property
    def by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields or ()}

    @cached_property
    def plain_types(self) -> frozenset[type]:
        """The Python types of the values it takes, those of JSON's parser (a fast yes;
        `_IS_KIND` decides the rest)."""
        return frozenset(_PLAIN_TYPES[self.kind] + ((type(None),) if self.nullable else ()))


def _int(name: str, lo: int | None, hi: int, **kw: Any) -> Field:
    return Field(name, "integer", minimum=lo, maximum=hi, **kw)


def _pattern(name: str, doc: str) -> Field:
    return Field(name, "array", min_size=1, max_size=MAX_PATTERN_LEN, doc=doc,
                 items=_int("", 0, MAX_DRAFTS_BOUND, rule="≤ `config.num_speculative_tokens`"))


MM_FEATURE = Field("", "object", fields=(
    _int("offset", 0, TOKENS_BOUND, required=True),
    _int("length", 1, TOKENS_BOUND, required=True),
    Field("identifier", "string", required=True, min_size=1, max_size=256),
))

REQUEST = Field("", "object", fields=(
    Field("id", "string", required=True, min_size=1, rule="unique"),
    _int("arrival_step", 0, INT32_MAX - 1, rule="non-decreasing, < `max_steps`"),
    _int("prompt_len", None, TOKENS_BOUND, required=True, vllm_minimum=1, rule="< `config.max_model_len`"),
    Field("max_tokens", "integer", nullable=True, maximum=INT32_MAX, vllm_minimum=1),
    Field("output_len", "integer", nullable=True, minimum=1, maximum=INT32_MAX),
    _int("priority", -2**31, INT32_MAX),
    Field("arrival_time", "number", minimum=-ARRIVAL_TIME_BOUND, maximum=ARRIVAL_TIME_BOUND),
    Field("prefix_group", "string", nullable=True, min_size=1),
    _int("prefix_len", 0, TOKENS_BOUND, rule="≤ `prompt_len`", doc=(
        "Prompt tokens shared with the requests of the same prefix_group; a non-zero prefix_len without a "
        "prefix_group is refused by `schedspec validate`.")),
    Field("prompt_token_ids", "array", nullable=True, items=_int("", 0, INT32_MAX), doc=(
        "An explicit prompt of prompt_len ids, not with prefix_group; `schedspec validate` refuses the fake "
        "model's output ids 2 (EOS) and 100 in it.")),
    _pattern("num_draft_tokens", (
        "speculative decoding: drafts the fake drafter proposes for this request each time, cycled (default "
        "[num_speculative_tokens]); each <= config.num_speculative_tokens")),
    _int("lora_int_id", 0, INT32_MAX, doc=(
        "LoRA: the request's adapter, 0 (the default) for none; needs config.max_loras")),
    _int("grammar_compile_steps", 0, INT32_MAX, doc=(
        "structured output: the request has a grammar, which finishes compiling this many steps after its "
        "arrival step, before that step's schedule(); until then it waits (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR). "
        "Absent: no grammar")),
    _int("kv_connector_tokens", 0, TOKENS_BOUND, rule="< `prompt_len`", doc=(
        "KV connector: a remote store holds the request's first this many prompt tokens; at an admission from "
        "zero computed tokens the connector loads those beyond the local prefix hit, within the step. Must be < "
        "prompt_len; vLLM 0.33.0 only (default 0: none)")),
    _int("kv_connector_load_steps", 1, INT32_MAX, doc=(
        "KV connector: the held tokens load asynchronously; the request waits for them (WAITING_FOR_REMOTE_KVS) "
        "holding their blocks, and the worker reports the load finished to the update_from_output of the engine "
        "step this many steps after the one that started it, minus one (1: the same step), or the first one "
        "after. Needs kv_connector_tokens; such a request cannot be aborted; vLLM 0.33.0 only (absent: a load "
        "within the step)")),
    _int("kv_connector_send_steps", 1, INT32_MAX, doc=(
        "KV connector: the connector sends the request's KV once it finishes (a KV producer's request, as in "
        "disaggregated prefill); vLLM keeps its blocks until the worker reports the send, to the "
        "update_from_output of the engine step this many steps after the one it finished in, or the first one "
        "after; vLLM 0.33.0 only (absent: its blocks are freed when it finishes)")),
    Field("mm_features", "array", max_size=8, items=MM_FEATURE, doc=(
        "encoder inputs: the prompt's multimodal items (at most 8), by offset and apart: placeholder tokens "
        "[offset, offset + length), each one embedding, encoded whole in the step a chunk first reaches them; "
        "items with one identifier are the same item (one length), sharing the encoder cache and prefix-cache "
        "keys; vLLM 0.33.0 only (default []: none)")),
    Field("grammar_error", "boolean", doc=(
        "structured output: the grammar fails to compile, and the request is finished with an error "
        "(finish_reason error); needs grammar_compile_steps (default false)")),
    _pattern("num_accepted_tokens", (
        "speculative decoding: drafts the fake model accepts each time the request verifies some, cycled, at "
        "most those scheduled (default [num_speculative_tokens]: all)")),
))

ABORT = Field("", "object", fields=(
    Field("id", "string", required=True),
    _int("step", 0, INT32_MAX, required=True, rule="> the request's `arrival_step`"),
))

SCENARIO = Field("", "object", fields=(
    Field("format", "", required=True, const="schedspec.scenario/1"),
    Field("name", "string", required=True, min_size=1),
    Field("description", "string"),
    Field("config", "object"),  # spec/config.py's table
    Field("requests", "array", required=True, items=REQUEST),
    Field("aborts", "array", items=ABORT),
    _int("max_steps", 1, INT32_MAX),
))
REQUEST_FIELDS = tuple(REQUEST.by_name)


# --- the JSON Schema --------------------------------------------------------------------


def field_schema(f: Field, open_schema: Callable[[Field], dict] | None = None) -> dict[str, Any]:
    """The JSON Schema of field `f`; `open_schema` gives that of an object the table
    leaves to another (the config)."""
    if f.const is not None:
        return {"const": f.const}
    if f.kind == "object" and f.fields is None:
        return open_schema(f) if open_schema else {"type": "object"}
    out: dict[str, Any] = {"type": f.json_types}
    for key, value in (("minimum", f.minimum), ("maximum", f.maximum)):
        if value is not None:
            out[key] = value
    word = {"string": "Length", "array": "Items"}.get(f.kind)
    for key, value in (("min", f.min_size), ("max", f.max_size)):
        if value is not None:
            out[key + word] = value
    if f.doc:
        out["description"] = f.doc
    if f.items is not None:
        out["items"] = field_schema(f.items, open_schema)
    if f.fields is not None:
        required = [g.name for g in f.fields if g.required]
        if required:
            out["required"] = required
        out["additionalProperties"] = False
        out["properties"] = {g.name: field_schema(g, open_schema) for g in f.fields}
    return out


# --- the check --------------------------------------------------------------------------


class FieldProblem(ValueError):
    """A value that does not meet its field's row: where (a path of keys and
    indices) and what, in the format's words."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path, self.message = path, message


_PLAIN_TYPES = {"integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,), "array": (list,),
                "object": (dict,), "": ()}
_IS_KIND = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _size_problem(f: Field, value: Any) -> str | None:
    n = len(value)
    if (f.min_size is None or n >= f.min_size) and (f.max_size is None or n <= f.max_size):
        return None
    if f.kind == "string":
        if n == 0:
            return f"= {excerpt(value)}, must not be empty"
        return f"= {excerpt(value)} holds {n} characters, must hold at most {f.max_size} {BOUND}"
    hold = f"{f.min_size} to {f.max_size}" if f.min_size is not None else f"at most {f.max_size}"
    return f"holds {n} entries, must hold {hold} {BOUND}"


def value_problem(f: Field, value: Any) -> str | None:
    """What is wrong with `value` itself (not its entries or fields) as field `f`:
    its type, bounds or size; None when nothing."""
    if f.const is not None:
        return None if value == f.const and isinstance(value, str) else f"= {excerpt(value)}, must be {f.const!r}"
    if type(value) in f.plain_types:
        if value is None:
            return None
    elif value is None and f.nullable:
        return None
    elif not _IS_KIND[f.kind](value):
        kinds = [f.kind, "null"] if f.nullable else [f.kind]
        return f"must be {' or '.join(TYPE_WORDS[k] for k in kinds)}, got {excerpt(value)}"
    if f.minimum is not None and not value >= f.minimum:
        return f"= {excerpt(value)}, must be >= {f.minimum}"
    if f.maximum is not None and not value <= f.maximum:
        return f"= {excerpt(value)}, must be <= {f.maximum} {BOUND}"
    if f.min_size is not None or f.max_size is not None:
        return _size_problem(f, value)
    return None


def check_field(f: Field, value: Any, path: tuple = (), open_check: Callable | None = None) -> None:
    """FieldProblem for the first field of `value` (as field `f`) that does not meet the
    table, in the order of their paths (keys by name, entries by index), a field's own
    problem before its entries': what the JSON Schema's first error names.  An object the
    table leaves to another (the config) goes to `open_check(value, path)`."""
    problem = value_problem(f, value)
    if problem is not None:
        raise FieldProblem(path, problem)
    if f.items is not None and value is not None:
        items = f.items
        if items.kind == "integer" and items.minimum is not None and items.maximum is not None:
            lo, hi = items.minimum, items.maximum  # token ids, up to 2**22 of them: one pass
            if all(type(v) is int and lo <= v <= hi for v in value):
                return
        for i, v in enumerate(value):
            check_field(items, v, path + (i,), open_check)
    elif f.kind == "object" and value is not None:
        if f.fields is None:
            if open_check is not None:
                open_check(value, path)
            return
        known = f.by_name
        for g in f.fields:
            if g.required and g.name not in value:
                raise FieldProblem(path + (g.name,), "missing; this field is required")
        for key in value:
            if key not in known:
                raise FieldProblem(path + (key,), unknown_field(key, known))
        for key in sorted(value):
            g = known[key]
            if g.items is None and g.kind != "object":  # a plain value: no call deeper
                problem = value_problem(g, value[key])
                if problem is not None:
                    raise FieldProblem(path + (key,), problem)
            else:
                check_field(g, value[key], path + (key,), open_check)


# --- docs/formats.md's bounds table ----------------------------------------------------


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def figure(n: int) -> str:
    """`n` as the docs write it: digits in groups of three, and near a power of two, as one."""
    sign = "−" if n < 0 else ""
    if abs(n) < 10**4:
        return f"{sign}{abs(n)}"
    digits = f"{abs(n):,}".replace(",", " ")
    for less, text in ((0, ""), (1, " − 1"), (2, " − 2")):
        k = (abs(n) + less).bit_length() - 1
        if abs(n) + less == 2**k:
            return f"{sign}{digits} ({sign}2{str(k).translate(_SUPERSCRIPT)}{text})"
    return f"{sign}{digits}"


def _range(kind: str, lo: int | None, vllm_lo: int | None, hi: int | None, nullable: bool, rule: str) -> str:
    if lo is None and vllm_lo is None and hi is None:
        return rule  # vLLM's range alone, bracketed
    lower = f"{figure(lo)} … " if lo is not None else f"[≥ {figure(vllm_lo)}] … " if vllm_lo is not None else "… "
    text = lower + (figure(hi) if hi is not None else "")
    if kind == "number":
        text += " (finite)"
    if nullable:
        text += ", or null"
    return f"{text} (and {rule})" if rule else text


def _rows(f: Field, where: str) -> list[tuple[str, str]]:
    out = []
    for g in f.fields or ():
        name = f"{where}{g.name}"
        if g.maximum is not None:
            out.append((name, _range(g.kind, g.minimum, g.vllm_minimum, g.maximum, g.nullable, g.rule)))
        if g.max_size is not None:
            lo = f"{g.min_size} … " if g.min_size is not None else "… "
            out.append((name, f"{lo}{figure(g.max_size)} {'characters' if g.kind == 'string' else 'entries'}"))
        if g.items is not None and g.items.kind == "object":
            out += _rows(g.items, f"{name}[].")
        elif g.items is not None:
            i = g.items
            out.append((f"{name}[]", _range(i.kind, i.minimum, None, i.maximum, False, i.rule)))
    return out


def bounds_table(cached_prompt_tokens: int) -> str:
    """docs/formats.md's table of bounds (scripts/write-scenario-schema.py writes it there):
    the config's integer fields from its table, then the rest of the file's from this one."""
    rows = [(f"config.{r.name}", _range(r.kind, None, r.minimum, r.maximum, r.nullable, r.rule))
            for r in CONFIG_TABLE.values() if r.maximum is not None or r.rule]
    rows += _rows(SCENARIO, "")
    rows.append(("sum of `prompt_len` over the requests, with `config.enable_prefix_caching: true`",
                 f"… {figure(cached_prompt_tokens)}"))
    lines = ["| field | range |", "|---|---|"]
    lines += [f"| {name if name.startswith('sum') else f'`{name}`'} | {text} |" for name, text in rows]
    return "\n".join(lines) + "\n"


__all__ = ["ABORT", "ARRIVAL_TIME_BOUND", "Field", "FieldProblem", "MM_FEATURE", "REQUEST", "REQUEST_FIELDS",
           "SCENARIO", "bounds_table", "check_field", "field_schema", "figure", "value_problem"]
