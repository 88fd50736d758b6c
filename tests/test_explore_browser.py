"""`schedspec explore` in a real browser: Debian's Chromium driven by Playwright.

The server is the real command (`schedspec explore --no-browser --port 0`), the
browser is the system's Chromium (scripts/install-browser.sh installs it; never
`playwright install`, which downloads).  Where either is missing the tests skip
and say why.
"""

from __future__ import annotations

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
from schedspec.explore import core  # noqa: E402
from schedspec.reference.engine import run_scenario  # noqa: E402
from schedspec.reference.impl import SpecScheduler  # noqa: E402
from schedspec.reference.scenario import load_scenario  # noqa: E402

TIMEOUT_MS = 15000


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-m", "schedspec", "explore", "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if not m:
        proc.kill()
        pytest.fail(f"explore printed no URL: {line!r} {proc.stderr.read()!r}")
    yield m.group(0)
    # Ctrl-C stops it cleanly: exit status 0 and a last line saying so.
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "stopped" in out and "Traceback" not in err


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 950}, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server)
    settle(pg, 0)
    yield pg
    ctx.close()
    assert not errors, errors


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
    assert scenario.config["max_num_scheduled_tokens"] == 20
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
