"""The explorer's API (cli/page/): the numbers the page shows are the spec's.

Through starlette's TestClient, no browser: the seeds' group B and Table 3 as
the knobs build them, the trace identical to `run_scenario`'s, verdicts equal to
`check_step`'s, and one-line errors that name the field.
"""

from __future__ import annotations

import json
import re
import socket

import pytest

pytest.importorskip("starlette", reason="the explorer needs starlette (pip install -e .)")
pytest.importorskip("httpx", reason="starlette's TestClient needs httpx (pip install -e '.[test]')")

from starlette.testclient import TestClient  # noqa: E402

from schedspec.cli.main import main as cli_main  # noqa: E402
from schedspec.reference.example_files import EXAMPLES_DIR  # noqa: E402
from schedspec.cli.page import core  # noqa: E402
from schedspec.cli.page.app import TOKEN_HEADER, create_app  # noqa: E402
from schedspec.reference.engine import run_scenario  # noqa: E402
from schedspec.reference.impl import SpecScheduler  # noqa: E402
from schedspec.reference.scenario import load_scenario  # noqa: E402
from schedspec.spec.properties import PROPERTIES, check_step  # noqa: E402


BASE = "http://127.0.0.1:8765"


def page_token(c: TestClient) -> str:
    """The token the server wrote into the page it serves, as the page's script reads it."""
    m = re.search(r'<meta name="schedspec-token" content="([^"]+)">', c.get("/").text)
    assert m, "the served page carries no token"
    return m.group(1)


@pytest.fixture(scope="module")
def client():
    c = TestClient(create_app(), base_url=BASE)
    c.headers[TOKEN_HEADER] = page_token(c)  # what the page sends with every POST
    return c


def example(name: str) -> dict:
    return json.loads((EXAMPLES_DIR / f"{name}.json").read_text())


def grants(trace: dict, rid: str) -> list[int]:
    return [dict(s["scheduled"]).get(rid, 0) for s in trace["steps"]]


def assert_one_line_error(r, status: int = 400, field: str | None = "any") -> str:
    assert r.status_code == status, r.text
    body = r.json()
    msg = body["error"]
    assert msg and "\n" not in msg and "Traceback" not in msg
    if field != "any":
        assert body["field"] == field, body
    return msg


# --- the seeds' numbers ------------------------------------------------------------------


def test_group_b_prompt_gets_nothing_every_step(client):
    r = client.post("/api/seed", json=core.SEED_PRESETS["group-b"])
    assert r.status_code == 200, r.text
    data = r.json()
    trace = data["result"]["trace"]
    assert len(trace["steps"]) == 12
    # The prompt arrives at step 1 and waits: 0 tokens at every step, 16 decodes get 1 each.
    assert grants(trace, "prompt") == [0] * 12
    for s in trace["steps"][1:]:
        assert "prompt" in s["waiting"]
        assert sum(n for _, n in s["scheduled"]) == 16
    assert data["simulated"]["grants"] == [[k, 0] for k in range(1, 12)]
    assert data["simulated"]["steps"] is None
    assert data["closed_form"]["grant"] == 0 and data["closed_form"]["steps"] is None
    assert "never while D ≥ B" in data["closed_form"]["text"]


def test_table3_b16_six_tokens_a_step_for_four_steps(client):
    data = client.post("/api/seed", json=core.SEED_PRESETS["table3-b16"]).json()
    trace = data["result"]["trace"]
    g = grants(trace, "prompt")
    assert g[1:5] == [6, 6, 6, 6]  # `schedspec run table3-b16`: prompt:6 at steps 1-4
    assert g[0] == 0 and g[5] == 1  # then a decode token, once the prefill is done
    assert trace["steps"][4]["num_computed_tokens"]["prompt"] == 24
    assert data["closed_form"] == {**data["closed_form"], "grant": 6, "steps": 4}
    assert data["simulated"]["grant"] == 6 and data["simulated"]["steps"] == 4


@pytest.mark.parametrize("preset,first,steps", [("table3-b8", 0, None), ("table3-b32", 22, 2), ("group-a", 6, 4)])
def test_closed_form_beside_the_spec(client, preset, first, steps):
    data = client.post("/api/seed", json=core.SEED_PRESETS[preset]).json()
    for side in ("closed_form", "simulated"):
        assert (data[side]["grant"], data[side]["steps"]) == (first, steps), (side, data[side])


@pytest.mark.parametrize("preset,decodes,prompt,left", [
    ("table3-b8", 8, 0, 24), ("table3-b16", 10, 6, 18), ("table3-b32", 10, 22, 2)])
def test_table3_rows(client, preset, decodes, prompt, left):
    """Table 3: decodes scheduled, prefill scheduled, prefill left after the prompt's first step."""
    row = client.post("/api/seed", json=core.SEED_PRESETS[preset]).json()["simulated"]["first_step"]
    assert (row["decodes_scheduled"], row["prompt_tokens"], row["prompt_left"]) == (decodes, prompt, left)


@pytest.mark.parametrize("preset", sorted(core.SEED_PRESETS))
def test_knobs_build_the_shipped_example(client, preset):
    """The presets are the shipped examples: same requests, same trace step by step."""
    built = client.post("/api/seed", json=core.SEED_PRESETS[preset]).json()["result"]
    shipped = client.post("/api/run", json={"scenario": example(preset)}).json()
    assert built["trace"]["steps"] == shipped["trace"]["steps"]
    assert built["scenario"]["requests"] == shipped["scenario"]["requests"]


def test_closed_form_with_chunked_prefill_off_and_too_few_slots():
    off = core.seed({"D": 10, "P": 24, "B": 16, "M": 32, "chunked": False})
    assert off["closed_form"]["grant"] == 0 and off["simulated"]["grant"] == 0
    fits = core.seed({"D": 2, "P": 10, "B": 16, "M": 32, "chunked": False})
    assert (fits["closed_form"]["grant"], fits["closed_form"]["steps"]) == (10, 1)
    assert (fits["simulated"]["grant"], fits["simulated"]["steps"]) == (10, 1)
    slots = core.seed({"D": 6, "P": 24, "B": 32, "M": 6})
    assert slots["closed_form"]["grant"] == 0 and slots["simulated"]["grant"] == 0
    assert "D ≥ M" in slots["closed_form"]["text"]


# --- the API is the spec ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["preemption", "chunked-off-no-fit", "group-a", "static-waste"])
def test_api_trace_is_run_scenarios_trace(client, name):
    expected = run_scenario(load_scenario(EXAMPLES_DIR / f"{name}.json"), SpecScheduler())
    got = client.post("/api/run", json={"scenario": example(name)}).json()
    assert got["trace"] == expected


def test_verdicts_are_check_steps(client):
    scenario = load_scenario(EXAMPLES_DIR / "preemption.json")
    expected = []

    def on_step(t):
        expected.append("".join("v" if not v.holds else "h" if v.applicable else "n"
                                for v in check_step(t.before, t.output, t.after).values()))

    run_scenario(scenario, SpecScheduler(), on_step=on_step)
    got = client.post("/api/run", json={"scenario": example("preemption")}).json()
    assert got["property_names"] == list(PROPERTIES)
    assert [v["codes"] for v in got["verdicts"]] == expected
    # The preemption step makes the preemption properties applicable, and they hold.
    step1 = dict(zip(got["property_names"], got["verdicts"][1]["codes"]))
    assert step1["preemption_only_on_allocation_failure"] == "h"
    assert step1["preempted_restart_from_zero"] == "h"
    assert got["trace"]["steps"][1]["preempted"] == ["r1"]


def test_compare_runs_each_config_on_the_same_requests(client):
    base = example("table3-b16")
    configs = [dict(base["config"], max_num_scheduled_tokens=b) for b in (8, 16, 32)]
    results = client.post("/api/compare", json={"scenario": base, "configs": configs}).json()["results"]
    assert [r["step_budget"] for r in results] == [8, 16, 32]
    for b, r in zip((8, 16, 32), results):
        shipped = run_scenario(load_scenario(EXAMPLES_DIR / f"table3-b{b}.json"), SpecScheduler())
        assert r["trace"]["steps"] == shipped["steps"]


def test_meta_lists_every_config_field_and_property(client):
    m = client.get("/api/meta").json()
    assert [f["name"] for f in m["config_fields"]][:3] == ["max_num_batched_tokens", "max_num_scheduled_tokens",
                                                          "max_num_seqs"]
    assert {p["name"] for p in m["properties"]} == set(PROPERTIES)
    assert "table3-b16" in m["examples"] and m["initial"] is None
    assert client.get("/api/example/group-b").json() == example("group-b")


def test_page_and_static_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "schedspec explore" in page.text
    for f in ("app.js", "style.css"):
        assert client.get(f"/static/{f}").status_code == 200
    # Offline machine: the page must load nothing from elsewhere.
    for text in (page.text, client.get("/static/app.js").text, client.get("/static/style.css").text):
        assert "http://" not in text and "https://" not in text


# --- errors: one line, worded as the CLI words them, naming the field -----------------------


def test_config_error_is_the_cli_message_and_names_the_field(client, capsys, tmp_path):
    bad = dict(example("group-a"), config={"max_num_batched_tokens": 8, "max_num_seqs": 32})
    msg = assert_one_line_error(client.post("/api/run", json={"scenario": bad}), field="config.max_num_batched_tokens")
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(bad))
    with pytest.raises(SystemExit) as e:
        cli_main(["validate", str(f)])
    assert e.value.code == 2
    cli_line = capsys.readouterr().err.strip()
    assert cli_line.endswith(msg), (cli_line, msg)


def test_request_error_names_the_request_field(client):
    bad = example("group-a")
    bad["requests"][3]["prompt_len"] = 9000  # >= max_model_len: vLLM's front end rejects it
    msg = assert_one_line_error(client.post("/api/run", json={"scenario": bad}))
    assert msg.startswith("requests[3].prompt_len"), msg
    assert client.post("/api/run", json={"scenario": bad}).json()["field"] == "requests[3].prompt_len"


def test_structural_error_names_the_path(client):
    bad = example("group-a")
    bad["requests"][2]["prompt_len"] = "many"
    msg = assert_one_line_error(client.post("/api/run", json={"scenario": bad}))
    assert "requests[2].prompt_len" in msg


@pytest.mark.parametrize("body,needle", [
    (b"{not json", "not valid JSON"),
    (b"[]", "must be an object with 'scenario'"),
    (b'{"scenario": 3}', "must be an object"),
    # The scenario file reader's JSON rules apply to bodies too: none of these may
    # raise inside the server.
    (b'{"scenario": ' + b"[" * 100000, "nest"),
    (b'{"scenario": {"max_steps": ' + b"9" * 5000 + b"}}", "digits"),
    (b'{"scenario": {"max_steps": NaN}}', "NaN"),
    (b'{"scenario": 1, "scenario": 2}', "more than once"),
    (b'{"scenario": "\xff"}', "UTF-8"),
])
def test_bad_bodies(client, body, needle):
    assert needle in assert_one_line_error(client.post("/api/run", content=body))


def test_limits(client):
    big = b'{"scenario": "' + b"x" * (core.MAX_BODY_BYTES + 10) + b'"}'
    assert "at most" in assert_one_line_error(client.post("/api/run", content=big), status=413)
    many = dict(example("group-a"), requests=[{"id": f"r{i}", "prompt_len": 1} for i in range(core.MAX_REQUESTS + 1)])
    assert "at most" in assert_one_line_error(client.post("/api/run", json={"scenario": many}), field="requests")
    long = dict(example("group-a"), max_steps=core.MAX_STEPS + 1)
    assert "at most" in assert_one_line_error(client.post("/api/run", json={"scenario": long}), field="max_steps")
    knob = dict(core.SEED_PRESETS["group-b"], D=10**6)
    assert assert_one_line_error(client.post("/api/seed", json=knob), field="D").startswith("D: ")
    assert assert_one_line_error(client.post("/api/compare", json={"scenario": example("group-a"), "configs": [{}] * 4}),
                                 field="configs")


def test_trace_size_limit(client, monkeypatch):
    monkeypatch.setattr(core, "MAX_REQUEST_STEPS", 50)
    msg = assert_one_line_error(client.post("/api/run", json={"scenario": example("group-b")}), field="max_steps")
    assert "request-steps" in msg


def test_compare_error_names_the_config(client):
    base = example("table3-b16")
    configs = [base["config"], dict(base["config"], max_num_seqs=0)]
    r = client.post("/api/compare", json={"scenario": base, "configs": configs})
    assert assert_one_line_error(r, field="configs[1].config.max_num_seqs").startswith("configs[1]: config.max_num_seqs")


def test_load_reports_invalid_json_as_load_scenario_does(client, tmp_path):
    r = client.post("/api/load", json={"name": "x.json", "text": "{\n  oops"})
    msg = assert_one_line_error(r)
    f = tmp_path / "x.json"
    f.write_text("{\n  oops")
    from schedspec.reference.scenario import ScenarioError

    with pytest.raises(ScenarioError) as e:
        load_scenario(f)
    assert msg == str(e.value).replace(str(f), "x.json")


# --- the command -------------------------------------------------------------------------------


def test_explore_command_errors_are_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli_main(["explore", "--no-browser", str(tmp_path / "missing.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing.json" in err
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        with pytest.raises(SystemExit) as e:
            cli_main(["explore", "--no-browser", "--port", str(busy.getsockname()[1])])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "--port" in err and "in use" in err
    finally:
        busy.close()


def test_other_hosts_are_refused():
    """A page elsewhere that rebinds its name to 127.0.0.1 still sends its own Host."""
    r = TestClient(create_app(), base_url="http://attacker.example").get("/api/meta")
    assert r.status_code == 400


def test_scenario_given_on_the_command_line_opens_as_given():
    raw = example("preemption")
    raw["config"]["max_num_seqs"] = 0  # still opens: the page shows the error next to the field
    m = TestClient(create_app(raw), base_url="http://127.0.0.1").get("/api/meta").json()
    assert m["initial"] == raw


def test_closed_form_agrees_with_the_spec_on_a_grid_of_knobs():
    """The two figures the page puts side by side agree wherever the run is long enough."""
    import itertools

    seen = set()
    for D, P, B, M, chunked in itertools.product([0, 3, 10, 16], [1, 24, 40], [4, 8, 16, 17, 32], [4, 32], [True, False]):
        try:
            r = core.seed({"D": D, "P": P, "B": B, "M": M, "chunked": chunked, "steps": 20})
        except core.ApiError:
            continue  # a config vLLM rejects
        seen.add(r["agreement"])
        assert r["agreement"] in ("agree", "beyond the steps shown"), (D, P, B, M, chunked, r["closed_form"], r["simulated"])
    assert "agree" in seen and "beyond the steps shown" in seen


@pytest.mark.parametrize("steps", [101, 102, 150, 500])
def test_group_b_agrees_for_any_step_count(client, steps):
    """The decodes run for the whole run whatever the steps: none finishes and frees
    the budget the closed form counts as theirs (they used to stop after 100 tokens)."""
    data = client.post("/api/seed", json=dict(core.SEED_PRESETS["group-b"], steps=steps)).json()
    assert data["agreement"] == "agree", (data["closed_form"], data["simulated"])
    trace = data["result"]["trace"]
    assert len(trace["steps"]) == steps and trace["summary"]["finished"] == 0
    assert grants(trace, "prompt") == [0] * steps
    assert data["decode_max_tokens"] == steps + 1
    assert all(r["max_tokens"] == steps + 1 for r in data["result"]["scenario"]["requests"] if r["id"] != "prompt")


def test_closed_form_agrees_where_the_default_kv_cache_would_run_out():
    """511 decodes for 500 steps outgrow the default 10 000 blocks; the built
    scenario raises num_gpu_blocks so nothing is preempted, as the closed form assumes."""
    r = core.seed({"D": 511, "P": 400, "B": 512, "M": 512, "steps": 500})
    assert r["agreement"] == "agree" and r["closed_form"]["steps"] == 400, (r["closed_form"], r["simulated"])
    assert not any(s["preempted"] for s in r["result"]["trace"]["steps"])
    assert r["result"]["scenario"]["config"]["num_gpu_blocks"] > 10000


def test_negative_prompt_len_is_reported_as_prompt_len(client):
    """With a prefix, a negative prompt_len was reported as an error in prefix_len."""
    bad = example("group-a")
    bad["requests"][2].update(prompt_len=-3, prefix_group="g", prefix_len=2)
    r = client.post("/api/run", json={"scenario": bad})
    assert_one_line_error(r, field="requests[2].prompt_len")


# --- only the server's own page may POST -----------------------------------------------------------


def test_the_page_carries_a_fresh_token_per_server():
    a, b = (page_token(TestClient(create_app(), base_url=BASE)) for _ in range(2))
    assert a != b and len(a) >= 32


@pytest.mark.parametrize("headers,why", [
    ({"Origin": "http://evil.example"}, "comes from http://evil.example"),
    ({"Origin": "http://localhost:9999"}, "comes from"),  # the same machine, another port: another origin
    ({"Origin": "null"}, "comes from null"),  # a sandboxed frame or a file:// page
    ({"Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
    ({"Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
    ({TOKEN_HEADER: None}, f"no {TOKEN_HEADER}"),
    ({TOKEN_HEADER: "guessed"}, f"a wrong {TOKEN_HEADER}"),
])
def test_posts_from_elsewhere_are_refused_before_running(monkeypatch, headers, why):
    c = TestClient(create_app(), base_url=BASE)
    sent = {TOKEN_HEADER: page_token(c), **headers}
    ran = []
    monkeypatch.setattr(core, "run_json", lambda data: ran.append(data) or {})
    # A form post: text/plain needs no CORS preflight, so a browser sends it from any page.
    r = c.post("/api/run", content=json.dumps({"scenario": example("group-a")}),
               headers={"Content-Type": "text/plain", **{k: v for k, v in sent.items() if v is not None}})
    assert why in assert_one_line_error(r, status=403, field=None)
    assert ran == []


@pytest.mark.parametrize("origin", [None, f"{BASE}", "http://localhost:8765"])
def test_posts_from_the_page_run(client, origin):
    headers = {"Origin": origin, "Sec-Fetch-Site": "same-origin"} if origin else {}
    r = client.post("/api/run", json={"scenario": example("group-a")}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["trace"]["steps"]


def test_gets_need_no_token():
    """The page itself and its metadata load without one: the token is in the page."""
    c = TestClient(create_app(), base_url=BASE)
    assert c.get("/api/meta").status_code == 200 and c.get("/").status_code == 200
    assert c.post("/api/seed", json=core.SEED_PRESETS["group-a"]).status_code == 403
