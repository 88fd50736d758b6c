"""`schedspec explore` in a real browser: Debian's Chromium driven by Playwright.

The server is the real command (`schedspec explore --no-browser --port 0`), the
browser is the system's Chromium (scripts/install-browser.sh installs it; never
`playwright install`, which downloads).  Where either is missing the tests skip
and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest

CHROMIUM = os.environ.get("SCHEDSPEC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:
    pytest.skip("browser tests skipped: Playwright for Python is not installed (pip install -e '.[test]')",
                allow_module_level=True)
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"browser tests skipped: no Chromium at {CHROMIUM}; run scripts/install-browser.sh as root "
                "(Debian's chromium package) or set SCHEDSPEC_CHROMIUM", allow_module_level=True)

from schedspec.reference.example_files import EXAMPLES_DIR  # noqa: E402
from schedspec.cli.page import core  # noqa: E402
from schedspec.reference.engine import run_scenario  # noqa: E402
from schedspec.reference.impl import SpecScheduler  # noqa: E402
from schedspec.reference.scenario import load_scenario  # noqa: E402

TIMEOUT_MS = 15000


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "schedspec", "explore", "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if not m:
        proc.kill()
        pytest.fail(f"explore printed no URL: {line!r} {proc.stderr.read()!r}")
    return proc, m.group(0)


def stop_server(proc: subprocess.Popen) -> None:
    # Ctrl-C stops it cleanly: exit status 0 and a last line saying so.
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    stop_server(proc)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@contextlib.contextmanager
def open_page(browser, url: str):
    ctx = browser.new_context(viewport={"width": 1400, "height": 950}, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(url)
    settle(pg, 0)
    yield pg
    ctx.close()
    assert not errors, errors


@pytest.fixture
def page(browser, server):
    with open_page(browser, server) as pg:
        yield pg


def settle(pg, after_gen: int) -> int:
    """Wait until the page has an answer newer than `after_gen` and nothing in flight."""
    pg.wait_for_function(f"document.body.dataset.busy === '0' && Number(document.body.dataset.gen) > {after_gen}")
    return int(pg.evaluate("document.body.dataset.gen"))


def gen(pg) -> int:
    return int(pg.evaluate("document.body.dataset.gen"))


def click_step(pg, step: int, panel: int = 0) -> None:
    canvas = pg.locator(f'.panel[data-panel="{panel}"] .tl-canvas')
    d = {k: float(canvas.get_attribute(f"data-{k}")) for k in ("label-width", "head-height", "col-width")}
    # Scroll the timeline as a user would, so the step's column is in view, then click it.
    left = pg.locator(f'.panel[data-panel="{panel}"] .tl-scroll').evaluate(
        "(s, x) => { s.scrollLeft = Math.max(0, x); return s.scrollLeft; }", step * d["col-width"] - 100)
    canvas.click(position={"x": d["label-width"] + (step + 0.5) * d["col-width"] - left, "y": d["head-height"] / 2})
    expect(pg.locator("#step-detail")).to_have_attribute("data-step", str(step))


def prompt_grants(pg) -> list[int]:
    return [int(t) for t in pg.locator("#prompt-grants tr:nth-child(2) td").all_inner_texts()]


def request_row(pg, rid: str) -> dict[str, str]:
    cells = pg.locator(f'#requests tr[data-request="{rid}"] td').all_inner_texts()
    return dict(zip(("id", "granted", "num_computed_tokens", "state"), cells))


def test_group_b_prompt_gets_zero_tokens_every_step(page):
    g = gen(page)
    page.get_by_role("button", name="group B").click()
    settle(page, g)
    assert page.locator("#knob-D-num").input_value() == "16"
    assert prompt_grants(page) == [0] * 11  # steps 1..11, the prompt arrives at step 1
    expect(page.locator("#table3-row")).to_have_text("step 1: 16 of 16 decodes scheduled, prompt 0 tokens, 24 left")
    expect(page.locator("#closed-form")).to_contain_text("never while D ≥ B")
    for step in range(1, 12):
        click_step(page, step)
        row = request_row(page, "prompt")
        assert (row["granted"], row["state"]) == ("0", "waiting"), (step, row)
        expect(page.locator("#detail-summary")).to_contain_text("16 of 16 tokens granted")
    # Past the decodes' old 100-token end: they still run, and the two sides still agree.
    g = gen(page)
    page.locator("#knob-steps-num").fill("150")
    settle(page, g)
    expect(page.locator("#decode-max-tokens")).to_have_text("max(100, steps + 1) = 151")
    expect(page.locator("#seed-result")).to_have_attribute("data-agree", "yes")
    expect(page.locator("#agreement")).to_have_text("")
    assert prompt_grants(page) == [0] * 149


def test_table3_b16_six_tokens_a_step_for_four_steps(page):
    g = gen(page)
    page.get_by_role("button", name="B=16", exact=True).click()
    settle(page, g)
    assert prompt_grants(page) == [6, 6, 6, 6]  # its prefill completes at step 4
    expect(page.locator("#table3-row")).to_have_text("step 1: 10 of 10 decodes scheduled, prompt 6 tokens, 18 left")
    expect(page.locator("#simulated")).to_contain_text("4 steps")
    expect(page.locator("#closed-form")).to_contain_text("⌈24/6⌉ = 4 steps")
    for step in range(1, 5):
        click_step(page, step)
        row = request_row(page, "prompt")
        assert (row["granted"], row["num_computed_tokens"]) == ("6", str(6 * step)), (step, row)
    # Table 3 side by side: B = 8 | 16 | 32 on the same requests.
    g = gen(page)
    page.get_by_role("button", name="Table 3: B = 8 | 16 | 32").click()
    settle(page, g)
    expect(page.locator(".panel")).to_have_count(3)
    for panel, want in ((0, "0"), (1, "6"), (2, "22")):
        click_step(page, 1, panel)
        assert request_row(page, "prompt")["granted"] == want, panel


def test_load_file_click_step_and_check_verdicts(page):
    g = gen(page)
    page.locator("#file-input").set_input_files(str(EXAMPLES_DIR / "preemption.json"))
    settle(page, g)
    expect(page.locator("#scenario-info .name")).to_have_text("preemption")
    expect(page.locator("#cfg-num_gpu_blocks")).to_have_value("11")
    click_step(page, 1)
    verdicts = dict(zip(page.locator("#verdicts td.pname").all_inner_texts(),
                        page.locator("#verdicts td.verdict").all_inner_texts()))
    expected = core.run_json(json.loads((EXAMPLES_DIR / "preemption.json").read_text()))
    words = {"h": "holds", "n": "not applicable", "v": "violated"}
    assert verdicts == {n: words[c] for n, c in zip(expected["property_names"], expected["verdicts"][1]["codes"])}
    assert verdicts["preemption_only_on_allocation_failure"] == "holds"
    assert verdicts["running_before_waiting"] == "not applicable"
    expect(page.locator('#verdicts tr[data-property="running_before_waiting"] .why')).to_contain_text("Premise not met")
    expect(page.locator("#queues")).to_contain_text("preempted (1)")
    assert request_row(page, "r1")["state"].startswith("preempted")
    assert request_row(page, "r1")["num_computed_tokens"] == "0"
    free = expected["trace"]["steps"][1]["num_free_blocks"]
    expect(page.locator("#free-blocks")).to_have_text(f"{free} of 10 KV blocks free")


def test_config_error_shown_next_to_the_field(page):
    g = gen(page)
    page.locator("#cfg-max_num_seqs").fill("0")
    page.locator("#cfg-max_num_seqs").press("Enter")
    settle(page, g)
    try:
        core.run_json(dict(core.seed_scenario(core.seed_knobs(core.SEED_PRESETS["group-a"])),
                           config={"max_num_batched_tokens": 32, "max_num_scheduled_tokens": 16, "max_num_seqs": 0}))
    except core.ApiError as e:
        message = str(e)
    expect(page.locator("#err-max_num_seqs")).to_have_text(message)
    assert "\n" not in message and message.startswith("config.max_num_seqs")


def test_export_and_reimport_scenario_and_trace(page, tmp_path):
    g = gen(page)
    page.locator("#cfg-max_num_scheduled_tokens").fill("20")
    page.locator("#cfg-max_num_scheduled_tokens").press("Enter")
    settle(page, g)
    with page.expect_download() as d:
        page.locator("#export-scenario").click()
    scen = tmp_path / d.value.suggested_filename
    d.value.save_as(scen)
    with page.expect_download() as d:
        page.locator("#export-trace").click()
    trace_file = tmp_path / d.value.suggested_filename
    d.value.save_as(trace_file)
    # The CLI reads both: the scenario loads, and the trace is run_scenario's on it.
    scenario = load_scenario(scen)
    assert scenario.config.max_num_scheduled_tokens == 20
    assert json.loads(trace_file.read_text()) == run_scenario(scenario, SpecScheduler())
    r = subprocess.run([sys.executable, "-m", "schedspec", "run", str(scen), "--timeline", "none"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    # Re-import, by dropping the file on the page this time.
    g = gen(page)
    page.get_by_role("button", name="group B").click()
    g = settle(page, g)
    page.evaluate("""([name, text]) => {
        const dt = new DataTransfer();
        dt.items.add(new File([text], name, {type: "application/json"}));
        document.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""", [scen.name, scen.read_text()])
    settle(page, g)
    expect(page.locator("#cfg-max_num_scheduled_tokens")).to_have_value("20")
    expect(page.locator("#scenario-info .name")).to_have_text(scenario.name)
    click_step(page, 1)
    assert request_row(page, "prompt")["granted"] == "10"  # B - D = 20 - 10


def test_invalid_file_error_is_one_line(page, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{\n  \"format\": ")
    g = gen(page)
    page.locator("#file-input").set_input_files(str(bad))
    settle(page, g)
    text = page.locator("#scenario-error").inner_text()
    assert text.startswith("broken.json: not valid JSON") and "\n" not in text


# --- keyboard, screen readers, stale results, a stopped server, other origins ------------------------


def focused(pg, selector: str) -> bool:
    return pg.evaluate("(sel) => document.activeElement !== null && document.activeElement.matches(sel)", selector)


def tab_to(pg, selector: str, limit: int = 80, key: str = "Tab") -> int:
    """Presses Tab until `selector` has the focus, as a keyboard user would; how many presses it took."""
    for n in range(1, limit + 1):
        pg.keyboard.press(key)
        if focused(pg, selector):
            return n
    pytest.fail(f"{selector} not reached in {limit} presses of {key}; focus is on "
                + pg.evaluate("document.activeElement && document.activeElement.outerHTML.slice(0, 120)"))


CONTROLS = ("input, select, button, textarea, [role=button], [role=listbox], [role=option], [role=region], "
            "[tabindex]:not([tabindex='-1'])")


def test_every_control_has_an_accessible_name(page):
    click_step(page, 1)  # the step's details hold controls too
    # Chromium's own accessibility tree (DevTools protocol), not a re-computation of it.
    cdp = page.context.new_cdp_session(page)
    count = page.evaluate("""(sel) => {
        window.__controls = [...document.querySelectorAll(sel)].filter((e) => e.getClientRects().length > 0);
        return window.__controls.length;
    }""", CONTROLS)
    assert count > 40  # knobs, the config form, the timeline, the step's details
    unnamed, roles = [], set()
    for i in range(count):
        obj = cdp.send("Runtime.evaluate", {"expression": f"window.__controls[{i}]"})["result"]["objectId"]
        node = cdp.send("Accessibility.getPartialAXTree", {"objectId": obj, "fetchRelatives": False})["nodes"][0]
        role, name = node.get("role", {}).get("value"), node.get("name", {}).get("value", "")
        roles.add(role)
        if not name.strip():
            unnamed.append(page.evaluate(f"window.__controls[{i}].outerHTML.slice(0, 100)") + f" (role {role})")
    assert not unnamed, unnamed
    assert {"spinbutton", "slider", "button", "combobox", "listbox", "option", "region"} <= roles, roles
    # What the names say, where they were missing or are built by the page.
    expect(page.get_by_role("spinbutton", name="D · running decodes, exact value")).to_have_value("10")
    expect(page.get_by_role("listbox", name="steps of minimal-D10-P24-B16-M32-fcfs-chunked")).to_be_visible()
    expect(page.get_by_role("button", name="Open file…")).to_be_visible()
    expect(page.get_by_role("button", name="group A")).to_have_attribute("aria-pressed", "true")


def test_keyboard_only_open_a_file_and_read_a_steps_verdicts(page):
    # Playwright turns file chooser interception on without waiting for the browser, so
    # one opened right after expect_file_chooser() can slip past it; a listener from
    # the start keeps it on.
    page.on("filechooser", lambda chooser: None)
    # The first Tab stop is the way past the controls; this run tabs through them instead.
    page.keyboard.press("Tab")
    assert focused(page, "#skip-timeline")
    tab_to(page, "#open-file")
    g = gen(page)
    with page.expect_file_chooser() as chooser:
        page.keyboard.press("Enter")
    chooser.value.set_files(str(EXAMPLES_DIR / "preemption.json"))  # the OS's dialog, which a page cannot drive
    settle(page, g)
    expect(page.locator("#scenario-info .name")).to_have_text("preemption")

    tab_to(page, ".tl-scroll")
    listbox = page.get_by_role("listbox", name="steps of preemption")
    option = page.locator("#tl-opt-0")
    expect(listbox).to_be_focused()
    expect(listbox).to_have_attribute("aria-activedescendant", "tl-opt-0")
    expect(option).to_have_attribute("aria-posinset", "1")
    page.keyboard.press("ArrowRight")
    expect(option).to_have_attribute("aria-posinset", "2")
    expect(option).to_contain_text("step 1: ")
    expect(option).to_have_attribute("aria-selected", "false")
    page.keyboard.press("Enter")
    expect(page.locator("#step-detail")).to_have_attribute("data-step", "1")
    expect(page.locator("#detail-title")).to_be_focused()
    expect(page.locator("#free-blocks")).to_be_in_viewport()  # the step's KV blocks, under its title
    expect(option).to_have_attribute("aria-selected", "true")

    # The step's queues, then its verdicts, each one Tab stop and scrolled into view when reached.
    tab_to(page, "#queues", limit=5)
    expect(page.locator("#queues")).to_contain_text("preempted (1)")
    expect(page.locator("#queues")).to_be_in_viewport()
    tab_to(page, "#verdicts-wrap", limit=5)
    verdicts = page.get_by_role("region", name="Properties at step 1")
    expect(verdicts).to_be_focused()
    row = verdicts.locator('tr[data-property="preemption_only_on_allocation_failure"]')
    expect(row).to_be_in_viewport()
    expect(row.locator(".verdict")).to_have_text("holds")
    expect(verdicts.locator('tr[data-property="running_before_waiting"] .why')).to_contain_text("Premise not met")

    # Esc goes back to the timeline, where the arrows move the details along; Space opens the last step.
    page.keyboard.press("Escape")
    expect(listbox).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(page.locator("#step-detail")).to_have_attribute("data-step", "2")
    page.keyboard.press("End")
    page.keyboard.press(" ")
    last = str(int(page.locator(".tl-canvas").get_attribute("data-steps")) - 1)
    expect(page.locator("#step-detail")).to_have_attribute("data-step", last)
    expect(page.locator("#detail-title")).to_be_focused()


def test_skip_link_goes_to_the_timeline(page):
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to the timeline")).to_be_in_viewport()
    page.keyboard.press("Enter")
    assert focused(page, ".tl-scroll")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    expect(page.locator("#step-detail")).to_have_attribute("data-step", "1")


def assert_stale(pg, stale: bool) -> None:
    note = pg.locator("#stale-note")
    if stale:
        expect(pg.locator("#panels")).to_have_class(re.compile(r"\bstale\b"))
        expect(pg.locator(".tl-scroll").first).to_have_attribute("aria-disabled", "true")
        expect(pg.locator("#export-trace")).to_be_disabled()
        expect(note).to_be_visible()
        expect(note).to_contain_text("stale: ")
        expect(pg.locator("#status")).to_contain_text("not run: ")
    else:
        expect(pg.locator("#panels")).not_to_have_class(re.compile(r"\bstale\b"))
        expect(pg.locator(".tl-scroll").first).not_to_have_attribute("aria-disabled", "true")
        expect(pg.locator("#export-trace")).to_be_enabled()
        expect(note).to_be_hidden()
        expect(pg.locator("#status")).not_to_contain_text("not run")


def test_results_go_stale_on_an_error_and_live_again(page, tmp_path):
    g = gen(page)
    page.locator("#file-input").set_input_files(str(EXAMPLES_DIR / "preemption.json"))
    g = settle(page, g)
    click_step(page, 1)
    assert_stale(page, False)

    bad = tmp_path / "broken.json"
    bad.write_text("{\n  \"format\": ")
    page.locator("#file-input").set_input_files(str(bad))
    g = settle(page, g)
    assert_stale(page, True)
    expect(page.locator("#stale-note")).to_contain_text("broken.json: not valid JSON")
    expect(page.locator("#step-detail")).to_have_class(re.compile(r"\bstale\b"))
    # Redrawing (zoom) keeps them marked.
    page.locator("#zoom").fill("1")
    assert_stale(page, True)
    # The old steps are not offered as current: the timeline's keys do nothing.
    page.locator(".tl-scroll").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")
    expect(page.locator("#step-detail")).to_have_attribute("data-step", "1")
    # Even with the button forced back on, the old trace does not download.
    downloads = []
    page.on("download", lambda d: downloads.append(d))
    page.evaluate("() => { const b = document.querySelector('#export-trace'); b.disabled = false; b.click(); }")
    page.wait_for_timeout(300)
    assert downloads == []

    page.get_by_role("button", name="group B").click()
    g = settle(page, g)
    assert_stale(page, False)
    with page.expect_download() as d:
        page.locator("#export-trace").click()
    assert d.value.suggested_filename == "minimal-D16-P24-B16-M32-fcfs-chunked.trace.json"

    # A config vLLM rejects is an error too; fixing it makes the results current again.
    page.locator("#cfg-max_num_seqs").fill("0")
    page.locator("#cfg-max_num_seqs").press("Enter")
    g = settle(page, g)
    assert_stale(page, True)
    page.locator("#cfg-max_num_seqs").fill("32")
    page.locator("#cfg-max_num_seqs").press("Enter")
    settle(page, g)
    assert_stale(page, False)


def test_stopped_server_says_so_and_marks_results_stale(browser):
    proc, url = start_server()
    try:
        with open_page(browser, url) as pg:
            assert_stale(pg, False)
            stop_server(proc)
            g = gen(pg)
            pg.get_by_role("button", name="group B").click()
            settle(pg, g)
            origin = url.rstrip("/")
            expect(pg.locator("#status")).to_have_text(
                f"not run: the schedspec server at {origin} is not answering (was it stopped? restart it with "
                "`schedspec explore`, then reload this page)")
            assert_stale(pg, True)
            expect(pg.locator("#stale-note")).to_contain_text("is not answering")
            assert "Failed to fetch" not in pg.locator("body").inner_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_page_on_another_origin_cannot_run_the_spec(browser, server):
    """Another page the user has open (here on localhost, another port) posts text/plain,
    which needs no CORS preflight: the server must refuse it, not run it."""
    import http.server
    import threading

    script = f"""<!doctype html><script>
      const body = JSON.stringify({{scenario: {json.dumps(json.loads((EXAMPLES_DIR / "group-a.json").read_text()))}}});
      window.done = fetch("{server}api/run", {{method: "POST", mode: "no-cors", body,
          headers: {{"Content-Type": "text/plain"}}}})
        .then(() => fetch("{server}api/run", {{method: "POST", body, headers: {{"Content-Type": "text/plain"}}}}))
        .then((r) => r.text(), (e) => "blocked: " + e.message);
    </script>"""

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(script.encode())

        def log_message(self, *args):
            pass

    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    ctx = browser.new_context()
    try:
        pg = ctx.new_page()
        statuses = []
        pg.on("response", lambda r: "/api/run" in r.url and statuses.append(r.status))
        pg.goto(f"http://localhost:{evil.server_address[1]}/")
        answer = pg.evaluate("window.done")
        assert answer.startswith("blocked: ")  # the browser keeps any answer from the page
        pg.wait_for_timeout(200)
        assert statuses and set(statuses) == {403}, statuses  # and the server ran nothing
    finally:
        ctx.close()
        evil.shutdown()
