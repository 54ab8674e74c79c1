// The playground of `pml serve`: it talks to the server only through its public HTTP API
// (`/v1/pml/check`, `/v1/schemas`, `/v1/completions`, `/v1/chat/completions`, `/metrics`), so
// what it shows is what any client gets.
import { CodeJar } from "codejar";
import { readEvents } from "./sse.js";
import { escapeHtml, markSpans } from "./marks.js";
import { parseMetrics } from "./metrics.js";

const $ = (selector) => document.querySelector(selector);
const MODES = ["reuse", "blend", "full"];
const CHECK_DELAY_MS = 250;

const state = {
  model: null,
  checks: { schema: null, prompt: null },
  checkSerial: 0,
  chat: [],
};

// Editors: the text as typed, with the spans of the last check's diagnostics underlined.
function editor(element, which) {
  const highlight = (node) => {
    const check = state.checks[which];
    node.innerHTML = markSpans(node.textContent, check ? check.diagnostics : []);
  };
  // No automatic closing quotes or brackets: markup is typed in pairs of tags, not of quotes.
  const jar = CodeJar(element, highlight, { tab: "  ", spellcheck: false, addClosing: false });
  jar.onUpdate(() => scheduleCheck());
  // Text that arrives without a key (dictation, a drop, a test's insertion) is checked too.
  element.addEventListener("input", () => scheduleCheck());
  return jar;
}

const editors = {
  schema: editor($("#schema-editor"), "schema"),
  prompt: editor($("#prompt-editor"), "prompt"),
};

// Live diagnostics: one request per pause in typing; an answer older than the newest is dropped.
let checkTimer = null;
function scheduleCheck() {
  clearTimeout(checkTimer);
  checkTimer = setTimeout(runCheck, CHECK_DELAY_MS);
}

async function runCheck() {
  const serial = ++state.checkSerial;
  const body = { schema: editors.schema.toString(), prompt: editors.prompt.toString() };
  let answer;
  try {
    const response = await fetch("/v1/pml/check", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    answer = await response.json();
    if (!response.ok) throw new Error(errorMessage(response, answer));
  } catch (error) {
    showStatus(`check failed: ${error.message}`);
    return;
  }
  if (serial !== state.checkSerial) return;
  for (const which of ["schema", "prompt"]) {
    state.checks[which] = answer[which] || null;
    renderDiagnostics(which);
    rehighlight(which);
  }
  $("#run").disabled = !canRun();
}

function rehighlight(which) {
  const element = $(`#${which}-editor`);
  const focused = document.activeElement === element;
  const position = focused ? editors[which].save() : null;
  element.innerHTML = markSpans(
    editors[which].toString(),
    state.checks[which] ? state.checks[which].diagnostics : [],
  );
  if (position) editors[which].restore(position);
}

function renderDiagnostics(which) {
  const list = $(`#${which}-diagnostics`);
  const check = state.checks[which];
  list.innerHTML = "";
  if (!check) return;
  if (check.diagnostics.length === 0) {
    list.innerHTML = `<li class="clean">no problems (${check.kind})</li>`;
    return;
  }
  for (const diagnostic of check.diagnostics) {
    const label = diagnostic.labels[0];
    const where = label ? `${label.line}:${label.column}` : "";
    const item = document.createElement("li");
    item.className = `diagnostic ${diagnostic.severity}`;
    item.dataset.code = diagnostic.code;
    item.innerHTML =
      `<span class="code">${escapeHtml(diagnostic.code)}</span> ` +
      `<span class="where">${where}</span> ${escapeHtml(diagnostic.message)}` +
      (diagnostic.help ? `<div class="hint">hint: ${escapeHtml(diagnostic.help)}</div>` : "");
    list.appendChild(item);
  }
}

function canRun() {
  const prompt = state.checks.prompt;
  return Boolean(prompt && prompt.kind === "prompt" && prompt.errors === 0);
}

// What an error response says: OpenAI's `{"error": {"message"}}`, else its status text.
function errorMessage(response, body) {
  return body && body.error ? body.error.message : response.statusText;
}

function showStatus(text) {
  $("#status").textContent = text;
}

// Schemas: the ones the server holds, their text in the editor; the editor's text uploaded.
async function loadSchemas(select) {
  const response = await fetch("/v1/schemas");
  const listing = await response.json();
  const picker = $("#schema-picker");
  picker.innerHTML = "";
  for (const schema of listing.data || []) {
    const option = document.createElement("option");
    option.value = schema.name;
    option.textContent = `${schema.name} (${schema.status})`;
    picker.appendChild(option);
  }
  const wanted = select || (listing.data && listing.data[0] && listing.data[0].name);
  if (wanted) {
    picker.value = wanted;
    await showSchema(wanted);
  } else if (!editors.schema.toString().trim() && !editors.prompt.toString().trim()) {
    // A server started without schemas: an example to edit and upload, not an empty editor's
    // error.
    editors.schema.updateCode(EXAMPLE_SCHEMA);
    editors.prompt.updateCode(EXAMPLE_PROMPT);
    showStatus("no schema is loaded: here is an example to edit, then Upload it");
  }
}

const EXAMPLE_SCHEMA = `<schema name="example">
  <system>You answer questions about the notes below, briefly.</system>
  <module name="notes">The team meeting moved to Tuesday at 10:00. Bring the slides.</module>
  <module name="menu">The cafeteria serves soup on Mondays and fish on Fridays.</module>
</schema>`;

const EXAMPLE_PROMPT = `<prompt schema="example">
  <notes/>
  <user>When is the meeting?</user>
</prompt>`;

async function showSchema(name) {
  const response = await fetch(`/v1/schemas/${encodeURIComponent(name)}/source`);
  if (!response.ok) return;
  editors.schema.updateCode(await response.text());
  if (!editors.prompt.toString().trim()) {
    editors.prompt.updateCode(`<prompt schema="${name}">\n  \n</prompt>`);
  }
  await refreshLayout(name);
  scheduleCheck();
}

async function uploadSchema() {
  const headers = { "content-type": "application/xml" };
  const token = $("#admin-token").value.trim();
  if (token) headers.authorization = `Bearer ${token}`;
  const response = await fetch("/v1/schemas", {
    method: "POST",
    headers,
    body: editors.schema.toString(),
  });
  const answer = await response.json();
  if (!response.ok) {
    showStatus(`upload refused: ${errorMessage(response, answer)}`);
    return;
  }
  showStatus(`schema ${answer.name}: ${answer.status}`);
  await waitUntilEncoded(answer.name);
  await loadSchemas(answer.name);
}

async function waitUntilEncoded(name) {
  for (;;) {
    const response = await fetch(`/v1/schemas/${encodeURIComponent(name)}`);
    const info = await response.json();
    showStatus(`schema ${name}: ${info.status} (${info.units_done}/${info.units_total} units)`);
    if (info.status !== "queued" && info.status !== "compiling") return;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

// The layout: each unit a block at its positions, coloured by the tier its state is in.
async function refreshLayout(name) {
  const strip = $("#layout");
  const response = await fetch(`/v1/schemas/${encodeURIComponent(name)}/layout`);
  if (!response.ok) {
    strip.innerHTML = "";
    return;
  }
  const layout = await response.json();
  const total = Math.max(1, layout.positions);
  strip.innerHTML = "";
  for (const unit of layout.units) {
    const block = document.createElement("div");
    block.className = `unit tier-${unit.tier}`;
    block.style.left = `${(100 * unit.start) / total}%`;
    block.style.width = `${Math.max(0.4, (100 * (unit.end - unit.start)) / total)}%`;
    block.title = `${unit.name}: positions ${unit.start}–${unit.end} (${unit.tokens} tokens), ${unit.tier}`;
    block.textContent = unit.name;
    strip.appendChild(block);
  }
}

// Run: the prompt in each mode, answers streaming, each with its time to first token. One
// after another, so that no mode's time includes waiting for another's prefill.
async function runModes() {
  $("#run").disabled = true;
  const prompt = editors.prompt.toString();
  const maxTokens = Number($("#max-tokens").value) || 64;
  for (const mode of MODES) {
    const pane = $(`#run-${mode}`);
    pane.querySelector(".answer").textContent = "";
    pane.querySelector(".strip").innerHTML = "";
    pane.querySelector(".figures").textContent = "queued";
    pane.dataset.state = "queued";
  }
  for (const mode of MODES) await runMode(mode, prompt, maxTokens);
  $("#run").disabled = !canRun();
  const name = $("#schema-picker").value;
  if (name) refreshLayout(name);
}

async function runMode(mode, prompt, maxTokens) {
  const pane = $(`#run-${mode}`);
  const answer = pane.querySelector(".answer");
  const figures = pane.querySelector(".figures");
  const strip = pane.querySelector(".strip");
  answer.textContent = "";
  figures.textContent = "waiting…";
  strip.innerHTML = "";
  pane.dataset.state = "running";
  const started = performance.now();
  let firstToken = null;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt,
        mode,
        max_tokens: maxTokens,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
        prompt_token_kinds: true,
      }),
    });
    if (!response.ok) {
      const error = await response.json();
      throw new Error(errorMessage(response, error));
    }
    for await (const event of readEvents(response)) {
      const choice = event.choices && event.choices[0];
      if (choice && choice.text) {
        if (firstToken === null) firstToken = performance.now() - started;
        answer.textContent += choice.text;
      }
      if (event.usage) {
        figures.innerHTML = describeUsage(event.usage, firstToken);
        strip.innerHTML = renderStrip(event.usage.prompt_token_kinds);
      }
    }
    pane.dataset.state = "done";
  } catch (error) {
    figures.textContent = `failed: ${error.message}`;
    pane.dataset.state = "failed";
  }
}

function describeUsage(usage, firstToken) {
  const parts = [
    `<b>TTFT ${firstToken === null ? "–" : `${Math.round(firstToken)} ms`}</b>`,
    `${usage.cached_tokens} reused`,
    `${usage.recomputed_tokens} recomputed`,
    `${usage.new_tokens} new`,
  ];
  if (usage.estimated_fidelity !== undefined) {
    parts.push(`est. fidelity ${usage.estimated_fidelity.toFixed(3)}`);
  }
  if (usage.fidelity_guard_fired) parts.push("guard: answered in full");
  return parts.join(" · ");
}

// The prompt as a strip of tokens, coloured by how each was obtained.
function renderStrip(kinds) {
  if (!kinds) return "";
  return kinds
    .map(([text, kind]) => `<span class="token ${kind}" title="${kind}">${escapeHtml(text)}</span>`)
    .join("");
}

// Chat: the conversation so far sent each turn, the answer streamed.
async function sendChat(event) {
  event.preventDefault();
  const input = $("#chat-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  state.chat.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "" };
  renderChat(reply);
  $("#chat-log").dataset.state = "answering";
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: state.chat, stream: true }),
  });
  const bubble = $("#chat-log").lastElementChild;
  if (!response.ok) {
    const error = await response.json();
    bubble.textContent = `failed: ${errorMessage(response, error)}`;
    $("#chat-log").dataset.state = "failed";
    return;
  }
  for await (const chunk of readEvents(response)) {
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (delta && delta.content) {
      reply.content += delta.content;
      bubble.textContent = reply.content;
    }
  }
  state.chat.push(reply);
  $("#chat-log").dataset.state = "done";
}

function renderChat(pending) {
  const log = $("#chat-log");
  log.innerHTML = "";
  for (const message of [...state.chat, pending]) {
    const bubble = document.createElement("div");
    bubble.className = `bubble ${message.role}`;
    bubble.textContent = message.content;
    log.appendChild(bubble);
  }
}

// Gauges, from the Prometheus text of `/metrics`.
async function refreshGauges() {
  try {
    const response = await fetch("/metrics");
    const metrics = parseMetrics(await response.text());
    const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
    const budget = metrics.pml_kv_pool_bytes;
    $("#gauge-kv").textContent =
      mib(metrics.pml_kv_resident_bytes || 0) + (budget ? ` of ${mib(budget)}` : "");
    const queries = metrics.pml_prefix_cache_queries_total || 0;
    const hits = metrics.pml_prefix_cache_hits_total || 0;
    $("#gauge-prefix").textContent = queries ? `${hits} hits of ${queries}` : "no queries yet";
    $("#gauge-queue").textContent =
      `${metrics.pml_queue_depth || 0} waiting, ${metrics.pml_active_sequences || 0} running`;
  } catch (error) {
    $("#gauge-queue").textContent = `metrics unavailable: ${error.message}`;
  }
}

function showTab(name) {
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.classList.toggle("active", tab.dataset.tab === name);
  }
  for (const panel of document.querySelectorAll(".panel")) {
    panel.hidden = panel.id !== `panel-${name}`;
  }
}

async function start() {
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.addEventListener("click", () => showTab(tab.dataset.tab));
  }
  $("#run").addEventListener("click", runModes);
  $("#upload").addEventListener("click", uploadSchema);
  $("#schema-picker").addEventListener("change", (event) => showSchema(event.target.value));
  $("#chat-form").addEventListener("submit", sendChat);
  const models = await (await fetch("/v1/models")).json();
  state.model = models.data && models.data[0] ? models.data[0].id : null;
  $("#model").textContent = state.model || "";
  await loadSchemas();
  scheduleCheck();
  refreshGauges();
  setInterval(refreshGauges, 2000);
}

start().catch((error) => showStatus(`could not start: ${error.message}`));
