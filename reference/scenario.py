"""Scenario files (formats.md, `schedspec.scenario/1`): load, validate, save.

Structural problems (wrong types, missing ids, unordered arrivals, ...) raise
ScenarioError naming the JSON path.  Whether vLLM would *accept* the config and
the requests is a separate question, answered by `validate_scenario` with the
spec's rules (and, for another implementation, by that implementation).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jsonschema

from ..spec.config import CONFIG_FIELDS, ConfigError, SchedulerConfig, config_from_dict
from ..spec.request import make_request

SCENARIO_FORMAT = "schedspec.scenario/1"
SCHEMA_DIR = Path(__file__).parent / "schemas"
DEFAULT_MAX_STEPS = 10000


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


@dataclass(frozen=True)
class Abort:
    id: str
    step: int


@dataclass(frozen=True)
class Scenario:
    name: str
    config: dict[str, Any]  # the raw `config` object, as given
    requests: tuple[RequestSpec, ...]
    aborts: tuple[Abort, ...] = ()
    max_steps: int = DEFAULT_MAX_STEPS
    description: str = ""

    def scheduler_config(self) -> SchedulerConfig:
        """The validated config; raises ConfigError if vLLM would reject it."""
        return config_from_dict(self.config)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": SCENARIO_FORMAT, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["config"] = dict(self.config)
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
            reqs.append(d)
        out["requests"] = reqs
        out["aborts"] = [asdict(a) for a in self.aborts]
        out["max_steps"] = self.max_steps
        return out


def _schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text())


def _path(error: jsonschema.ValidationError) -> str:
    parts = ["$"]
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else f".{p}")
    return "".join(parts)


def scenario_from_json(data: Any) -> Scenario:
    """Check `data` against the published JSON Schema and the rules a schema
    cannot say; raise ScenarioError with the JSON path of the first problem."""
    validator = jsonschema.Draft202012Validator(_schema("scenario.schema.json"))
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        e = errors[0]
        raise ScenarioError(f"{_path(e)}: {e.message}")
    requests = []
    seen: set[str] = set()
    last_arrival = 0
    for i, r in enumerate(data["requests"]):
        where = f"$.requests[{i}]"
        if r["id"] in seen:
            raise ScenarioError(f"{where}.id: duplicate request id {r['id']!r}")
        seen.add(r["id"])
        arrival = r.get("arrival_step", 0)
        if arrival < last_arrival:
            raise ScenarioError(
                f"{where}.arrival_step: = {arrival} is before the previous request's "
                f"{last_arrival}; requests must be listed in non-decreasing arrival_step")
        last_arrival = arrival
        requests.append(RequestSpec(
            id=r["id"], prompt_len=r["prompt_len"], arrival_step=arrival,
            max_tokens=r.get("max_tokens"), output_len=r.get("output_len"),
            priority=r.get("priority", 0),
            arrival_time=float(r.get("arrival_time", i)),
        ))
    by_id = {r.id: r for r in requests}
    aborts = []
    for i, a in enumerate(data.get("aborts", [])):
        where = f"$.aborts[{i}]"
        if a["id"] not in by_id:
            raise ScenarioError(f"{where}.id: {a['id']!r} is not a request of this scenario")
        if a["step"] <= by_id[a["id"]].arrival_step:
            raise ScenarioError(
                f"{where}.step: = {a['step']} must be greater than the request's arrival_step "
                f"({by_id[a['id']].arrival_step}); aborts run before arrivals")
        aborts.append(Abort(a["id"], a["step"]))
    return Scenario(
        name=data["name"],
        description=data.get("description", ""),
        config=dict(data.get("config", {})),
        requests=tuple(requests),
        aborts=tuple(aborts),
        max_steps=data.get("max_steps", DEFAULT_MAX_STEPS),
    )


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    try:
        return scenario_from_json(data)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def validate_scenario(scenario: Scenario) -> SchedulerConfig:
    """Apply vLLM 0.33.0's config checks and front-end request checks; raise
    ConfigError naming the field of the first rejection."""
    config = scenario.scheduler_config()
    for i, r in enumerate(scenario.requests):
        try:
            make_request(config, r.id, r.prompt_len, r.max_tokens, r.priority, r.arrival_time)
        except ConfigError as e:
            raise ConfigError(f"requests[{i}].{e.field}", str(e).split(": ", 1)[1]) from None
    return config


def save_scenario(scenario: Scenario, path: str | Path, overwrite: bool = False) -> Path:
    """Write a scenario file; never overwrite an existing file unless asked."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise FileExistsError(f"{p} exists; not overwriting it")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(scenario.to_json(), indent=2) + "\n")
    return p


__all__ = [
    "Abort", "CONFIG_FIELDS", "RequestSpec", "Scenario", "ScenarioError", "load_scenario",
    "save_scenario", "scenario_from_json", "validate_scenario", "SCENARIO_FORMAT",
]
