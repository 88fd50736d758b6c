"""How long `schedspec explore` takes to show a 2 000-request scenario in a real browser.

    .venv/bin/python benchmarks/explore_page.py [--requests 2000] [--repeat 3] [--screenshot FILE.png]

Starts `schedspec explore --no-browser --port 0`, drives Debian's Chromium
(scripts/install-browser.sh) through Playwright, opens a generated scenario
through the page's file input and prints, per repetition: the server's time
for the same run (POST /api/run, spec run + every property on every step +
JSON), the time from choosing the file to the timeline drawn on screen, and
the time to show a step's details after a click.  Needs no GPU and no network.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("SCHEDSPEC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def scenario(n: int, seed: int = 1) -> dict:
    """n requests arriving 20 a step, prompts of 16-512 tokens, EOS after 8-128 tokens:
    a few hundred steps with hundreds of requests running and waiting at once."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        reqs.append({"id": f"r{i}", "arrival_step": i // 20, "prompt_len": rng.randint(16, 512),
                     "max_tokens": 256, "output_len": rng.randint(8, 128)})
    return {"format": "schedspec.scenario/1", "name": f"bench-{n}-requests",
            "description": f"{n} requests, 20 arriving per step (benchmarks/explore_page.py)",
            "config": {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "num_gpu_blocks": 6000},
            "requests": reqs, "max_steps": 5000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--screenshot", metavar="FILE.png")
    args = ap.parse_args()
    if not os.access(CHROMIUM, os.X_OK):
        print(f"explore_page: no Chromium at {CHROMIUM}; run scripts/install-browser.sh as root", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    data = scenario(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{data['name']}.json"
        path.write_text(json.dumps(data))
        proc = subprocess.Popen([sys.executable, "-m", "schedspec", "explore", "--no-browser", "--port", "0"],
                                stdout=subprocess.PIPE, text=True)
        url = re.search(r"http://\S+/", proc.stdout.readline()).group(0)
        try:
            body = json.dumps({"scenario": data}).encode()
            # The server answers POSTs that carry the token it wrote into its page.
            with urllib.request.urlopen(url) as r:
                token = re.search(r'<meta name="schedspec-token" content="([^"]+)">', r.read().decode()).group(1)
            t = time.perf_counter()
            headers = {"Content-Type": "application/json", "X-Schedspec-Token": token}
            with urllib.request.urlopen(urllib.request.Request(url + "api/run", body, headers)) as r:
                answer = r.read()
            api_s = time.perf_counter() - t
            result = json.loads(answer)
            steps = len(result["trace"]["steps"])
            from schedspec.cli.page import core

            t, c = time.perf_counter(), time.process_time()
            core.run_json(data)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            print(f"scenario: {args.requests} requests, {steps} steps, answer {len(answer) / 1e6:.1f} MB; "
                  f"POST /api/run alone: {api_s:.2f} s; the same run in-process: {wall:.2f} s wall, "
                  f"{cpu:.2f} s CPU (wall above CPU = a busy machine)")
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = b.new_page(viewport={"width": 1400, "height": 950})
                page.set_default_timeout(120000)
                page.goto(url)
                page.wait_for_function("document.body.dataset.busy === '0' && document.body.dataset.gen !== '0'")
                for i in range(args.repeat):
                    gen = int(page.evaluate("document.body.dataset.gen"))
                    t = time.perf_counter()
                    page.locator("#file-input").set_input_files(str(path))
                    page.wait_for_function(
                        f"document.body.dataset.busy === '0' && Number(document.body.dataset.gen) > {gen}"
                        " && document.querySelector('.tl-canvas') !== null")
                    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                    shown_s = time.perf_counter() - t
                    canvas = page.locator(".tl-canvas")
                    lw, cw = (float(canvas.get_attribute(k)) for k in ("data-label-width", "data-col-width"))
                    t = time.perf_counter()
                    canvas.click(position={"x": lw + 3.5 * cw, "y": 20})
                    page.wait_for_function("document.querySelector('#step-detail').dataset.step === '3'")
                    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                    click_s = time.perf_counter() - t
                    fetch_ms, render_ms = (page.evaluate(f"Number(document.body.dataset.{k})") for k in ("fetchMs", "renderMs"))
                    print(f"run {i + 1}: file chosen -> timeline drawn {shown_s:.2f} s (of which the API call, "
                          f"transfer and JSON parse {fetch_ms / 1000:.2f} s, drawing {render_ms / 1000:.2f} s); "
                          f"click step 3 -> details {click_s:.3f} s")
                    page.evaluate("document.querySelector('#step-detail').dataset.step = ''")
                if args.screenshot:
                    page.screenshot(path=args.screenshot, full_page=True)
                b.close()
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
