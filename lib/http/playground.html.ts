/**
 * The playground served at GET /: one static page, no build step. It streams generations
 * over the /v1/stream WebSocket and shows the scheduler live from the `stats` frames the
 * server pushes after `{type: "subscribe_stats"}`. With API keys on, the key typed in the page
 * goes in the socket URL's `api_key` parameter (browsers cannot set headers on a WebSocket).
 * All server text is inserted with textContent, never as HTML.
 */
export const PLAYGROUND_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llmserve playground</title>
<style>
  :root { font-family: system-ui, sans-serif; color: #1d2433; background: #f5f6f8; }
  body { margin: 0 auto; max-width: 980px; padding: 16px; }
  h1 { font-size: 1.3rem; margin: 0 0 12px; }
  .layout { display: grid; grid-template-columns: 1fr 240px; gap: 16px; }
  .panel { background: #fff; border: 1px solid #d8dce3; border-radius: 8px; padding: 12px; }
  textarea { width: 100%; box-sizing: border-box; min-height: 90px; font: inherit; }
  .controls { display: flex; flex-wrap: wrap; gap: 10px; align-items: end; margin-top: 8px; }
  label { display: flex; flex-direction: column; font-size: .8rem; gap: 2px; }
  input { font: inherit; width: 110px; }
  button { font: inherit; padding: 6px 14px; border-radius: 6px; border: 1px solid #8893a7;
    background: #fff; cursor: pointer; }
  button.primary { background: #2b59c3; color: #fff; border-color: #2b59c3; }
  .gen { border-top: 1px solid #e3e6eb; padding: 8px 0; }
  .gen .meta { font-size: .8rem; color: #5b6478; display: flex; gap: 8px; align-items: center; }
  .gen pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0 0;
    font-family: ui-monospace, monospace; }
  .state-error .state { color: #b42318; }
  .state-cancelled .state { color: #9a6700; }
  dl { display: grid; grid-template-columns: auto auto; gap: 4px 12px; margin: 0; }
  dt { color: #5b6478; } dd { margin: 0; text-align: right; font-variant-numeric: tabular-nums; }
  #log { color: #b42318; font-size: .85rem; min-height: 1em; }
</style>
</head>
<body>
<h1>llmserve playground</h1>
<div class="layout">
  <div>
    <div class="panel">
      <textarea id="prompt" placeholder="Type a prompt">Once upon a time</textarea>
      <div class="controls">
        <label>Temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
        <label>Max tokens <input id="max-tokens" type="number" min="1" step="1" value="64"></label>
        <label>API key <input id="api-key" type="password" placeholder="optional"></label>
        <button id="start" class="primary">Start</button>
        <button id="cancel">Cancel</button>
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
    </dl>
  </div>
</div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const gens = new Map();
let ws = null;
let counter = 0;

function connect() {
  const key = $("api-key").value.trim();
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const url = proto + "//" + location.host + "/v1/stream" +
    (key ? "?api_key=" + encodeURIComponent(key) : "");
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

function setState(g, state, detail) {
  g.state = state;
  g.el.className = "gen state-" + state;
  g.el.dataset.state = state;
  g.stateEl.textContent = state + (detail ? " · " + detail : "");
  g.cancelBtn.disabled = state !== "running";
}

function onFrame(f) {
  if (f.type === "stats") {
    $("stat-running").textContent = f.running;
    $("stat-waiting").textContent = f.waiting;
    $("stat-batch").textContent = f.batch_size;
    $("stat-kv").textContent = f.kv_blocks_used + " / " + f.kv_blocks_total;
    $("stat-prefix").textContent = (f.prefix_cache_hit_rate * 100).toFixed(0) + "%";
    $("stat-exec").textContent = f.executor_healthy ? "healthy" : "down";
    return;
  }
  const g = f.id !== undefined ? gens.get(f.id) : undefined;
  if (f.type === "error" && !g) { $("log").textContent = f.code + ": " + f.message; return; }
  if (!g) return;
  if (f.type === "started") g.stateEl.textContent = "running · " + f.prompt_tokens + " prompt tokens";
  else if (f.type === "token") { g.out.textContent += f.text; g.tokens += f.token_ids.length; }
  else if (f.type === "done") {
    const t = f.timings;
    setState(g, f.finish_reason, f.usage.completion_tokens + " tokens" +
      (t ? " · " + t.decode_tokens_per_second.toFixed(1) + " tok/s" : ""));
  } else if (f.type === "error") setState(g, "error", f.code + ": " + f.message);
}

function start() {
  if (!ws || ws.readyState !== WebSocket.OPEN) { $("log").textContent = "not connected"; return; }
  $("log").textContent = "";
  const id = "g" + (++counter);
  const el = document.createElement("div");
  const meta = document.createElement("div");
  meta.className = "meta";
  const name = document.createElement("span");
  name.textContent = id;
  const stateEl = document.createElement("span");
  stateEl.className = "state";
  const cancelBtn = document.createElement("button");
  cancelBtn.textContent = "Cancel";
  cancelBtn.className = "cancel-one";
  const out = document.createElement("pre");
  out.className = "out";
  meta.append(name, stateEl, cancelBtn);
  el.append(meta, out);
  el.dataset.id = id;
  $("generations").prepend(el);
  const g = { id, el, out, stateEl, cancelBtn, state: "running", tokens: 0 };
  gens.set(id, g);
  setState(g, "running", "queued");
  cancelBtn.onclick = () => cancel(id);
  const frame = { type: "generate", id, prompt: $("prompt").value };
  const temperature = Number($("temperature").value);
  const maxTokens = Number($("max-tokens").value);
  if ($("temperature").value !== "") frame.temperature = temperature;
  if ($("max-tokens").value !== "") frame.max_tokens = maxTokens;
  ws.send(JSON.stringify(frame));
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
$("prompt").onkeydown = (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) start(); };
$("api-key").onchange = () => { const old = ws; ws = null; old && old.close(); connect(); };
connect();
</script>
</body>
</html>
`;
