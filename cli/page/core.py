"""What the explorer's API computes, as plain functions (no HTTP here).

Every number the page shows comes from these functions, which only call the
project's own code: scenarios are checked by reference/scenario.py (the same
one-line messages `schedspec validate` prints), run by reference/engine.py on
the spec (reference/impl.py `SpecScheduler`, as `schedspec run` does), and
every step is judged by every property of spec/properties.py's registry (as
`schedspec check` does).  The seeds' closed forms come from the aggregate
encoding of proofs/starvation.py, evaluated on plain integers, so the page's
"closed form" is the formula the z3 theorems are about, not a copy of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from schedspec.reference.example_files import EXAMPLES_DIR, example_names
from schedspec.reference.engine import run_scenario
from schedspec.reference.impl import SpecScheduler
from schedspec.reference.scenario import SCENARIO_FORMAT, Scenario, ScenarioError, scenario_from_json, validate_scenario
from schedspec.spec.config import ConfigError, SchedulerConfig, step_budget
from schedspec.spec.properties import PROPERTIES, check_step

# Bounds on what one API call may ask for, so a page (or anything else that can
# reach 127.0.0.1) cannot make the server build an unbounded response.
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_REQUESTS = 5000
MAX_STEPS = 10000  # the format's default max_steps, so a file that omits it is accepted
MAX_REQUEST_STEPS = 3_000_000  # requests alive summed over the steps: the trace's size
MAX_COMPARE = 3

# The seeds' minimal problem (seed Table 3, groups A and B): D decodes arrive at
# step 0 as 1-token prompts, the P-token prompt arrives at step 1, so when it
# arrives every decode needs exactly one token.  The shipped examples
# reference/examples/group-*.json and table3-*.json are these scenarios.
#
# The closed form is about D decodes that stay running for the whole run: a
# decode that finishes frees budget and a slot, and from then on the prompt gets
# tokens the closed form says it never gets.  So each decode's max_tokens is at
# least the steps run plus one (none finishes within the run), and never below
# the shipped examples' 100, so the presets stay those files request for request.
SEED_DECODE_MIN_MAX_TOKENS = 100
SEED_PROMPT_ID = "prompt"
SEED_PROMPT_ARRIVAL = 1
SEED_PROMPT_MAX_TOKENS = 4
SEED_KNOBS = {  # name: (default, minimum, maximum)
    "D": (10, 0, 512),
    "P": (24, 1, 4096),
    "B": (16, 1, 4096),
    "M": (32, 1, 512),
    "steps": (12, 1, 500),
}
SEED_PRESETS = {
    "group-a": {"D": 10, "P": 24, "B": 16, "M": 32, "policy": "fcfs", "chunked": True, "steps": 12},
    "group-b": {"D": 16, "P": 24, "B": 16, "M": 32, "policy": "fcfs", "chunked": True, "steps": 12},
    "table3-b8": {"D": 10, "P": 24, "B": 8, "M": 32, "policy": "fcfs", "chunked": True, "steps": 12},
    "table3-b16": {"D": 10, "P": 24, "B": 16, "M": 32, "policy": "fcfs", "chunked": True, "steps": 12},
    "table3-b32": {"D": 10, "P": 24, "B": 32, "M": 32, "policy": "fcfs", "chunked": True, "steps": 12},
}


class ApiError(ValueError):
    """A request the API rejects: one line, and the field it is about (or None)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field if field is not None else field_of(message)
        self.status = status


_PATH = re.compile(r"^(?:\$\.?)?((?:[A-Za-z_]\w*|\[\d+\])(?:\.[A-Za-z_]\w*|\[\d+\])*)\s*:")


def field_of(message: str) -> str | None:
    """The field a one-line message starts with (`config.max_num_seqs: ...`,
    `$.requests[3].prompt_len: ...`), as `config.max_num_seqs` / `requests[3].prompt_len`."""
    m = _PATH.match(message)
    return m.group(1) if m else None


def one_line(message: str) -> str:
    return " ".join(str(message).split())


# --- metadata -------------------------------------------------------------------------


def config_fields() -> list[dict[str, Any]]:
    out = []
    for f in fields(SchedulerConfig):
        if f.name == "vllm_version":  # the page models 0.33.0; releases: the CLI's --vllm-version
            continue
        default = f.default
        kind = ("bool" if isinstance(default, bool) else "number" if isinstance(default, float)
                else "choice" if f.name == "policy" else "int")
        out.append({"name": f.name, "default": default, "kind": kind,
                    "nullable": default is None})
    return out


def meta(initial: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "examples": example_names(),
        "config_fields": config_fields(),
        "policies": ["fcfs", "priority"],
        "properties": [{"name": p.name, "doc": p.doc} for p in PROPERTIES.values()],
        "seed_knobs": {k: {"default": d, "min": lo, "max": hi} for k, (d, lo, hi) in SEED_KNOBS.items()},
        "seed_presets": SEED_PRESETS,
        "seed_decode_min_max_tokens": SEED_DECODE_MIN_MAX_TOKENS,
        "limits": {"max_body_bytes": MAX_BODY_BYTES, "max_requests": MAX_REQUESTS,
                   "max_steps": MAX_STEPS, "max_request_steps": MAX_REQUEST_STEPS,
                   "max_compare": MAX_COMPARE},
        "initial": initial,
    }


def example_json(name: str) -> dict[str, Any]:
    import json

    if name not in example_names():
        raise ApiError(f"example: no shipped example {name!r}; known: {', '.join(example_names())}",
                       "example", status=404)
    return json.loads((EXAMPLES_DIR / f"{name}.json").read_text())


# --- scenarios --------------------------------------------------------------------------


def load_text(name: Any, text: Any) -> Any:
    """A file the user opened in the page: its JSON, or the message
    reference/scenario.py's `load_scenario` gives for a file that is not JSON."""
    from schedspec.reference.scenario import ScenarioError, parse_scenario_bytes

    if not isinstance(name, str) or not isinstance(text, str):
        raise ApiError("request body: 'name' and 'text' must be strings", "body")
    try:
        return parse_scenario_bytes(text)
    except ScenarioError as e:
        raise ApiError(one_line(f"{name}: {e}"), "file") from None


def parse_scenario(data: Any) -> Scenario:
    """A scenario the explorer can run, or ApiError with the CLI's message."""
    if isinstance(data, dict) and isinstance(data.get("requests"), list) and len(data["requests"]) > MAX_REQUESTS:
        raise ApiError(f"requests: {len(data['requests'])} requests; the explorer runs at most "
                       f"{MAX_REQUESTS} (use `schedspec run` for more)")
    try:
        scenario = scenario_from_json(data)
    except ScenarioError as e:
        raise ApiError(one_line(e)) from None
    if scenario.max_steps > MAX_STEPS:
        raise ApiError(f"max_steps: = {scenario.max_steps}; the explorer runs at most {MAX_STEPS} "
                       "steps (use `schedspec run` for more)")
    try:
        validate_scenario(scenario)
    except ConfigError as e:
        raise ApiError(one_line(e), e.field) from None
    return scenario


class _TooBig(Exception):
    pass


def _verdict_code(v) -> str:
    return "v" if not v.holds else ("h" if v.applicable else "n")


def run(scenario: Scenario) -> dict[str, Any]:
    """The spec's trace of `scenario` (exactly `run_scenario`'s) and every
    property's verdict at every step (as `schedspec check` evaluates them)."""
    names = list(PROPERTIES)
    verdicts: list[dict[str, Any]] = []
    alive = [0]

    def on_step(t) -> None:
        alive[0] += len(t.record["num_computed_tokens"])
        if alive[0] > MAX_REQUEST_STEPS:
            raise _TooBig
        checked = check_step(t.before, t.output, t.after)
        codes = "".join(_verdict_code(checked[n]) for n in names)
        entry: dict[str, Any] = {"codes": codes}
        bad = {n: one_line(v.detail + (" (" + ", ".join(f"{k}={x}" for k, x in v.values.items()) + ")"
                                       if v.values else ""))
               for n, v in checked.items() if not v.holds}
        if bad:
            entry["violations"] = bad
        verdicts.append(entry)

    try:
        trace = run_scenario(scenario, SpecScheduler(), on_step=on_step)
    except _TooBig:
        raise ApiError(f"max_steps: the trace would hold more than {MAX_REQUEST_STEPS} request-steps "
                       "(requests alive, summed over steps), the explorer's limit; lower max_steps or "
                       "use `schedspec run`") from None
    if "error" in trace:  # validate_scenario already said no; kept for another rule set
        raise ApiError(one_line(trace["error"]))
    config = scenario.scheduler_config()
    return {
        "scenario": scenario.to_json(),
        "trace": trace,
        "step_budget": step_budget(config),
        "num_usable_blocks": config.num_usable_blocks,
        "property_names": names,
        "verdicts": verdicts,
    }


def run_json(data: Any) -> dict[str, Any]:
    return run(parse_scenario(data))


def compare(data: Any, configs: Any) -> list[dict[str, Any]]:
    """The same workload under two or three configs (each replaces `config`)."""
    if not isinstance(configs, list) or not 1 <= len(configs) <= MAX_COMPARE:
        raise ApiError(f"configs: give 1 to {MAX_COMPARE} config objects to compare")
    base = parse_scenario(data)  # the workload must be valid on its own first
    out = []
    for i, c in enumerate(configs):
        variant = dict(base.to_json(), config=c)
        try:
            out.append(run(parse_scenario(variant)))
        except ApiError as e:
            raise ApiError(f"configs[{i}]: {e}", f"configs[{i}].{e.field}" if e.field else f"configs[{i}]") from None
    return out


# --- the seeds' minimal problem ------------------------------------------------------------


def seed_knobs(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ApiError("seed: must be an object with D, P, B, M, policy, chunked, steps", "seed")
    unknown = sorted(set(raw) - set(SEED_KNOBS) - {"policy", "chunked"})
    if unknown:
        raise ApiError(f"{unknown[0]}: unknown knob; the knobs are D, P, B, M, policy, chunked, steps")
    knobs: dict[str, Any] = {}
    for name, (default, lo, hi) in SEED_KNOBS.items():
        v = raw.get(name, default)
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise ApiError(f"{name}: = {v!r}, must be an integer in [{lo}, {hi}]")
        knobs[name] = v
    policy = raw.get("policy", "fcfs")
    if policy not in ("fcfs", "priority"):
        raise ApiError(f"policy: = {policy!r}; use 'fcfs' or 'priority'")
    chunked = raw.get("chunked", True)
    if not isinstance(chunked, bool):
        raise ApiError(f"chunked: = {chunked!r}, must be true or false")
    knobs.update(policy=policy, chunked=chunked)
    return knobs


def seed_decode_max_tokens(steps: int) -> int:
    """The decodes' max_tokens for a run of `steps` steps: a decode arriving at
    step 0 with a 1-token prompt samples its n-th token at step n - 1, so with
    steps + 1 it is still running after the last step."""
    return max(SEED_DECODE_MIN_MAX_TOKENS, steps + 1)


def seed_num_gpu_blocks(k: dict[str, Any]) -> int | None:
    """KV blocks for every token the run can compute (the closed form assumes
    allocation never fails: a preempted decode would free budget it counts as
    used), or None where the format's default already holds them, as for the
    presets.  A decode holds at most steps + 1 tokens by the last step, the
    prompt P plus its output; one more block is vLLM's null block."""
    bs = SchedulerConfig.block_size
    need = (k["D"] * -(-(k["steps"] + 1) // bs) + -(-(k["P"] + SEED_PROMPT_MAX_TOKENS) // bs) + 1)
    return need if need > SchedulerConfig.num_gpu_blocks else None


def seed_scenario(k: dict[str, Any]) -> dict[str, Any]:
    """The seeds' problem as a scenario file.  B is the step budget
    (max_num_scheduled_tokens); vLLM requires max_num_batched_tokens >= max_num_seqs
    (config/scheduler.py:331) and >= max_model_len with chunked prefill off (:318),
    so that one is raised as needed and never binds below B."""
    D, P, B, M = k["D"], k["P"], k["B"], k["M"]
    config: dict[str, Any] = {"max_num_batched_tokens": max(B, M), "max_num_scheduled_tokens": B,
                              "max_num_seqs": M}
    if not k["chunked"]:
        config["max_num_batched_tokens"] = max(B, M, SchedulerConfig.max_model_len)
        config["enable_chunked_prefill"] = False
    if k["policy"] != "fcfs":
        config["policy"] = k["policy"]
    blocks = seed_num_gpu_blocks(k)
    if blocks is not None:
        config["num_gpu_blocks"] = blocks
    decode_max_tokens = seed_decode_max_tokens(k["steps"])
    requests = [{"id": f"d{i}", "arrival_step": 0, "prompt_len": 1, "max_tokens": decode_max_tokens}
                for i in range(D)]
    requests.append({"id": SEED_PROMPT_ID, "arrival_step": SEED_PROMPT_ARRIVAL, "prompt_len": P,
                     "max_tokens": SEED_PROMPT_MAX_TOKENS})
    return {
        "format": SCENARIO_FORMAT,
        "name": f"minimal-D{D}-P{P}-B{B}-M{M}-{k['policy']}-{'chunked' if k['chunked'] else 'unchunked'}",
        "description": (f"The minimal starvation problem: D={D} decodes, a P={P}-token prompt arriving at "
                        f"step 1, token budget B={B}, max_num_seqs M={M}, policy {k['policy']}, "
                        f"chunked prefill {'on' if k['chunked'] else 'off'}. Each decode's max_tokens is "
                        f"{decode_max_tokens}, so none finishes within the {k['steps']} steps run"
                        + (f"; num_gpu_blocks {blocks} holds every token they compute." if blocks else ".")),
        "config": config,
        "requests": requests,
        "max_steps": k["steps"],
    }


def closed_form(k: dict[str, Any]) -> dict[str, Any]:
    """The starvation theorems' prediction (proofs/starvation.py), for the
    prompt's first step in waiting: its grant, and how many steps its prefill takes."""
    from schedspec.proofs.starvation import AggChoice, AggState, PyOps, aggregate_step, chunk_cap

    D, P, B, M = k["D"], k["P"], k["B"], k["M"]
    # Running decodes when the prompt arrives: at most M fit the running list, and
    # a decode still waiting (D > M) sits ahead of the prompt with no slot either.
    d_run = min(D, M)
    s = AggState(D=d_run, W=1 + max(D - M, 0), token_budget=B, max_num_batched_tokens=B, P=P,
                 prompt_running=False, threshold=0, max_num_active_reqs=M, chunked=k["chunked"],
                 enough_blocks=True)
    grant = aggregate_step(PyOps, s, AggChoice(preempted=False, decode_tokens=0, prompt_alloc_ok=True)).prompt_tokens
    where = f"D={d_run}" + (f" (of {D}; M={M} bounds the running list)" if D > M else "")
    if d_run >= B:
        return {"grant": 0, "steps": None,
                "text": f"{where} ≥ B={B}: the decodes use the whole budget, the prompt gets 0 tokens, "
                        "never while D ≥ B"}
    if d_run >= M:
        return {"grant": 0, "steps": None,
                "text": f"{where} ≥ M={M}: no free run slot, the prompt gets 0 tokens, never while D ≥ M"}
    if not k["chunked"]:
        if grant:
            return {"grant": grant, "steps": 1,
                    "text": f"chunked prefill off: P={P} ≤ B − D = {B - d_run}, admitted whole in 1 step"}
        return {"grant": 0, "steps": None,
                "text": f"chunked prefill off: P={P} > B − D = {B - d_run}, not admitted, never while "
                        "P > B − D"}
    cap = chunk_cap(PyOps, s)
    steps = math.ceil(P / cap)
    return {"grant": grant, "steps": steps,
            "text": f"min(P, B − D) = min({P}, {B - d_run}) = {grant} token{'s' if grant != 1 else ''} in its first step; "
                    f"⌈P / (B − D)⌉ = ⌈{P}/{cap}⌉ = {steps} step{'s' if steps != 1 else ''} to finish its prefill"}


def simulated(k: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """What the spec's trace says about the prompt: its grant in each step from
    its arrival, and the step its prefill completes (num_computed_tokens >= P)."""
    P = k["P"]
    grants = []
    done_step = None
    for rec in result["trace"]["steps"]:
        if rec["step"] < SEED_PROMPT_ARRIVAL:
            continue
        grants.append([rec["step"], dict(rec["scheduled"]).get(SEED_PROMPT_ID, 0)])
        computed = rec["num_computed_tokens"].get(SEED_PROMPT_ID)
        finished = any(rid == SEED_PROMPT_ID for rid, _ in rec["finished"])
        if (computed is not None and computed >= P) or finished:
            done_step = rec["step"]
            break
    steps = None if done_step is None else done_step - SEED_PROMPT_ARRIVAL + 1
    # Table 3's row: the step the prompt arrives in, what each side got, what the prompt has left.
    row = None
    for rec in result["trace"]["steps"]:
        if rec["step"] == SEED_PROMPT_ARRIVAL:
            granted = dict(rec["scheduled"])
            computed = rec["num_computed_tokens"].get(SEED_PROMPT_ID, P)
            row = {"step": rec["step"], "decodes_scheduled": sum(1 for rid in granted if rid != SEED_PROMPT_ID),
                   "decode_tokens": sum(n for rid, n in granted.items() if rid != SEED_PROMPT_ID),
                   "prompt_tokens": granted.get(SEED_PROMPT_ID, 0), "prompt_left": max(P - computed, 0)}
    first = grants[0][1] if grants else 0
    if done_step is None:
        text = (f"the prompt got {first} tokens in its first step; its prefill is not complete after "
                f"{len(result['trace']['steps'])} steps")
    else:
        text = (f"the prompt got {first} tokens in its first step; its prefill completed at step "
                f"{done_step}: {steps} step{'s' if steps != 1 else ''}")
    return {"grant": first, "steps": steps, "grants": grants, "text": text, "first_step": row}


def seed(raw: Any) -> dict[str, Any]:
    k = seed_knobs(raw)
    scenario = seed_scenario(k)
    result = run_json(scenario)
    cf, sim = closed_form(k), simulated(k, result)
    if (cf["grant"], cf["steps"]) == (sim["grant"], sim["steps"]):
        agreement = "agree"
    elif cf["grant"] == sim["grant"] and cf["steps"] is not None and sim["steps"] is None \
            and cf["steps"] > len(result["trace"]["steps"]) - SEED_PROMPT_ARRIVAL:
        agreement = "beyond the steps shown"  # the run stopped before the predicted step
    else:
        agreement = "differ"
    return {"knobs": k, "decode_max_tokens": seed_decode_max_tokens(k["steps"]), "closed_form": cf,
            "simulated": sim, "agreement": agreement, "result": result}
