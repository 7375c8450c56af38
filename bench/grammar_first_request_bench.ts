/**
 * The first json_schema request on a fresh server: time to its first streamed token, and the
 * server's resident memory (/proc/PID/status VmRSS) when ready, when its grammar engine is
 * started (the preload's line; with --grammar-preload=false, nothing to wait for) and after
 * the request. Each server is a child on a free port with the cpu backend.
 *
 *   deno run -A bench/grammar_first_request_bench.ts [--model <gguf>] [--root <checkout>] \
 *     [-- <extra serve flags, e.g. --grammar-preload=false>]
 *
 * `--root` runs another checkout's main.ts (e.g. a worktree of the commit before the preload).
 */
import { parseArgs } from "@std/cli/parse-args";

const args = parseArgs(Deno.args, {
  string: ["model", "root"],
  default: { model: "../shared/models/compat/qwen2-like-q4_k_m.gguf", root: "." },
  "--": true,
});
const main = `${args.root}/main.ts`;
const child = new Deno.Command(Deno.execPath(), {
  args: [
    "run",
    "-A",
    main,
    "serve",
    "--port",
    "0",
    "--backend",
    "cpu",
    "--kv-memory",
    "64MiB",
    "--model",
    args.model,
    ...args["--"].map(String),
  ],
  stdout: "null",
  stderr: "piped",
}).spawn();
const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
let log = "";
async function until(pattern: RegExp): Promise<RegExpExecArray> {
  for (;;) {
    const m = pattern.exec(log);
    if (m) return m;
    const { value, done } = await reader.read();
    if (done) throw new Error(`server exited:\n${log}`);
    log += value;
  }
}
const rss = async () => {
  const status = await Deno.readTextFile(`/proc/${child.pid}/status`);
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
};
const base = (await until(/url\s+(http:\/\/\S+?)\//))[1]!;
const atReady = await rss();
const preload = /grammar engine starting in the background/.test(log);
const started = preload ? (await until(/grammar engine \+.*\n/))[0].trim() : "(not preloaded)";
const atStart = await rss();
const t0 = performance.now();
const res = await fetch(`${base}/v1/chat/completions`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({
    stream: true,
    max_tokens: 16,
    messages: [{ role: "user", content: "name?" }],
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "p",
        schema: { type: "object", properties: { name: { type: "string" } }, required: ["name"] },
      },
    },
  }),
});
const body = res.body!.pipeThrough(new TextDecoderStream()).getReader();
let text = "";
let ttft: number | undefined;
for (;;) {
  const { value, done } = await body.read();
  if (done) break;
  text += value;
  if (ttft === undefined && /"content":"[^"]/.test(text)) ttft = performance.now() - t0;
}
const atEnd = await rss();
console.log(
  `| ${args["--"].join(" ") || "(default)"} | ${atReady.toFixed(0)} MiB | ${
    atStart.toFixed(0)
  } MiB | ${ttft?.toFixed(0)} ms | ${atEnd.toFixed(0)} MiB |`,
);
console.log(started);
child.kill("SIGTERM");
await child.status;
