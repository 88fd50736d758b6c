"""Scenario files (formats.md, `schedspec.scenario/1`): load, validate, save.

A file is read in three passes, each with one-line errors that name the field
(`config.max_num_seqs`, `requests[3].prompt_len`, `aborts[0].step`, `max_steps`)
and quote the bad value cut to a short excerpt:

1. bytes to JSON: at most MAX_FILE_BYTES, UTF-8, strict JSON (no NaN or
   Infinity, no duplicate keys, integers of at most MAX_INT_DIGITS digits,
   nesting at most MAX_DEPTH deep);
2. the tables of fields, from which the published JSON Schema
   (reference/schemas/scenario.schema.json) is generated, with the same verdicts:
   types (an integer field takes a JSON integer only: 4.0 and 1e30 are not
   integers) and schedspec's size bounds.  The `config` object by the config
   table (spec/config.py `config_from_json`): the scenario holds the typed
   SchedulerConfig it states, built once; the rest by reference/scenario_fields.py,
   whose check `check_bounds` applies to a Scenario built in code too;
3. the rules a schema cannot say (unique ids, arrival order, arrival before
   max_steps, prefix fields, aborts).

The vLLM release a scenario models is its config's `vllm_version`; a file whose
config names none models the release the reader is given (the command's:
`--vllm-version X`, `--impl vllm==X`; cli/vllm_version.py), else the newest.

Whether vLLM would *accept* the config and the requests is a separate question,
answered by `validate_scenario` with the spec's rules (and, for another
implementation, by that implementation).  `scenario_problem` asks pass 3 and
that question at once of a Scenario built in code: the project's one validity
check, which the shrinker and the searches use.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from schedspec.spec.config import (CONFIG_FIELDS, EXCERPT_CHARS, ConfigError, SchedulerConfig, check_config,
                                   config_as_given, config_from_json, config_schema, excerpt, field_path,
                                   validate_config)
from schedspec.spec.input_processor import make_request
from schedspec.spec.versions import DEFAULT_RELEASE

from .prompts import OUTPUT_TOKEN_IDS
from .scenario_fields import SCENARIO, FieldProblem, check_field, field_schema
from .strict_json import DuplicateKeys, Refused, object_pairs, refuse_constant

SCENARIO_FORMAT = "schedspec.scenario/1"

SCHEMA_DIR = Path(__file__).parent / "schemas"
DEFAULT_MAX_STEPS = 10000

# Reading limits.  A real scenario nests 4 deep (file, requests, request,
# prompt_token_ids) and 600 000 requests fit in 64 MiB.
MAX_FILE_BYTES = 64 * 2**20
MAX_DEPTH = 16
MAX_INT_DIGITS = 20  # every bound of the format (the tables of fields) has at most 16 digits

# Speculative decoding's per-request patterns.
SPEC_PATTERNS = ("num_draft_tokens", "num_accepted_tokens")
# With prefix caching every implementation keeps each prompt's token ids (the
# spec and vLLM also hash them per block): the prompts of one scenario may add
# up to this many tokens then, 32 MiB of ids.  Without it they are counts.
MAX_CACHED_PROMPT_TOKENS = 2**22


class ScenarioError(ValueError):
    """A scenario file that does not follow the format."""


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt_len: int
    arrival_step: int = 0
    max_tokens: int | None = None  # None = max_model_len - prompt_len
    output_len: int | None = None  # EOS as this output token; None = never
    priority: int = 0
    arrival_time: float = 0.0
    # Prefix caching (formats.md "Additions"): requests of one group share their
    # first min(prefix_len) prompt tokens; or an explicit prompt.
    prefix_group: str | None = None
    prefix_len: int = 0
    prompt_token_ids: tuple[int, ...] | None = None
    # Speculative decoding (formats.md): the fake drafter's and fake model's patterns, cycled.
    num_draft_tokens: tuple[int, ...] | None = None
    num_accepted_tokens: tuple[int, ...] | None = None
    # LoRA (formats.md): the request's adapter, 0 for none.
    lora_int_id: int = 0
    # Structured output (formats.md): the steps its grammar takes to compile, from its
    # arrival step (None: no grammar), and whether that compilation fails.
    grammar_compile_steps: int | None = None
    grammar_error: bool = False
    # KV connector (formats.md): the leading prompt tokens a remote store holds for it,
    # and, for an asynchronous load, the engine steps until the worker reports it finished.
    kv_connector_tokens: int = 0
    kv_connector_load_steps: int | None = None
    # and, for a request whose KV the connector sends once it finishes (a KV producer's),
    # the engine steps from its finish until the worker reports the send.
    kv_connector_send_steps: int | None = None
    # Encoder inputs (formats.md): the prompt's multimodal items, as (offset, length, identifier).
    mm_features: tuple[tuple[int, int, str], ...] = ()


@dataclass(frozen=True)
class Abort:
    id: str
    step: int


@dataclass(frozen=True)
class Scenario:
    name: str
    # The config, typed and within schedspec's bounds (its release in vllm_version).
    # Given as a `config` object (a dict), it is built from it here: one that names no
    # vllm_version models the newest release.  Whether that release accepts the config
    # is `scheduler_config()`'s question.
    config: SchedulerConfig
    requests: tuple[RequestSpec, ...]
    aborts: tuple[Abort, ...] = ()
    max_steps: int = DEFAULT_MAX_STEPS
    description: str = ""

    def __post_init__(self) -> None:
        try:
            if isinstance(self.config, Mapping):
                object.__setattr__(self, "config", config_from_json(dict(self.config)))
            else:
                check_config(self.config)
        except ConfigError as e:
            raise ScenarioError(str(e)) from None

    def scheduler_config(self) -> SchedulerConfig:
        """The config, once the release it models accepts it; ConfigError, naming the
        field, where vLLM would reject it (spec/config.py `validate_config`)."""
        validate_config(self.config)
        return self.config

    def without_late_arrivals(self) -> Scenario:
        """The same run without the requests that arrive at or after max_steps
        (they never arrive) and their aborts: what a shrinker that lowers
        max_steps must save, since such a file does not load."""
        late = {r.id for r in self.requests if r.arrival_step >= self.max_steps}
        if not late:
            return self
        return replace(self, requests=tuple(r for r in self.requests if r.id not in late),
                       aborts=tuple(a for a in self.aborts if a.id not in late))

    def grammar_events(self) -> dict[int, list[tuple[str, bool]]]:
        """Structured output: at each step, the requests whose grammar finishes
        compiling then (before that step's schedule()), with whether it failed."""
        out: dict[int, list[tuple[str, bool]]] = {}
        for r in self.requests:
            if r.grammar_compile_steps is not None:
                out.setdefault(r.arrival_step + r.grammar_compile_steps, []).append((r.id, r.grammar_error))
        return out

    def events_by_step(self) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        """The ids arriving and the ids aborted at each step, in file order."""
        arrivals: dict[int, list[str]] = {}
        for r in self.requests:
            arrivals.setdefault(r.arrival_step, []).append(r.id)
        aborts: dict[int, list[str]] = {}
        for a in self.aborts:
            aborts.setdefault(a.step, []).append(a.id)
        return arrivals, aborts

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": SCENARIO_FORMAT, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["config"] = config_as_given(self.config)
        reqs = []
        for r in self.requests:
            d = {"id": r.id, "arrival_step": r.arrival_step, "prompt_len": r.prompt_len}
            if r.max_tokens is not None:
                d["max_tokens"] = r.max_tokens
            if r.output_len is not None:
                d["output_len"] = r.output_len
            if r.priority:
                d["priority"] = r.priority
            d["arrival_time"] = r.arrival_time
            if r.prefix_group is not None:
                d["prefix_group"] = r.prefix_group
            if r.prefix_len:
                d["prefix_len"] = r.prefix_len
            if r.prompt_token_ids is not None:
                d["prompt_token_ids"] = list(r.prompt_token_ids)
            for name in SPEC_PATTERNS:
                if getattr(r, name) is not None:
                    d[name] = list(getattr(r, name))
            if r.lora_int_id:
                d["lora_int_id"] = r.lora_int_id
            if r.grammar_compile_steps is not None:
                d["grammar_compile_steps"] = r.grammar_compile_steps
            if r.grammar_error:
                d["grammar_error"] = True
            if r.kv_connector_tokens:
                d["kv_connector_tokens"] = r.kv_connector_tokens
            if r.kv_connector_load_steps is not None:
                d["kv_connector_load_steps"] = r.kv_connector_load_steps
            if r.kv_connector_send_steps is not None:
                d["kv_connector_send_steps"] = r.kv_connector_send_steps
            if r.mm_features:
                d["mm_features"] = [{"offset": o, "length": n, "identifier": h} for o, n, h in r.mm_features]
            reqs.append(d)
        out["requests"] = reqs
        out["aborts"] = [asdict(a) for a in self.aborts]
        out["max_steps"] = self.max_steps
        return out


# --- pass 1: bytes to JSON ------------------------------------------------------------


def _cut(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "\u2026"


def _int(text: str):
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        # Never int() it: Python refuses more than 4300 digits, and any value
        # this long is beyond every bound of the format anyway.
        return Refused(f"= {_cut(text)} is an integer of {digits} digits, beyond every bound of the "
                    f"format (docs/formats.md)")
    return int(text)


def _float(text: str):
    value = float(text)
    if not math.isfinite(value):
        return Refused(f"= {_cut(text)} is too large for a number (it overflows to infinity)")
    return value


def _path_text(path: tuple) -> str:
    out = ""
    for p in path:
        out = f"{out}[{p}]" if isinstance(p, int) else field_path(out, p)
    if len(out) > 2 * EXCERPT_CHARS:
        out = out[:2 * EXCERPT_CHARS] + "\u2026"
    return out or "the top level"


def _unpaired_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(data: Any) -> None:
    """Depth, refused values, duplicate keys and unpaired surrogates, in document
    order, without recursion."""
    stack = [(data, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, Refused):
            raise ScenarioError(f"{_path_text(path)}: {value.message}")
        if isinstance(value, str):
            if _unpaired_surrogate(value):
                raise ScenarioError(f"{_path_text(path)}: = {excerpt(value)} holds an unpaired surrogate "
                                    "escape (\\ud800-\\udfff), which is not text")
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise ScenarioError(f"{_path_text(path)}: nested more than {MAX_DEPTH} levels deep; a scenario "
                                "nests 4 deep")
        if isinstance(value, DuplicateKeys):
            raise ScenarioError(f"{_path_text(path + (value.duplicate,))}: the key appears more than once "
                                "in one object; give each key once")
        if isinstance(value, dict):
            for key in value:
                if _unpaired_surrogate(key):
                    raise ScenarioError(f"{_path_text(path)}: the key {excerpt(key)} holds an unpaired "
                                        "surrogate escape (\\ud800-\\udfff), which is not text")
            children = [(v, path + (k,)) for k, v in value.items()]
        else:
            children = [(v, path + (i,)) for i, v in enumerate(value)]
        stack.extend((v, p, depth + 1) for v, p in reversed(children))


def parse_scenario_bytes(raw: bytes | str) -> Any:
    """The JSON value of a scenario file, or ScenarioError (pass 1)."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_FILE_BYTES:
            raise ScenarioError(f"larger than {MAX_FILE_BYTES // 2**20} MiB, the most a scenario file may be")
        raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScenarioError(f"not UTF-8 text: byte 0x{raw[e.start]:02x} at offset {e.start} "
                                f"({e.reason}); save the file as UTF-8") from None
    else:
        text = raw
    try:
        data = json.loads(text, object_pairs_hook=object_pairs, parse_int=_int, parse_float=_float,
                          parse_constant=refuse_constant)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise ScenarioError(f"not accepted: JSON nested more than {MAX_DEPTH} levels deep; a scenario "
                            "nests 4 deep") from None
    _check_tree(data)
    return data


# --- pass 2: the tables of fields (the published JSON Schema's source) ------------------


def published_schema() -> dict:
    """The scenario JSON Schema as it should be shipped: the file's title and
    description, its fields from the tables (reference/scenario_fields.py, and for
    `config` spec/config.py `config_schema`); scripts/write-scenario-schema.py writes
    it, and a test checks the file."""
    shipped = json.loads((SCHEMA_DIR / "scenario.schema.json").read_text())
    head = {k: shipped[k] for k in ("$schema", "$id", "title", "description")}
    return head | field_schema(SCENARIO, lambda _: config_schema())


def _problem(e: FieldProblem) -> ScenarioError:
    return ScenarioError(f"{_path_text(e.path)}: {e.message}")


def check_bounds(scenario: Scenario) -> None:
    """The table's types and schedspec's size bounds (docs/formats.md) on the requests,
    aborts and steps of a Scenario built in code, as a file would give them (its config
    met its own when it was built); ScenarioError names the first field beyond them."""
    data = scenario.to_json()
    try:
        for name in ("requests", "aborts", "max_steps"):
            check_field(SCENARIO.by_name[name], data[name], (name,))
    except FieldProblem as e:
        raise _problem(e) from None


# --- pass 3: the rules a schema cannot say --------------------------------------------


def _check_rules(scenario: Scenario, max_steps_given: bool) -> None:
    seen: dict[str, int] = {}
    last_arrival = 0
    for i, r in enumerate(scenario.requests):
        where = f"requests[{i}]"
        if r.id in seen:
            raise ScenarioError(f"{where}.id: duplicate request id {excerpt(r.id)}, already the id of "
                                f"requests[{seen[r.id]}]; request ids must be unique")
        seen[r.id] = i
        if r.arrival_step < last_arrival:
            raise ScenarioError(
                f"{where}.arrival_step: = {r.arrival_step} is before the previous request's "
                f"{last_arrival}; requests must be listed in non-decreasing arrival_step")
        last_arrival = r.arrival_step
        if r.arrival_step >= scenario.max_steps:
            given = "" if max_steps_given else ", the default"
            raise ScenarioError(
                f"{where}.arrival_step: = {r.arrival_step} is not before max_steps ({scenario.max_steps}{given}), "
                "so the request would never arrive; raise max_steps or lower arrival_step")
        if r.prefix_len and r.prefix_group is None:
            raise ScenarioError(
                f"{where}.prefix_len: = {r.prefix_len} without a prefix_group; prefix_len is the length "
                "shared with the requests of the same group: set prefix_group or drop prefix_len")
        if r.prompt_len < 1:
            # No prompt to measure the prefix fields against: vLLM's check
            # (validate_scenario) names prompt_len itself.
            continue
        if r.prefix_len > r.prompt_len:
            raise ScenarioError(f"{where}.prefix_len: = {r.prefix_len}, must be <= prompt_len ({r.prompt_len})")
        if r.prompt_token_ids is not None:
            if r.prefix_group is not None:
                raise ScenarioError(
                    f"{where}.prompt_token_ids: not allowed together with prefix_group; give either the "
                    "explicit tokens or a group, not both")
            if len(r.prompt_token_ids) != r.prompt_len:
                raise ScenarioError(
                    f"{where}.prompt_token_ids: holds {len(r.prompt_token_ids)} tokens, must hold "
                    f"prompt_len ({r.prompt_len})")
            for k, tok in enumerate(r.prompt_token_ids):
                if tok in OUTPUT_TOKEN_IDS:
                    raise ScenarioError(
                        f"{where}.prompt_token_ids[{k}]: = {tok} is an id the fake model samples (EOS "
                        f"{OUTPUT_TOKEN_IDS[0]}, other outputs {OUTPUT_TOKEN_IDS[1]}); explicit prompts must avoid "
                        "both, so that no prompt block equals an output block by the choice of ids (docs/formats.md)")
    _check_spec_patterns(scenario)
    _check_loras(scenario)
    _check_grammars(scenario)
    _check_mm_identifiers(scenario)
    if scenario.config.enable_prefix_caching:
        total = 0
        for i, r in enumerate(scenario.requests):
            total += max(r.prompt_len, 0)
            if total > MAX_CACHED_PROMPT_TOKENS:
                raise ScenarioError(
                    f"requests[{i}].prompt_len: = {r.prompt_len} brings the prompts to {total} tokens, more than "
                    f"the {MAX_CACHED_PROMPT_TOKENS} a scenario may hold with config.enable_prefix_caching "
                    "(their token ids are kept; schedspec's bound, docs/formats.md)")
    for i, r in enumerate(scenario.requests):
        if r.kv_connector_load_steps is not None and not r.kv_connector_tokens:
            raise ScenarioError(f"requests[{i}].kv_connector_load_steps: = {r.kv_connector_load_steps} without "
                                "kv_connector_tokens: there is nothing to load; set kv_connector_tokens or drop it")
    by_id = {r.id: r for r in scenario.requests}
    for i, a in enumerate(scenario.aborts):
        where = f"aborts[{i}]"
        if a.id not in by_id:
            raise ScenarioError(f"{where}.id: = {excerpt(a.id)} is not a request of this scenario")
        if a.step <= by_id[a.id].arrival_step:
            raise ScenarioError(
                f"{where}.step: = {a.step} must be greater than the request's arrival_step "
                f"({by_id[a.id].arrival_step}); aborts run before arrivals")


def _check_spec_patterns(scenario: Scenario) -> None:
    """Draft patterns need speculative decoding on, and no more drafts than it allows:
    a pattern nothing reads would be silently ignored."""
    k = scenario.config.num_speculative_tokens
    for i, r in enumerate(scenario.requests):
        for name in SPEC_PATTERNS:
            pattern = getattr(r, name)
            if pattern is None:
                continue
            if k <= 0:
                raise ScenarioError(f"requests[{i}].{name}: given without speculative decoding; set "
                                    "config.num_speculative_tokens > 0 or drop it")
            for j, v in enumerate(pattern):
                if v > k:
                    raise ScenarioError(f"requests[{i}].{name}[{j}]: = {v}, more than "
                                        f"config.num_speculative_tokens ({k})")


def _check_grammars(scenario: Scenario) -> None:
    """A failing compilation needs a grammar."""
    for i, r in enumerate(scenario.requests):
        if r.grammar_error and r.grammar_compile_steps is None:
            raise ScenarioError(f"requests[{i}].grammar_error: true without a grammar; set "
                                "grammar_compile_steps or drop it")


def _check_mm_identifiers(scenario: Scenario) -> None:
    """One identifier, one item: the encoder cache keeps one entry per identifier, and
    vLLM finishes with an error a request whose item disagrees with it (S:2027-2048)."""
    lengths: dict[str, int] = {}
    for i, r in enumerate(scenario.requests):
        for k, (_, n, h) in enumerate(r.mm_features):
            if lengths.setdefault(h, n) != n:
                raise ScenarioError(f"requests[{i}].mm_features[{k}].length: = {n}, but identifier {h!r} has "
                                    f"length {lengths[h]} elsewhere in the file; one identifier names one item")


def _check_loras(scenario: Scenario) -> None:
    """An adapter needs LoRA on (vLLM's front end refuses it otherwise)."""
    on = scenario.config.max_loras is not None
    for i, r in enumerate(scenario.requests):
        if r.lora_int_id and not on:
            raise ScenarioError(f"requests[{i}].lora_int_id: = {r.lora_int_id}, but LoRA is off; set "
                                "config.max_loras or drop it")


def scenario_from_json(data: Any, release: str = DEFAULT_RELEASE) -> Scenario:
    """Check `data` (parsed JSON) against the published JSON Schema and the rules
    a schema cannot say; raise ScenarioError naming the field of the first problem.
    A config that names no vllm_version models `release`.  `data` straight from
    json.loads skips pass 1's checks on duplicate keys and NaN: read files with
    `load_scenario` or `parse_scenario_bytes`."""
    _check_tree(data)
    return _from_checked_json(data, release)


def check_structure(data: Any, release: str = DEFAULT_RELEASE) -> SchedulerConfig:
    """Pass 2 on parsed JSON: the fields by their tables, the config by its own (the
    published schema's verdict); ScenarioError for the first problem in the order of
    their paths, the one the schema's first error would name.  The config it states,
    typed: one that names no vllm_version models `release`."""
    built: list[SchedulerConfig] = []

    def config(value: dict, _path: tuple) -> None:
        built.append(config_from_json(value, release=release))

    try:
        check_field(SCENARIO, data, (), config)
    except FieldProblem as e:
        raise _problem(e) from None
    except ConfigError as e:
        raise ScenarioError(str(e)) from None
    return built[0] if built else config_from_json({}, release=release)


def _from_checked_json(data: Any, release: str = DEFAULT_RELEASE) -> Scenario:
    config = check_structure(data, release)
    requests = []
    for i, r in enumerate(data["requests"]):
        tokens = r.get("prompt_token_ids")
        requests.append(RequestSpec(
            id=r["id"], prompt_len=r["prompt_len"], arrival_step=r.get("arrival_step", 0),
            max_tokens=r.get("max_tokens"), output_len=r.get("output_len"),
            priority=r.get("priority", 0),
            arrival_time=float(r.get("arrival_time", i)),
            prefix_group=r.get("prefix_group"), prefix_len=r.get("prefix_len", 0),
            prompt_token_ids=tuple(tokens) if tokens is not None else None,
            **{name: tuple(r[name]) for name in SPEC_PATTERNS if r.get(name) is not None},
            lora_int_id=r.get("lora_int_id", 0),
            grammar_compile_steps=r.get("grammar_compile_steps"),
            grammar_error=r.get("grammar_error", False),
            kv_connector_tokens=r.get("kv_connector_tokens", 0),
            kv_connector_load_steps=r.get("kv_connector_load_steps"),
            kv_connector_send_steps=r.get("kv_connector_send_steps"),
            mm_features=tuple((f["offset"], f["length"], f["identifier"]) for f in r.get("mm_features", ())),
        ))
    scenario = Scenario(
        name=data["name"],
        description=data.get("description", ""),
        config=config,
        requests=tuple(requests),
        aborts=tuple(Abort(a["id"], a["step"]) for a in data.get("aborts", [])),
        max_steps=data.get("max_steps", DEFAULT_MAX_STEPS),
    )
    _check_rules(scenario, "max_steps" in data)  # pass 2 met the bounds check_bounds asks
    return scenario


def load_scenario(path: str | Path, release: str = DEFAULT_RELEASE) -> Scenario:
    """Read, parse and check a scenario file (one whose config names no vllm_version
    models `release`); ScenarioError is one line that starts with the file's path."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:  # a NUL byte in the path
        raise ScenarioError(f"{path}: cannot read: {e}") from None
    try:
        return _from_checked_json(parse_scenario_bytes(raw), release)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def validate_scenario(scenario: Scenario) -> SchedulerConfig:
    """Apply the modelled release's config checks and front-end request checks; raise
    ConfigError naming the field of the first rejection."""
    from .prompts import prompt_token_ids

    config = scenario.scheduler_config()
    # as the engine does (reference/engine.py): prefix caching needs the token ids
    tokens = prompt_token_ids(scenario) if config.enable_prefix_caching else {}
    for i, r in enumerate(scenario.requests):
        try:
            make_request(config, r.id, r.prompt_len, r.max_tokens, r.priority, r.arrival_time, tokens.get(r.id),
                         r.lora_int_id, r.grammar_compile_steps is not None, r.kv_connector_tokens,
                         r.kv_connector_load_steps is not None, r.kv_connector_send_steps is not None,
                         r.mm_features)
        except ConfigError as e:
            raise ConfigError(f"requests[{i}].{e.field}", str(e).split(": ", 1)[1]) from None
    return config


def scenario_problem(scenario: Scenario) -> str | None:
    """None when `scenario` is one a file may hold and the modelled vLLM release would run:
    schedspec's bounds, the rules a schema cannot say (pass 3) and vLLM's config
    and request checks (validate_scenario).  Otherwise the first problem, in the
    one-line words `schedspec validate` uses.  The one validity check of the
    project: shrinkers and searches keep only candidates it passes."""
    try:
        check_bounds(scenario)
        _check_rules(scenario, max_steps_given=True)
        validate_scenario(scenario)
    except (ScenarioError, ConfigError) as e:
        return str(e)
    return None


def save_scenario(scenario: Scenario, path: str | Path, overwrite: bool = False) -> Path:
    """Write a scenario file; never overwrite an existing file unless asked."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p} exists; not overwriting it")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(scenario.to_json(), indent=2) + "\n")
    return p


__all__ = [
    "Abort", "CONFIG_FIELDS", "RequestSpec", "Scenario", "ScenarioError", "check_bounds", "load_scenario",
    "check_structure", "parse_scenario_bytes", "save_scenario", "scenario_from_json", "scenario_problem", "validate_scenario",
    "SCENARIO_FORMAT",
]
