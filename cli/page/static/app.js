// schedspec explore: the page.  It computes no scheduling number itself: every
// grant, queue, block count, closed form and verdict comes from the server,
// which runs the spec (cli/page/core.py).  This file only lays out
// what the server returned.
"use strict";

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    // aria-*, data-* and role exist only as attributes: set as properties they
    // would be plain JS fields that the accessibility tree never sees.
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "role") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const kid of kids) e.append(kid);
  return e;
};

const S = {
  meta: null,
  scenario: null,      // the scenario as the page holds it (its config is the form's)
  source: "seed",      // "seed" | "file" | "example"
  results: [],         // one per panel: the server's run results
  titles: [],
  selected: null,      // {panel, step}
  gen: 0,              // bumped per request; stale answers are dropped
  inflight: 0,
  compare: null,       // {field, values} while side by side
  stale: null,         // why the results shown are not the current scenario's, or null
};

// The token the server wrote into the page; every POST carries it (cli/page/app.py).
const TOKEN = (document.querySelector('meta[name="schedspec-token"]') || {}).content || "";

// ---------------------------------------------------------------- server calls

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json", "X-Schedspec-Token": TOKEN},
    body: JSON.stringify(body)};
  const t0 = performance.now();
  let r;
  try {
    r = await fetch(path, opts);
  } catch (e) {
    // fetch rejects only when no answer came at all; the browser's words for that
    // ("Failed to fetch") do not say that the server is the one to look at.
    throw new Error(`the schedspec server at ${location.origin} is not answering ` +
      "(was it stopped? restart it with `schedspec explore`, then reload this page)");
  }
  let data;
  try { data = await r.json(); } catch (e) { data = {error: `server answered ${r.status} without JSON`}; }
  document.body.dataset.fetchMs = String(Math.round(performance.now() - t0));  // for benchmarks/explore_page.py
  if (!r.ok) {
    const err = new Error(data.error || `server answered ${r.status}`);
    err.field = data.field || null;
    throw err;
  }
  return data;
}

function busy(delta) {
  S.inflight += delta;
  document.body.dataset.busy = S.inflight > 0 ? "1" : "0";
  $("#status").textContent = S.inflight > 0 ? "running the spec…" : $("#status").dataset.done || "";
}

// Runs `work` as the page's newest request; an older one that answers later is ignored.
async function latest(work, onOk, onErr) {
  const gen = ++S.gen;
  busy(+1);
  try {
    const data = await work();
    if (gen === S.gen) onOk(data);
  } catch (e) {
    if (gen === S.gen) onErr(e);
  } finally {
    busy(-1);
    if (gen === S.gen) document.body.dataset.gen = String(gen);
  }
}

// ---------------------------------------------------------------- seed knobs

const KNOB_LABELS = {
  D: "D · running decodes", P: "P · prompt tokens", B: "B · token budget",
  M: "M · max_num_seqs", steps: "steps shown",
};
const SLIDER_MAX = {D: 64, P: 256, B: 128, M: 64, steps: 60};

function buildKnobs() {
  const box = $("#knobs");
  for (const [name, k] of Object.entries(S.meta.seed_knobs)) {
    const range = el("input", {type: "range", id: `knob-${name}`, min: k.min,
      max: Math.min(k.max, SLIDER_MAX[name]), value: k.default});
    const num = el("input", {type: "number", id: `knob-${name}-num`, min: k.min, max: k.max,
      value: k.default, "aria-label": `${KNOB_LABELS[name]}, exact value`});
    range.addEventListener("input", () => { num.value = range.value; seedChanged(); });
    num.addEventListener("input", () => {
      if (num.value !== "" && Number(num.value) <= Number(range.max)) range.value = num.value;
      seedChanged();
    });
    box.append(el("div", {class: "knob-row"}, el("label", {htmlFor: `knob-${name}`, text: KNOB_LABELS[name]}), range, num));
  }
  $("#knob-policy").addEventListener("change", seedChanged);
  $("#knob-chunked").addEventListener("change", seedChanged);
  for (const b of document.querySelectorAll("[data-preset]")) {
    b.addEventListener("click", () => setPreset(b.dataset.preset));
  }
}

function knobs() {
  const k = {};
  for (const name of Object.keys(S.meta.seed_knobs)) {
    const v = $(`#knob-${name}-num`).value.trim();
    k[name] = /^-?\d+$/.test(v) ? Number(v) : v;  // the server words what is wrong with it
  }
  k.policy = $("#knob-policy").value;
  k.chunked = $("#knob-chunked").checked;
  return k;
}

function setPreset(name) {
  const p = S.meta.seed_presets[name];
  for (const k of Object.keys(S.meta.seed_knobs)) {
    $(`#knob-${k}`).value = p[k];
    $(`#knob-${k}-num`).value = p[k];
  }
  $("#knob-policy").value = p.policy;
  $("#knob-chunked").checked = p.chunked;
  pressPreset(name);
  runSeed();
}

// The preset buttons are toggles: the one whose knobs are set shows pressed, to the eye and to a screen reader.
function pressPreset(name) {
  for (const b of document.querySelectorAll("[data-preset]")) {
    b.classList.toggle("on", b.dataset.preset === name);
    b.setAttribute("aria-pressed", String(b.dataset.preset === name));
  }
}

let seedTimer = null;
function seedChanged() {
  pressPreset(null);
  clearTimeout(seedTimer);
  seedTimer = setTimeout(runSeed, 120);
}

function runSeed() {
  clearTimeout(seedTimer);
  latest(() => api("/api/seed", knobs()), (data) => {
    S.source = "seed";
    S.scenario = data.result.scenario;
    S.compare = null;
    showSeed(data);
    fillConfigForm(S.scenario.config);
    showScenarioInfo();
    clearErrors();
    showResults([data.result], [S.scenario.name]);
  }, (e) => {
    $("#closed-form").textContent = "";
    $("#simulated").textContent = "";
    $("#prompt-grants").replaceChildren();
    $("#closed-form").append(el("span", {class: "error", text: e.message}));
    failed(e);
  });
}

function showSeed(data) {
  $("#seed-result").classList.remove("stale");
  $("#decode-max-tokens").textContent =
    `max(${S.meta.seed_decode_min_max_tokens}, steps + 1) = ${data.decode_max_tokens}`;
  $("#closed-form").textContent = data.closed_form.text;
  $("#simulated").textContent = data.simulated.text;
  $("#seed-result").dataset.agree = data.agreement === "differ" ? "no" : "yes";
  $("#agreement").textContent = data.agreement === "agree" ? "" : data.agreement === "differ" ?
    "the closed form and the spec differ here: the closed form's premises do not hold for these knobs" :
    "the spec's run stops before the step the closed form predicts: raise “steps shown”";
  const row = data.simulated.first_step;
  $("#table3-row").textContent = row ? `step ${row.step}: ${row.decodes_scheduled} of ${data.knobs.D} decodes scheduled, ` +
    `prompt ${row.prompt_tokens} tokens, ${row.prompt_left} left` : "";
  const t = $("#prompt-grants");
  const steps = el("tr", {}, el("th", {text: "step"}));
  const toks = el("tr", {}, el("th", {text: "prompt got"}));
  for (const [step, n] of data.simulated.grants) {
    steps.append(el("td", {text: String(step)}));
    toks.append(el("td", {text: String(n), class: n === 0 ? "zero" : "", "data-step": String(step)}));
  }
  t.replaceChildren(steps, toks);
}

// ---------------------------------------------------------------- scenario and config form

function buildConfigForm() {
  const form = $("#config-form");
  for (const f of S.meta.config_fields) {
    let input;
    if (f.kind === "bool" || f.kind === "choice") {
      input = el("select", {id: `cfg-${f.name}`, name: f.name});
      input.append(el("option", {value: "", text: `default (${f.default})`}));
      const opts = f.kind === "bool" ? ["true", "false"] : S.meta.policies;
      for (const o of opts) input.append(el("option", {value: o, text: o}));
    } else {
      input = el("input", {id: `cfg-${f.name}`, name: f.name, type: "text", inputMode: "numeric",
        placeholder: f.default === null ? "null (default)" : `${f.default} (default)`});
    }
    input.addEventListener("change", configChanged);
    if (input.tagName === "INPUT") input.addEventListener("input", configChangedSoon);
    form.append(el("div", {class: "field", "data-field": f.name},
      el("label", {htmlFor: `cfg-${f.name}`, text: f.name}), input,
      el("div", {class: "field-error", id: `err-${f.name}`, role: "alert"})));
  }
  form.addEventListener("submit", (e) => { e.preventDefault(); configChanged(); });
  const sel = $("#compare-field");
  for (const f of S.meta.config_fields) sel.append(el("option", {value: f.name, text: f.name}));
  sel.value = "max_num_scheduled_tokens";
}

function fillConfigForm(config) {
  for (const f of S.meta.config_fields) {
    const input = $(`#cfg-${f.name}`);
    const v = config && Object.prototype.hasOwnProperty.call(config, f.name) ? config[f.name] : undefined;
    input.value = v === undefined ? "" : v === null ? "null" : String(v);
  }
  // A field the file has that the spec does not know stays in the config: the server names it.
}

function formConfig() {
  const config = {};
  const known = new Set(S.meta.config_fields.map((f) => f.name));
  for (const [k, v] of Object.entries((S.scenario && S.scenario.config) || {})) if (!known.has(k)) config[k] = v;
  for (const f of S.meta.config_fields) {
    const raw = $(`#cfg-${f.name}`).value.trim();
    if (raw === "") continue;  // omitted: the format's default
    if (raw === "null") config[f.name] = null;
    else if (raw === "true" || raw === "false") config[f.name] = raw === "true";
    else if (/^-?\d+(\.\d+)?([eE][-+]?\d+)?$/.test(raw)) config[f.name] = Number(raw);
    else config[f.name] = raw;  // left as typed; the server says what the field must be
  }
  return config;
}

let cfgTimer = null;
function configChangedSoon() { clearTimeout(cfgTimer); cfgTimer = setTimeout(configChanged, 400); }
function configChanged() {
  clearTimeout(cfgTimer);
  if (!S.scenario) return;
  S.scenario = Object.assign({}, S.scenario, {config: formConfig()});
  if (S.source === "seed") {
    S.source = "edited";
    $("#seed-result").classList.add("stale");
    pressPreset(null);  // the knobs no longer describe what runs
  }
  runCurrent();
}

function clearErrors() {
  for (const e of document.querySelectorAll(".field-error")) e.textContent = "";
  for (const e of document.querySelectorAll(".field.bad")) e.classList.remove("bad");
  $("#scenario-error").textContent = "";
  $("#compare-error").textContent = "";
}

function showError(e, where = "#scenario-error") {
  clearErrors();
  const m = /^(?:configs\[\d+\]\.)?config\.(\w+)$/.exec(e.field || "");
  if (m && $(`#err-${m[1]}`) && where === "#scenario-error") {
    $(`#err-${m[1]}`).textContent = e.message;
    $(`#err-${m[1]}`).closest(".field").classList.add("bad");
  } else {
    $(where).textContent = e.message;
  }
  failed(e);
}

// A request failed: say so in the status line, and mark what is shown as the
// last good run's, so nothing reads or exports as the current scenario's.
function failed(e) {
  $("#status").classList.add("error-status");
  $("#status").dataset.done = "not run: " + e.message;
  $("#status").textContent = $("#status").dataset.done;
  document.body.dataset.error = e.message;
  markStale(e.message);
}

const STALE_PARTS = ["#panels", "#step-detail", "#seed-result"];

function markStale(why) {
  S.stale = why;
  for (const sel of STALE_PARTS) $(sel).classList.add("stale");
  $("#step-detail").setAttribute("aria-disabled", "true");
  for (const t of timelines) t.setStale(true);
  for (const b of ["#export-trace", "#step-prev", "#step-next"]) $(b).disabled = true;
  const note = $("#stale-note");
  note.hidden = S.results.length === 0;  // nothing shown, nothing to mark
  note.textContent = `stale: the timeline and step details below are from the last run that succeeded, ` +
    `not from the scenario now on the page (${why}); Export trace is off until a run succeeds`;
}

function clearStale() {
  S.stale = null;
  for (const sel of STALE_PARTS.slice(0, 2)) $(sel).classList.remove("stale");
  $("#step-detail").removeAttribute("aria-disabled");
  for (const b of ["#step-prev", "#step-next"]) $(b).disabled = false;
  $("#stale-note").hidden = true;
  $("#stale-note").textContent = "";
}

function showScenarioInfo() {
  const s = S.scenario;
  const n = Array.isArray(s.requests) ? s.requests.length : 0;
  $("#scenario-info").replaceChildren(
    el("div", {class: "name", text: String(s.name)}),
    el("div", {class: "desc", text: s.description || ""}),
    el("div", {class: "count", text: `${n} request${n === 1 ? "" : "s"}, ${(s.aborts || []).length} aborts, max_steps ${s.max_steps ?? "10000 (default)"}`}));
}

function runCurrent() {
  const scenario = S.scenario;
  const compare = S.compare;
  latest(() => compare ? api("/api/compare", {scenario, configs: compareConfigs(scenario, compare)})
                       : api("/api/run", {scenario}).then((r) => ({results: [r]})),
    (data) => {
      clearErrors();
      document.body.dataset.error = "";
      showScenarioInfo();
      showResults(data.results, compare ? compare.values.map((v) => `${compare.field} = ${JSON.stringify(v)}`) : [scenario.name]);
    },
    (e) => { showScenarioInfo(); showError(e, compare && /^configs/.test(e.field || "") ? "#compare-error" : "#scenario-error"); });
}

function openScenario(obj, source) {
  S.scenario = obj;
  S.source = source;
  S.compare = null;
  $("#seed-result").classList.add("stale");
  pressPreset(null);
  fillConfigForm(obj && typeof obj.config === "object" ? obj.config : {});
  runCurrent();
}

function openFile(file) {
  file.text().then((text) => latest(() => api("/api/load", {name: file.name, text}),
    (data) => openScenario(data.scenario, "file"), (e) => showError(e)));
}

// ---------------------------------------------------------------- side by side

function compareConfigs(scenario, cmp) {
  return cmp.values.map((v) => Object.assign({}, scenario.config || {}, {[cmp.field]: v}));
}

function startCompare(field, text) {
  const values = text.split(",").map((s) => s.trim()).filter((s) => s !== "").map((s) =>
    s === "true" ? true : s === "false" ? false : s === "null" ? null : /^-?\d+(\.\d+)?$/.test(s) ? Number(s) : s);
  if (!S.scenario) return;
  if (values.length < 2 || values.length > S.meta.limits.max_compare) {
    $("#compare-error").textContent = `values: give 2 to ${S.meta.limits.max_compare} values, comma separated`;
    return;
  }
  S.compare = {field, values};
  runCurrent();
}

// ---------------------------------------------------------------- timeline (canvas)

const COLORS = {
  decode: "#2f6fdb", prefill: "#e8912d", zeroWait: "#8a8f98", zeroRun: "#c8372d",
  pre: "#c8372d", fin: "#1e8a4c", unused: "#e9ebef", grid: "#eef0f3", text: "#1d2129",
  sel: "rgba(255, 205, 40, 0.28)", label: "#3d4450", cursor: "#1d2129",
};
const LABEL_W = 96, HEAD_H = 58;

function index(result) {
  // Lookups into the trace, built once per result, so drawing is a read per cell.
  const steps = result.trace.steps;
  const reqs = result.scenario.requests.map((r) => r.id);
  const row = new Map(reqs.map((id, i) => [id, i]));
  const perStep = steps.map((s) => ({
    grant: new Map(s.scheduled),
    sampled: new Set(s.sampled || []),
    pre: new Set(s.preempted),
    fin: new Map(s.finished),
    waiting: new Set(s.waiting),
    running: new Set(s.running),
    total: s.scheduled.reduce((a, g) => a + g[1], 0),  // summed for the bar; the server's list is what is drawn
  }));
  return {reqs, row, perStep};
}

function rowHeight(n) {
  const v = $("#row-size").value;
  if (v !== "auto") return Number(v);
  return n <= 60 ? 20 : n <= 400 ? 8 : 3;
}

function colWidth(budget, nsteps) {
  const base = Math.max(40, Math.min(140, budget * 6));
  const w = base * Math.pow(1.5, Number($("#zoom").value));
  return Math.max(6, Math.min(400, nsteps > 400 && $("#zoom").value === "0" ? Math.min(w, 16) : w));
}

// Side by side, every panel draws a token with the same width, so a budget twice
// as large is a column twice as wide.
function colWidths(results) {
  const own = results.map((r) => colWidth(r.step_budget, r.trace.steps.length));
  if (results.length === 1) return own;
  const px = Math.min(...own.map((w, i) => w / results[i].step_budget));
  return results.map((r) => Math.max(12, r.step_budget * px));
}

class Timeline {
  constructor(panelIndex, result, title, colW) {
    this.i = panelIndex;
    this.r = result;
    this.ix = index(result);
    this.budget = result.step_budget;
    const n = this.ix.reqs.length;
    this.rowH = rowHeight(n);
    this.colW = colW;
    this.root = el("div", {class: "panel", "data-panel": String(panelIndex)});
    const s = result.trace.summary;
    const head = el("div", {class: "panel-head"},
      el("h2", {text: title}),
      el("span", {class: "panel-sum", text:
        `${result.trace.steps.length} steps · budget ${this.budget} tokens/step · ${s.finished} of ${n} finished` +
        (s.unfinished.length ? ` · ${s.unfinished.length} unfinished` : "") + ` · ${result.num_usable_blocks} usable KV blocks`}),
      el("span", {class: "panel-verdict " + (this.violations() ? "bad" : "ok"),
        text: this.violations() ? `${this.violations()} property violations` : "every property holds"}));
    // The canvas is a picture; what a keyboard and a screen reader use is the
    // listbox around it.  Its one option element stands for the step under the
    // cursor (aria-posinset of aria-setsize), so ten thousand steps stay one node.
    this.cursor = 0;
    this.scroll = el("div", {class: "tl-scroll", role: "listbox", tabIndex: 0,
      "aria-label": `steps of ${title}`, "aria-orientation": "horizontal",
      "aria-describedby": "tl-keys stale-note", "aria-activedescendant": `tl-opt-${panelIndex}`});
    this.spacer = el("div", {class: "tl-spacer"});
    this.canvas = el("canvas", {class: "tl-canvas", "aria-hidden": "true"});
    this.option = el("div", {class: "sr-only", role: "option", id: `tl-opt-${panelIndex}`,
      "aria-setsize": String(result.trace.steps.length)});
    this.scroll.append(this.canvas, this.spacer, this.option);
    this.root.append(head, this.scroll);
    this.setStale(S.stale !== null);
    this.describe();
    const totalW = LABEL_W + result.trace.steps.length * this.colW + 8;
    const totalH = HEAD_H + n * this.rowH + 6;
    this.spacer.style.width = totalW + "px";
    this.spacer.style.height = totalH + "px";
    this.scroll.style.height = Math.min(totalH + 18, Math.max(200, window.innerHeight * (S.results.length > 1 ? 0.34 : 0.62))) + "px";
    this.canvas.dataset.labelWidth = LABEL_W;
    this.canvas.dataset.headHeight = HEAD_H;
    this.canvas.dataset.colWidth = this.colW;
    this.canvas.dataset.rowHeight = this.rowH;
    this.canvas.dataset.steps = result.trace.steps.length;
    this.scroll.addEventListener("scroll", () => this.schedule());
    this.scroll.addEventListener("keydown", (e) => this.key(e));
    this.scroll.addEventListener("focus", () => this.schedule());  // the cursor is drawn only while focused
    this.scroll.addEventListener("blur", () => this.schedule());
    this.canvas.addEventListener("click", (e) => this.click(e));
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => { $("#tooltip").hidden = true; });
  }

  violations() {
    if (this._v === undefined) this._v = this.r.verdicts.filter((v) => v.codes.includes("v")).length;
    return this._v;
  }

  schedule() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => { this.pending = 0; this.draw(); });
  }

  hit(e) {
    const rect = this.canvas.getBoundingClientRect();
    const x = e.clientX - rect.left, y = e.clientY - rect.top;
    const step = x < LABEL_W ? null : Math.floor((x - LABEL_W + this.scroll.scrollLeft) / this.colW);
    const row = y < HEAD_H ? null : Math.floor((y - HEAD_H + this.scroll.scrollTop) / this.rowH);
    const nsteps = this.r.trace.steps.length;
    return {step: step !== null && step >= 0 && step < nsteps ? step : null,
            row: row !== null && row >= 0 && row < this.ix.reqs.length ? row : null};
  }

  click(e) {
    const h = this.hit(e);
    if (h.step !== null) select(this.i, h.step);
  }

  setStale(on) {
    if (on) this.scroll.setAttribute("aria-disabled", "true"); else this.scroll.removeAttribute("aria-disabled");
  }

  // The option's words: what the tooltip says of the step's column, and whether its details are shown.
  describe() {
    const k = this.cursor, st = this.r.trace.steps[k];
    if (!st) { this.option.textContent = "no steps"; return; }
    const p = this.ix.perStep[k], v = this.r.verdicts[k];
    const bad = (v.codes.match(/v/g) || []).length;
    const shown = S.selected && S.selected.panel === this.i && S.selected.step === k;
    this.option.setAttribute("aria-posinset", String(k + 1));
    this.option.setAttribute("aria-selected", String(Boolean(shown)));
    this.option.textContent = `step ${st.step}: ${p.total} of ${this.budget} tokens granted, ` +
      `${st.running.length} running, ${st.waiting.length} waiting, ` +
      (bad ? `${bad} property violation${bad === 1 ? "" : "s"}` : "every property holds") +
      (shown ? ", details shown" : "");
  }

  setCursor(k) {
    const n = this.r.trace.steps.length;
    this.cursor = Math.max(0, Math.min(n - 1, k));
    this.reveal(this.cursor);
    this.describe();
    this.schedule();
  }

  // Scrolls the timeline so step k's column is in view.
  reveal(k) {
    const x = k * this.colW, sc = this.scroll;
    if (x < sc.scrollLeft || x > sc.scrollLeft + sc.clientWidth - LABEL_W - this.colW) {
      sc.scrollLeft = Math.max(0, x - (sc.clientWidth - LABEL_W) / 2);
    }
  }

  key(e) {
    if (S.stale !== null) return;  // an old run's steps are not offered as the current scenario's
    const steps = {ArrowLeft: -1, ArrowRight: +1, PageUp: -10, PageDown: +10};
    if (e.key in steps || e.key === "Home" || e.key === "End") {
      e.preventDefault();
      const k = e.key === "Home" ? 0 : e.key === "End" ? this.r.trace.steps.length - 1 : this.cursor + steps[e.key];
      this.setCursor(k);
      // With this panel's details open, they follow the cursor, as the arrows do elsewhere on the page.
      if (S.selected && S.selected.panel === this.i) showStep(this.i, this.cursor);
    } else if (e.key === "Enter" || e.key === " ") {
      e.preventDefault();
      showStep(this.i, this.cursor);
      $("#detail-title").focus();
    }
  }

  hover(e) {
    const h = this.hit(e);
    const tip = $("#tooltip");
    if (h.step === null) { tip.hidden = true; return; }
    const st = this.r.trace.steps[h.step], p = this.ix.perStep[h.step];
    let text;
    if (h.row === null) {
      text = `step ${st.step}: ${p.total} of ${this.budget} tokens granted, ${this.budget - p.total} unused · ${st.running.length} running, ${st.waiting.length} waiting · ${st.num_free_blocks} free KV blocks`;
    } else {
      const id = this.ix.reqs[h.row];
      const g = p.grant.get(id);
      const nct = st.num_computed_tokens[id];
      const state = p.fin.has(id) ? `finished (${p.fin.get(id)})` : p.pre.has(id) ? "preempted" :
        p.running.has(id) ? "running" : p.waiting.has(id) ? "waiting" : "not in the scheduler";
      text = `step ${st.step} · ${id}: ${g === undefined ? 0 : g} tokens` +
        (g !== undefined ? (p.sampled.has(id) ? ", sampled a token" : ", prefill chunk") : "") +
        ` · ${state}` + (nct !== undefined ? ` · num_computed_tokens ${nct}` : "");
    }
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 8) + "px";
    tip.style.top = (e.clientY + 16) + "px";
  }

  draw() {
    const c = this.canvas, sc = this.scroll;
    const w = sc.clientWidth, h = sc.clientHeight;
    const dpr = window.devicePixelRatio || 1;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
      c.style.width = w + "px"; c.style.height = h + "px";
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const {colW, rowH, budget} = this;
    const px = colW / budget;  // pixels per token: a block's width is its grant
    const steps = this.r.trace.steps, ix = this.ix;
    const x0 = sc.scrollLeft, y0 = sc.scrollTop;
    const s0 = Math.max(0, Math.floor(x0 / colW)), s1 = Math.min(steps.length, Math.ceil((x0 + w - LABEL_W) / colW) + 1);
    const r0 = Math.max(0, Math.floor(y0 / rowH)), r1 = Math.min(ix.reqs.length, Math.ceil((y0 + h - HEAD_H) / rowH) + 1);
    const X = (k) => LABEL_W + k * colW - x0;
    const Y = (r) => HEAD_H + r * rowH - y0;
    const sel = S.selected && S.selected.panel === this.i ? S.selected.step : null;
    const cur = document.activeElement === this.scroll ? this.cursor : null;
    g.font = `${Math.min(12, Math.max(9, rowH - 7))}px system-ui, sans-serif`;
    g.textBaseline = "middle";

    // grid rows
    g.save();
    g.beginPath(); g.rect(LABEL_W, HEAD_H, w - LABEL_W, h - HEAD_H); g.clip();
    for (let k = s0; k < s1; k++) {
      if (k % 2 === 1) { g.fillStyle = "#f7f8fa"; g.fillRect(X(k), HEAD_H, colW, h); }
      if (k === sel) { g.fillStyle = COLORS.sel; g.fillRect(X(k), HEAD_H, colW, h); }
    }
    const gap = colW > 10 ? 1 : 0, inset = rowH >= 8 ? 2 : rowH >= 4 ? 1 : 0;
    for (let k = s0; k < s1; k++) {
      const p = ix.perStep[k], st = steps[k];
      const x = X(k) + gap;
      for (let r = r0; r < r1; r++) {
        const id = ix.reqs[r], y = Y(r) + inset, bh = rowH - 2 * inset;
        const n = p.grant.get(id);
        if (n !== undefined) {
          const bw = Math.max(2, n * px - (gap && n * px > 4 ? 1 : 0));
          g.fillStyle = p.sampled.has(id) ? COLORS.decode : COLORS.prefill;
          g.fillRect(x, y, Math.min(bw, colW - gap), bh);
          if (rowH >= 14 && bw >= 16) {
            g.fillStyle = "#fff"; g.textAlign = "left"; g.fillText(String(n), x + 3, y + bh / 2 + 0.5);
          }
        } else if (p.pre.has(id)) {
          // drawn below, with the marks
        } else if (p.waiting.has(id) || p.running.has(id)) {
          const col = p.running.has(id) ? COLORS.zeroRun : COLORS.zeroWait;
          if (rowH >= 8) {
            g.strokeStyle = col; g.lineWidth = 1;
            g.setLineDash(p.running.has(id) ? [] : [2, 2]);
            g.strokeRect(x + 0.5, y + 0.5, Math.min(colW - gap - 2, 18), bh - 1);
            g.setLineDash([]);
            if (rowH >= 14) { g.fillStyle = col; g.textAlign = "center"; g.fillText("0", x + Math.min(colW - gap - 2, 18) / 2 + 0.5, y + bh / 2 + 0.5); }
          } else {
            g.fillStyle = col; g.globalAlpha = 0.35; g.fillRect(x, y, Math.min(colW - gap, 6), bh); g.globalAlpha = 1;
          }
        }
        if (p.pre.has(id)) {
          g.fillStyle = COLORS.pre;
          g.fillRect(x, y, Math.max(3, Math.min(colW - gap, rowH >= 14 ? 14 : 4)), bh);
          if (rowH >= 14) { g.fillStyle = "#fff"; g.textAlign = "center"; g.fillText("P", x + 7, y + bh / 2 + 0.5); }
        }
        if (p.fin.has(id)) {
          const fx = X(k) + colW - (rowH >= 14 ? 13 : 4);
          g.fillStyle = p.fin.get(id) === "aborted" ? COLORS.pre : COLORS.fin;
          if (rowH >= 14) { g.textAlign = "center"; g.font = "bold 12px system-ui, sans-serif"; g.fillText(p.fin.get(id) === "aborted" ? "✕" : "✓", fx + 6, y + bh / 2 + 0.5); g.font = `${Math.min(12, Math.max(9, rowH - 7))}px system-ui, sans-serif`; }
          else g.fillRect(fx, y, 3, bh);
        }
      }
      if (gap) { g.fillStyle = COLORS.grid; g.fillRect(X(k) + colW - 1, HEAD_H, 1, h); }
    }
    g.restore();

    // header: step numbers and the budget bar (the step's grants side by side; the rest is unused)
    g.fillStyle = "#fff"; g.fillRect(0, 0, w, HEAD_H);
    g.save();
    g.beginPath(); g.rect(LABEL_W, 0, w - LABEL_W, HEAD_H); g.clip();
    const every = Math.max(1, Math.ceil(28 / colW));
    g.font = "11px system-ui, sans-serif"; g.textAlign = "center";
    for (let k = s0; k < s1; k++) {
      if (k === sel) { g.fillStyle = COLORS.sel; g.fillRect(X(k), 0, colW, HEAD_H); }
      if (k % every === 0) { g.fillStyle = COLORS.label; g.fillText(String(steps[k].step), X(k) + colW / 2, 10); }
      const by = 22, bh2 = 26, bx = X(k) + gap;
      const inner = colW - 2 * gap;
      g.fillStyle = COLORS.unused; g.fillRect(bx, by, inner, bh2);
      let cx = bx;
      const scale = inner / budget;
      for (const [id, n] of steps[k].scheduled) {
        g.fillStyle = ix.perStep[k].sampled.has(id) ? COLORS.decode : COLORS.prefill;
        const bw = n * scale;
        g.fillRect(cx, by, bw, bh2);
        if (bw >= 3) { g.fillStyle = "rgba(255,255,255,0.8)"; g.fillRect(cx + bw - 0.5, by, 0.5, bh2); }
        cx += bw;
      }
      const used = ix.perStep[k].total;
      if (colW >= 30) {
        g.fillStyle = COLORS.text; g.fillText(`${used}/${budget}`, X(k) + colW / 2, by + bh2 + 7);
      }
    }
    g.restore();
    g.font = "11px system-ui, sans-serif"; g.textAlign = "left"; g.fillStyle = COLORS.label;
    g.fillText("step", 6, 10); g.fillText("budget used", 6, 35);
    g.fillStyle = "#d5d9e0"; g.fillRect(0, HEAD_H - 1, w, 1);

    // the keyboard's cursor: a frame around its column, over everything
    if (cur !== null && cur >= s0 && cur < s1) {
      g.save(); g.beginPath(); g.rect(LABEL_W, 0, w - LABEL_W, h); g.clip();
      g.strokeStyle = COLORS.cursor; g.lineWidth = 2; g.setLineDash([]);
      g.strokeRect(X(cur) + 1, 1, colW - 2, h - 2);
      g.restore();
    }

    // row labels
    g.fillStyle = "#fff"; g.fillRect(0, HEAD_H, LABEL_W, h);
    g.fillStyle = "#d5d9e0"; g.fillRect(LABEL_W - 1, 0, 1, h);
    if (rowH >= 8) {
      g.save(); g.beginPath(); g.rect(0, HEAD_H, LABEL_W - 2, h); g.clip();
      g.font = `${Math.min(12, rowH - 3)}px ui-monospace, monospace`; g.textAlign = "right"; g.fillStyle = COLORS.text;
      for (let r = r0; r < r1; r++) g.fillText(ix.reqs[r], LABEL_W - 6, Y(r) + rowH / 2 + 0.5);
      g.restore();
    } else {
      g.save(); g.beginPath(); g.rect(0, HEAD_H, LABEL_W - 2, h); g.clip();
      g.font = "10px ui-monospace, monospace"; g.textAlign = "right"; g.fillStyle = COLORS.label;
      const every2 = Math.ceil(14 / rowH);
      for (let r = r0 - (r0 % every2); r < r1; r += every2) g.fillText(ix.reqs[r], LABEL_W - 6, Y(r) + rowH / 2);
      g.restore();
    }
    this.canvas.dataset.drawn = String(Number(this.canvas.dataset.drawn || 0) + 1);
  }
}

let timelines = [];

// A run that succeeded: its results replace what is shown, which is current again.
function showResults(results, titles) {
  const t0 = performance.now();
  clearStale();
  $("#status").classList.remove("error-status");
  S.results = results;
  S.titles = titles;
  render();
  const r = results[0];
  $("#status").dataset.done = results.length > 1 ? `${results.length} configs side by side` :
    `${r.trace.steps.length} steps of ${r.scenario.requests.length} requests on the spec`;
  $("#status").textContent = $("#status").dataset.done;
  document.body.dataset.renderMs = String(Math.round(performance.now() - t0));
}

// Lays out S.results (again, after a zoom or a row size change: stale ones stay stale).
function render() {
  const results = S.results, titles = S.titles;
  const panels = $("#panels");
  const widths = colWidths(results);
  timelines = results.map((r, i) => new Timeline(i, r, titles[i], widths[i]));
  panels.replaceChildren(...timelines.map((t) => t.root));
  panels.classList.toggle("multi", results.length > 1);
  for (const t of timelines) t.draw();
  const keep = S.selected && S.selected.panel < results.length &&
    S.selected.step < results[S.selected.panel].trace.steps.length ? S.selected : null;
  if (keep) showStep(keep.panel, keep.step); else { S.selected = null; $("#step-detail").hidden = true; }
  $("#export-trace").disabled = S.stale !== null || results.length !== 1;
  $("#compare-off").disabled = results.length === 1;
}

// ---------------------------------------------------------------- step detail

// A step chosen by the user; ignored while the results are stale.
function select(panel, step) {
  if (S.stale === null) showStep(panel, step);
}

function showStep(panel, step) {
  S.selected = {panel, step};
  timelines[panel].cursor = step;
  for (const t of timelines) { t.describe(); t.schedule(); }
  const r = S.results[panel];
  const st = r.trace.steps[step];
  const v = r.verdicts[step];
  const ix = timelines[panel].ix;
  const p = ix.perStep[step];
  const box = $("#step-detail");
  box.hidden = false;
  box.dataset.step = String(st.step);
  box.dataset.panel = String(panel);
  $("#detail-title").textContent = `Step ${st.step}` + (S.results.length > 1 ? ` · ${S.titles[panel]}` : "");
  $("#queues-title").textContent = `Queues after step ${st.step}`;
  $("#verdicts-title").textContent = `Properties at step ${st.step}`;
  const unused = r.step_budget - p.total;
  $("#detail-summary").replaceChildren(
    el("span", {text: `${p.total} of ${r.step_budget} tokens granted`}),
    el("span", {class: unused > 0 ? "unused" : "", text: `${unused} unused`}),
    el("span", {text: `${st.num_free_blocks} of ${r.num_usable_blocks} KV blocks free`, id: "free-blocks"}));

  const body = $("#verdicts tbody");
  body.replaceChildren();
  r.property_names.forEach((name, i) => {
    const code = v.codes[i];
    const doc = S.meta.properties.find((q) => q.name === name).doc;
    const word = code === "h" ? "holds" : code === "n" ? "not applicable" : "violated";
    const why = code === "v" ? v.violations[name] : code === "n" ? `Premise not met in this step, so not tested: ${doc}` : doc;
    body.append(el("tr", {class: "v-" + code, "data-property": name},
      el("td", {class: "pname", text: name}), el("td", {class: "verdict", text: word}), el("td", {class: "why", text: why})));
  });

  const SHOW = 120;  // a queue of thousands is counted, and its head listed
  const q = (label, ids, cls) => el("div", {class: "queue " + (cls || "")},
    el("b", {text: `${label} (${ids.length})`}), el("span", {text: ids.length ? ids.slice(0, SHOW).join(" ") : "—"}),
    ...(ids.length > SHOW ? [el("span", {class: "more", text: ` … and ${ids.length - SHOW} more`})] : []));
  $("#queues").replaceChildren(
    q("running", st.running, "q-running"), q("waiting", st.waiting, "q-waiting"),
    ...(st.new.length ? [q("admitted (new)", st.new)] : []),
    ...(st.resumed.length ? [q("resumed", st.resumed)] : []),
    ...(st.preempted.length ? [q("preempted", st.preempted, "q-pre")] : []),
    ...(st.finished.length ? [q("finished", st.finished.map(([id, why]) => `${id} (${why})`), "q-fin")] : []));

  // Every request the scheduler holds after the step, plus those that finished in it.
  const rows = [];
  const find = $("#req-filter").value.trim();
  const ids = ix.reqs.filter((id) => (id in st.num_computed_tokens || p.fin.has(id)) && (!find || id.includes(find)));
  const LIMIT = 500;
  for (const id of ids.slice(0, LIMIT)) {
    const g = p.grant.get(id);
    const state = p.fin.has(id) ? `finished (${p.fin.get(id)})` : p.pre.has(id) ? "preempted → waiting" :
      p.running.has(id) ? "running" : "waiting";
    rows.push(el("tr", {"data-request": id, class: g === undefined ? "nogrant" : ""},
      el("td", {text: id}), el("td", {class: "granted", text: String(g === undefined ? 0 : g)}),
      el("td", {class: "nct", text: id in st.num_computed_tokens ? String(st.num_computed_tokens[id]) : "—"}),
      el("td", {text: state})));
  }
  $("#requests tbody").replaceChildren(...rows);
  $("#req-count").textContent = (ids.length > LIMIT ? `(first ${LIMIT} of ${ids.length}; narrow with find, or export the trace)` : `(${ids.length})`) + (find ? ` matching “${find}”` : "");
}

function move(delta) {
  if (!S.selected) return;
  const n = S.results[S.selected.panel].trace.steps.length;
  const k = Math.max(0, Math.min(n - 1, S.selected.step + delta));
  select(S.selected.panel, k);
  timelines[S.selected.panel].reveal(k);
}

// ---------------------------------------------------------------- export (downloads; the server writes nothing)

function download(name, obj, indent) {
  const blob = new Blob([JSON.stringify(obj, null, indent) + "\n"], {type: "application/json"});
  const a = el("a", {href: URL.createObjectURL(blob), download: name});
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

function safeName(s) { return String(s || "scenario").replace(/[^A-Za-z0-9._-]+/g, "_").slice(0, 80); }

// ---------------------------------------------------------------- start

async function main() {
  S.meta = await api("/api/meta");
  buildKnobs();
  buildConfigForm();
  const sel = $("#example-select");
  for (const name of S.meta.examples) sel.append(el("option", {value: name, text: name}));
  sel.addEventListener("change", () => {
    if (!sel.value) return;
    const name = sel.value;
    latest(() => api(`/api/example/${encodeURIComponent(name)}`), (data) => openScenario(data, "example"), (e) => showError(e));
    sel.value = "";
  });
  // A real button opens the (hidden) file input: focusable, and Enter and Space work as on any button.
  $("#open-file").addEventListener("click", () => $("#file-input").click());
  $("#skip-timeline").addEventListener("click", (e) => {
    const tl = document.querySelector(".tl-scroll");
    if (tl) { e.preventDefault(); tl.focus(); }
  });
  $("#file-input").addEventListener("change", (e) => { if (e.target.files[0]) openFile(e.target.files[0]); e.target.value = ""; });
  document.addEventListener("dragover", (e) => { e.preventDefault(); document.body.classList.add("dragging"); });
  document.addEventListener("dragleave", (e) => { if (!e.relatedTarget) document.body.classList.remove("dragging"); });
  document.addEventListener("drop", (e) => {
    e.preventDefault(); document.body.classList.remove("dragging");
    if (e.dataTransfer.files[0]) openFile(e.dataTransfer.files[0]);
  });
  $("#export-scenario").addEventListener("click", () => {
    if (S.scenario) download(`${safeName(S.scenario.name)}.json`, Object.assign({}, S.scenario, {config: formConfig()}), 2);
  });
  $("#export-trace").addEventListener("click", () => {
    if (S.results.length === 1 && S.stale === null) download(`${safeName(S.results[0].scenario.name)}.trace.json`, S.results[0].trace, 1);
  });
  $("#compare-run").addEventListener("click", () => startCompare($("#compare-field").value, $("#compare-values").value));
  $("#compare-table3").addEventListener("click", () => {
    $("#compare-field").value = "max_num_scheduled_tokens";
    $("#compare-values").value = "8, 16, 32";
    if (S.source !== "seed" || !S.scenario || !/^minimal-D10-P24-/.test(S.scenario.name)) {
      setPresetThen("table3-b16", () => startCompare("max_num_scheduled_tokens", "8, 16, 32"));
    } else startCompare("max_num_scheduled_tokens", "8, 16, 32");
  });
  $("#compare-off").addEventListener("click", () => { S.compare = null; runCurrent(); });
  $("#req-filter").addEventListener("input", () => S.selected && select(S.selected.panel, S.selected.step));
  $("#step-prev").addEventListener("click", () => move(-1));
  $("#step-next").addEventListener("click", () => move(+1));
  document.addEventListener("keydown", (e) => {
    if (e.target.closest("input, select, textarea, [role=listbox]")) return;  // their arrows are their own
    if (e.key === "ArrowLeft") move(-1);
    if (e.key === "ArrowRight") move(+1);
  });
  $("#step-detail").addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || !S.selected || !timelines[S.selected.panel]) return;
    e.preventDefault();
    timelines[S.selected.panel].scroll.focus();  // back to the step the details are of
  });
  $("#row-size").addEventListener("change", () => S.results.length && render());
  $("#zoom").addEventListener("input", () => S.results.length && render());
  window.addEventListener("resize", () => { for (const t of timelines) t.schedule(); });

  if (S.meta.initial) openScenario(S.meta.initial, "file");
  else setPreset("group-a");
}

function setPresetThen(name, then) {
  const p = S.meta.seed_presets[name];
  pressPreset(name);
  for (const k of Object.keys(S.meta.seed_knobs)) { $(`#knob-${k}`).value = p[k]; $(`#knob-${k}-num`).value = p[k]; }
  $("#knob-policy").value = p.policy;
  $("#knob-chunked").checked = p.chunked;
  latest(() => api("/api/seed", knobs()), (data) => {
    S.source = "seed"; S.scenario = data.result.scenario; S.compare = null;
    showSeed(data); fillConfigForm(S.scenario.config); showScenarioInfo(); clearErrors();
    then();
  }, (e) => showError(e));
}

main().catch((e) => {
  document.body.dataset.busy = "0";
  $("#status").classList.add("error-status");
  $("#status").textContent = "not started: " + e.message;
});
