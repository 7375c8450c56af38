/**
 * The playground served at GET /: one static page, no build step. It streams generations
 * over the /v1/stream WebSocket, in raw completion mode (the prompt as typed) or chat mode
 * (messages, rendered by the model's chat template on the server), with the sampling controls
 * the protocol has. It reads the model's name and context from GET /props and shows the
 * scheduler live from the `stats` frames the server pushes after `{type: "subscribe_stats"}`.
 * On a server of several models (GET /v1/models lists more than one) a picker chooses the
 * model, sent as `?model=` on /props and the socket, which the server of several models routes by.
 * With API keys on, the key typed in the page goes in the socket URL's `api_key` parameter
 * (browsers cannot set headers on a WebSocket) and in the /props request's header.
 * All server and user text is inserted with textContent, never as HTML.
 */
export const PLAYGROUND_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llmserve playground</title>
<style>
  :root { font-family: system-ui, sans-serif; color: #1d2433; background: #f5f6f8; }
  * { box-sizing: border-box; }
  body { margin: 0 auto; max-width: 1100px; padding: 16px; }
  header { display: flex; flex-wrap: wrap; align-items: baseline; gap: 6px 14px; margin-bottom: 12px; }
  h1 { font-size: 1.3rem; margin: 0; }
  #model { font-size: .9rem; color: #5b6478; }
  #model b { color: #1d2433; }
  .layout { display: grid; grid-template-columns: minmax(0, 1fr) 250px; gap: 16px; }
  .panel { background: #fff; border: 1px solid #d8dce3; border-radius: 8px; padding: 12px;
    align-self: start; }
  .modes { display: inline-flex; border: 1px solid #8893a7; border-radius: 6px; overflow: hidden;
    margin-bottom: 8px; }
  .modes label { flex-direction: row; align-items: center; gap: 4px; padding: 4px 12px;
    font-size: .85rem; cursor: pointer; }
  .modes label:has(input:checked) { background: #2b59c3; color: #fff; }
  .modes input { width: auto; margin: 0; }
  textarea { width: 100%; min-height: 90px; font: inherit; padding: 6px; border: 1px solid #c3c9d4;
    border-radius: 6px; resize: vertical; }
  #system { min-height: 44px; margin-bottom: 6px; }
  .chat-only { display: none; }
  body.chat .chat-only { display: block; }
  .controls { display: grid; grid-template-columns: repeat(auto-fill, minmax(104px, 1fr));
    gap: 8px 10px; margin-top: 8px; }
  label { display: flex; flex-direction: column; font-size: .78rem; gap: 2px; color: #3d4557; }
  input { font: inherit; width: 100%; padding: 3px 5px; border: 1px solid #c3c9d4; border-radius: 5px; }
  .actions { display: flex; flex-wrap: wrap; gap: 8px; margin-top: 10px; align-items: center; }
  button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid #8893a7;
    background: #fff; cursor: pointer; }
  button.primary { background: #2b59c3; color: #fff; border-color: #2b59c3; }
  button:disabled { opacity: .5; cursor: default; }
  .gen { border-top: 1px solid #e3e6eb; padding: 10px 0; }
  .gen:first-child { border-top: 0; padding-top: 0; }
  .gen .meta { font-size: .8rem; color: #5b6478; display: flex; flex-wrap: wrap; gap: 4px 8px;
    align-items: center; }
  .gen .meta .cancel-one { padding: 1px 8px; font-size: .75rem; }
  .gen .prompt { margin: 6px 0 0; padding: 6px 8px; background: #f1f3f7; border-radius: 6px;
    font-size: .85rem; white-space: pre-wrap; word-break: break-word; color: #3d4557;
    max-height: 9em; overflow: auto; }
  .gen .prompt .role { font-weight: 600; }
  .gen pre.out { white-space: pre-wrap; word-break: break-word; margin: 6px 0 0;
    font-family: ui-monospace, monospace; font-size: .9rem; }
  .gen .timings { font-size: .75rem; color: #5b6478; margin-top: 4px;
    font-variant-numeric: tabular-nums; }
  .badge { font-size: .7rem; padding: 0 6px; border-radius: 8px; background: #e7ecf8; color: #2b59c3; }
  .state-error .state { color: #b42318; }
  .state-cancelled .state { color: #9a6700; }
  dl { display: grid; grid-template-columns: auto auto; gap: 4px 12px; margin: 0; }
  dt { color: #5b6478; } dd { margin: 0; text-align: right; font-variant-numeric: tabular-nums; }
  #log { color: #b42318; font-size: .85rem; min-height: 1em; margin-top: 4px; }
  #generations:empty::before { content: "Generations appear here."; color: #8893a7; font-size: .9rem; }
  @media (max-width: 720px) {
    body { padding: 10px; }
    .layout { grid-template-columns: minmax(0, 1fr); }
    .controls { grid-template-columns: repeat(3, minmax(0, 1fr)); }
    dl { grid-template-columns: auto auto auto auto; }
  }
</style>
</head>
<body>
<header>
  <h1>llmserve playground</h1>
  <div id="model">model <b id="model-name">…</b> · context <b id="model-context">…</b> tokens</div>
  <label id="model-picker" hidden>Model <select id="model-pick" aria-label="Model"></select></label>
</header>
<div class="layout">
  <div>
    <div class="panel">
      <div class="modes" role="radiogroup" aria-label="Mode">
        <label><input type="radio" name="mode" id="mode-completion" value="completion" checked> Completion</label>
        <label><input type="radio" name="mode" id="mode-chat" value="chat"> Chat</label>
      </div>
      <div class="chat-only">
        <textarea id="system" placeholder="System message (optional)"></textarea>
      </div>
      <textarea id="prompt" placeholder="Type a prompt">Once upon a time</textarea>
      <div class="chat-only" id="chat-note" style="font-size:.78rem;color:#5b6478">
        Chat mode sends the conversation as messages; the server renders them with the model's
        chat template.
        <div style="display:flex;gap:8px;align-items:center;margin-top:4px">
          <button id="new-chat" type="button">New chat</button><span id="chat-turns">0 turns</span>
        </div>
      </div>
      <div class="controls">
        <label>Temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
        <label>Top-p <input id="top-p" type="number" min="0" max="1" step="0.05" placeholder="1"></label>
        <label>Top-k <input id="top-k" type="number" min="0" step="1" placeholder="0 (off)"></label>
        <label>Max tokens <input id="max-tokens" type="number" min="1" step="1" value="64"></label>
        <label>Seed <input id="seed" type="number" step="1" placeholder="random"></label>
        <label>Stop <input id="stop" type="text" placeholder="comma-separated"></label>
        <label>API key <input id="api-key" type="password" placeholder="optional"></label>
      </div>
      <div class="actions">
        <button id="start" class="primary">Start</button>
        <button id="cancel">Cancel</button>
        <span style="font-size:.75rem;color:#8893a7">Ctrl+Enter starts</span>
      </div>
      <div id="log" role="status"></div>
    </div>
    <div class="panel" id="generations" style="margin-top:12px"></div>
  </div>
  <div class="panel">
    <strong>Scheduler</strong>
    <dl style="margin-top:8px">
      <dt>Connection</dt><dd id="stat-conn">connecting</dd>
      <dt>Running</dt><dd id="stat-running">–</dd>
      <dt>Waiting</dt><dd id="stat-waiting">–</dd>
      <dt>Batch size</dt><dd id="stat-batch">–</dd>
      <dt>KV blocks used</dt><dd id="stat-kv">–</dd>
      <dt>Prefix cache hits</dt><dd id="stat-prefix">–</dd>
      <dt>Executor</dt><dd id="stat-exec">–</dd>
      <dt>Result cache</dt><dd id="stat-cache">–</dd>
    </dl>
  </div>
</div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const gens = new Map();
let ws = null;
let counter = 0;
/** The chat so far: finished turns only, as {role, content}. */
let history = [];

function apiKey() { return $("api-key").value.trim(); }
function authHeaders() {
  const key = apiKey();
  return key ? { headers: { authorization: "Bearer " + key } } : {};
}

/** The model picked (a server of several models); "" for the server's default. */
function pickedModel() { return $("model-pick").value; }

/** "?a=1&b=2" of the non-empty pairs, or "". */
function query(pairs) {
  const q = pairs.filter(([, v]) => v).map(([k, v]) => k + "=" + encodeURIComponent(v));
  return q.length ? "?" + q.join("&") : "";
}

/** A server of several models lists them all: the picker shows only then. */
async function loadModels() {
  try {
    const res = await fetch("/v1/models", authHeaders());
    if (!res.ok) return;
    const ids = (await res.json()).data.map((m) => m.id);
    const pick = $("model-pick");
    const was = pick.value;
    pick.replaceChildren(...ids.map((id) => {
      const o = document.createElement("option");
      o.value = id;
      o.textContent = id;
      return o;
    }));
    if (ids.includes(was)) pick.value = was;
    $("model-picker").hidden = ids.length < 2;
  } catch (_) {
    // No list: the server's default model serves, as before the picker.
  }
}

async function loadProps() {
  try {
    const res = await fetch("/props" + query([["model", pickedModel()]]), authHeaders());
    if (!res.ok) throw new Error("HTTP " + res.status);
    const p = await res.json();
    $("model-name").textContent = p.model;
    $("model-context").textContent = String(p.context_length);
  } catch (e) {
    $("model-name").textContent = "unknown (" + e.message + ")";
  }
}

function connect() {
  const key = apiKey();
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const url = proto + "//" + location.host + "/v1/stream" +
    query([["api_key", key], ["model", pickedModel()]]);
  const sock = new WebSocket(url);
  ws = sock;
  $("stat-conn").textContent = "connecting";
  sock.onopen = () => {
    $("stat-conn").textContent = "open";
    sock.send(JSON.stringify({ type: "subscribe_stats" }));
  };
  sock.onclose = () => {
    if (ws !== sock) return;
    $("stat-conn").textContent = "closed";
    for (const g of gens.values()) if (g.state === "running") setState(g, "error", "connection closed");
    setTimeout(() => { if (ws === sock) connect(); }, 1000);
  };
  sock.onmessage = (ev) => onFrame(JSON.parse(ev.data));
}

function mode() { return $("mode-chat").checked ? "chat" : "completion"; }

function setMode() {
  document.body.classList.toggle("chat", mode() === "chat");
  $("prompt").placeholder = mode() === "chat" ? "Your message" : "Type a prompt";
}

function setState(g, state, detail) {
  g.state = state;
  g.el.className = "gen state-" + state;
  g.el.dataset.state = state;
  g.stateEl.textContent = state + (detail ? " · " + detail : "");
  g.cancelBtn.disabled = state !== "running";
}

function ms(v) { return v < 10 ? v.toFixed(1) + " ms" : Math.round(v) + " ms"; }

function onFrame(f) {
  if (f.type === "stats") {
    $("stat-running").textContent = f.running;
    $("stat-waiting").textContent = f.waiting;
    $("stat-batch").textContent = f.batch_size ?? "n/a";
    $("stat-kv").textContent = f.kv_blocks_used + " / " + f.kv_blocks_total;
    $("stat-prefix").textContent = (f.prefix_cache_hit_rate * 100).toFixed(0) + "%";
    $("stat-exec").textContent = f.executor_healthy ? "healthy" : "down";
    const rc = f.result_cache;
    $("stat-cache").textContent = rc ? rc.hits + " hits / " + rc.misses + " misses" : "off";
    return;
  }
  if (f.type === "loading") {
    $("log").textContent = "loading model " + f.model + ": " + f.bytes +
      (f.total_bytes !== undefined ? " / " + f.total_bytes : "") + " bytes";
    return;
  }
  const g = f.id !== undefined ? gens.get(f.id) : undefined;
  if (f.type === "error" && !g) { $("log").textContent = f.code + ": " + f.message; return; }
  if (!g) return;
  if (f.type === "started") {
    g.stateEl.textContent = "running · " + f.prompt_tokens + " prompt tokens";
    if (f.max_tokens_capped) g.note("max tokens lowered to " + f.max_tokens + " to fit the context");
  } else if (f.type === "token") { g.out.textContent += f.text; g.tokens += f.token_ids.length; }
  else if (f.type === "done") {
    const t = f.timings;
    setState(g, f.finish_reason, f.usage.completion_tokens + " tokens" +
      (t ? " · " + t.decode_tokens_per_second.toFixed(1) + " tok/s" : ""));
    if (t) {
      g.timings.textContent = "TTFT " + ms(t.ttft_ms) + " · queued " + ms(t.queued_ms) +
        " · prefill " + ms(t.prefill_ms) + " · decode " + ms(t.decode_ms) + " · total " +
        ms(t.total_ms) + " · " + f.usage.prompt_tokens + " prompt / " +
        f.usage.cached_tokens + " cached";
    }
    if (f.cached) g.badge("cached · saved " + ms(f.saved_ms));
    if (g.chatTurn && f.finish_reason !== "cancelled") {
      history.push(g.chatTurn, { role: "assistant", content: g.out.textContent });
      $("chat-turns").textContent = history.length / 2 + " turns";
    }
  } else if (f.type === "error") setState(g, "error", f.code + ": " + f.message);
}

function numberField(frame, id, key) {
  const raw = $(id).value.trim();
  if (raw !== "") frame[key] = Number(raw);
}

/** "a, b" -> ["a", "b"]; "\\n" in a stop means a newline. */
function stops() {
  return $("stop").value.split(",").map((s) => s.trim().replaceAll("\\\\n", "\\n"))
    .filter((s) => s.length > 0);
}

function promptView(turns) {
  const box = document.createElement("div");
  box.className = "prompt";
  for (const t of turns) {
    const line = document.createElement("div");
    if (t.role) {
      const r = document.createElement("span");
      r.className = "role";
      r.textContent = t.role + ": ";
      line.append(r);
    }
    line.append(document.createTextNode(t.content));
    box.append(line);
  }
  return box;
}

function start() {
  if (!ws || ws.readyState !== WebSocket.OPEN) { $("log").textContent = "not connected"; return; }
  $("log").textContent = "";
  const id = "g" + (++counter);
  const frame = { type: "generate", id };
  let turns;
  let chatTurn = null;
  if (mode() === "chat") {
    chatTurn = { role: "user", content: $("prompt").value };
    const system = $("system").value.trim();
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...history, chatTurn];
    frame.messages = messages;
    turns = messages;
  } else {
    frame.prompt = $("prompt").value;
    turns = [{ content: frame.prompt }];
  }
  numberField(frame, "temperature", "temperature");
  numberField(frame, "top-p", "top_p");
  numberField(frame, "top-k", "top_k");
  numberField(frame, "max-tokens", "max_tokens");
  numberField(frame, "seed", "seed");
  const stop = stops();
  if (stop.length > 0) frame.stop = stop;

  const el = document.createElement("div");
  const meta = document.createElement("div");
  meta.className = "meta";
  const name = document.createElement("span");
  name.textContent = id + " · " + (chatTurn ? "chat" : "completion");
  const stateEl = document.createElement("span");
  stateEl.className = "state";
  const cancelBtn = document.createElement("button");
  cancelBtn.textContent = "Cancel";
  cancelBtn.className = "cancel-one";
  meta.append(name, stateEl, cancelBtn);
  const out = document.createElement("pre");
  out.className = "out";
  const timings = document.createElement("div");
  timings.className = "timings";
  el.append(meta, promptView(turns), out, timings);
  el.dataset.id = id;
  $("generations").prepend(el);
  const g = {
    id, el, out, stateEl, cancelBtn, timings, chatTurn, state: "running", tokens: 0,
    badge(text) { const b = document.createElement("span"); b.className = "badge"; b.textContent = text; meta.append(b); },
    note(text) { const b = document.createElement("span"); b.className = "note"; b.textContent = text; meta.append(b); },
  };
  gens.set(id, g);
  setState(g, "running", "queued");
  cancelBtn.onclick = () => cancel(id);
  ws.send(JSON.stringify(frame));
  if (chatTurn) $("prompt").value = "";
}

function cancel(id) {
  if (id === undefined) {
    const running = [...gens.values()].filter((g) => g.state === "running");
    const last = running[running.length - 1];
    if (!last) return;
    id = last.id;
  }
  ws.send(JSON.stringify({ type: "cancel", id }));
}

$("start").onclick = start;
$("cancel").onclick = () => cancel();
$("new-chat").onclick = () => { history = []; $("chat-turns").textContent = "0 turns"; };
$("mode-completion").onchange = setMode;
$("mode-chat").onchange = setMode;
$("prompt").onkeydown = (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) start(); };
function reconnect() { const old = ws; ws = null; old && old.close(); connect(); loadProps(); }
$("api-key").onchange = () => loadModels().then(reconnect);
$("model-pick").onchange = reconnect;
setMode();
loadModels().then(() => { loadProps(); connect(); });
</script>
</body>
</html>
`;
