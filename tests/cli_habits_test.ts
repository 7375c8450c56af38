import { assert, assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { parseServeArgs } from "../lib/cli/serve_args.ts";
import { parseRouterArgs } from "../lib/cli/router.ts";
import { type GenerateArgs, parseGenerateArgs } from "../lib/cli/generate.ts";
import { modelFile, modelMirror } from "./harness/model_files.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/** What llama.cpp and llama-server users type, and the server's own logging switches. */

const noEnv = () => undefined;

function parsed(argv: string[]): GenerateArgs {
  const r = parseGenerateArgs(argv);
  if ("error" in r) throw new Error(r.error);
  return r;
}
const decoder = new TextDecoder();
/** A text request-log line: `<ISO time> <method> <route> <status> ...`. */
const REQUEST_LINE = /^\d{4}-\d\d-\d\dT\S+Z (GET|HEAD|POST|WS) \S+( path=\S+)? \d{3} /;

Deno.test("parseServeArgs() takes llama-server's -m, -c and --ctx-size for --model and --context-length", () => {
  const c = parseServeArgs(["-m", "stories260K-q8_0", "-c", "256", "--port", "9000"], noEnv);
  assertEquals([c.model, c.contextLength, c.port], ["stories260K-q8_0", 256, 9000]);
  assertEquals(parseServeArgs(["--ctx-size=64"], noEnv).contextLength, 64);
  // Validation names the flag the value was checked under, with the value typed.
  assertThrows(
    () => parseServeArgs(["-c", "-5"], noEnv),
    Error,
    '--context-length: must be positive (received "-5")',
  );
  // An unknown short flag is shown as typed, with one dash.
  assertThrows(() => parseServeArgs(["-q", "x"], noEnv), Error, "Unknown argument(s): -q");
});

Deno.test("parseGenerateArgs() takes llama.cpp's -m, -p, -n, -c, --n-predict, --ctx-size and --temp", () => {
  const a = parsed(["-m", "x.gguf", "-p", "Once upon", "-n", "12", "-c", "64", "--temp", "0"]);
  assertEquals([a.model, a.prompt, a.maxTokens, a.contextLength, a.temperature], [
    "x.gguf",
    "Once upon",
    12,
    64,
    0,
  ]);
  const b = parsed(["--n-predict", "7", "--ctx-size", "32"]);
  assertEquals([b.maxTokens, b.contextLength], [7, 32]);
  // A value that looks like a short flag stays the value of the flag before it.
  const c = parsed(["--prompt", "-m", "-n", "3"]);
  assertEquals([c.prompt, c.maxTokens], ["-m", 3]);
  const bad = parseGenerateArgs(["-x"]);
  assert("error" in bad && bad.error.startsWith("Unknown argument(s): -x;"), JSON.stringify(bad));
});

Deno.test("parseServeArgs() takes vLLM's --max-model-len and llama-server's --parallel / -np", () => {
  assertEquals(parseServeArgs(["--max-model-len", "512"], noEnv).contextLength, 512);
  assertEquals(parseServeArgs(["--parallel", "3"], noEnv).maxRunning, 3);
  assertEquals(parseServeArgs(["-np", "5"], noEnv).maxRunning, 5);
});

Deno.test("parseServeArgs() answers a peer's flag that means nothing here with what to use instead", () => {
  // Read as one flag with its value, named as typed: never "-n -g -l", never the usage text.
  const e = assertThrows(() => parseServeArgs(["-ngl", "99"], noEnv), Error);
  assertEquals(e.message.split("\n").length, 1, e.message);
  assertStringIncludes(e.message, "-ngl is not a flag here: the backend is chosen with --backend");
  assertThrows(
    () => parseServeArgs(["--gpu-memory-utilization", "0.9"], noEnv),
    Error,
    "--gpu-memory-utilization is not a flag here: the KV cache is sized with --kv-memory",
  );
});

Deno.test("an unknown flag gets one line with the nearest known flag", () => {
  const e = assertThrows(() => parseServeArgs(["--prot", "80"], noEnv), Error);
  assertEquals(
    e.message,
    "Unknown argument(s): --prot (did you mean --port?); `deno task start --help` lists every flag",
  );
  // Nothing near: no guess.
  assertThrows(() => parseServeArgs(["--zzzzzz"], noEnv), Error, "Unknown argument(s): --zzzzzz;");
  // A several-letter flag after one dash is shown as typed, not as its letters.
  assertThrows(() => parseServeArgs(["-kvm", "1"], noEnv), Error, "Unknown argument(s): -kvm");
  // Typos of the generate and router commands too.
  const g = parseGenerateArgs(["--max-tokns", "3"]);
  assertStringIncludes(
    "error" in g ? g.error : "(parsed)",
    "--max-tokns (did you mean --max-tokens?)",
  );
  assertThrows(
    () => parseRouterArgs(["--nats", "nats://x:1", "--drian-timeout", "1s"], noEnv),
    Error,
    "did you mean --drain-timeout?",
  );
});

Deno.test("generate -m -p -n prints the same greedy text as the long flags, and says when the context lowers -n", async () => {
  const run = async (args: string[]) => {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-all",
        new URL("../main.ts", import.meta.url).pathname,
        "generate",
        ...args,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    return {
      code: out.code,
      stdout: decoder.decode(out.stdout),
      stderr: decoder.decode(out.stderr),
    };
  };
  const model = modelFile("stories260K.gguf"); // declares a 128-token context
  const long = await run([
    "--model",
    model,
    "--prompt",
    "Once upon a time",
    "--max-tokens",
    "300",
    "--temperature",
    "0",
    "--backend",
    "cpu",
  ]);
  const short = await run([
    "-m",
    model,
    "-p",
    "Once upon a time",
    "-n",
    "300",
    "--temp",
    "0",
    "--backend",
    "cpu",
  ]);
  assertEquals(long.code, 0, long.stderr);
  assertEquals(short.code, 0, short.stderr);
  assertEquals(short.stdout, long.stdout);
  // "Once upon a time" is 5 tokens with BOS (the models README): 128 - 5 = 123 of 300.
  assertStringIncludes(
    short.stderr,
    "--max-tokens 300 lowered to 123: the prompt has 5 tokens and the context is 128",
  );
  assert(
    /\n(\d+) tokens in .*stopped by (the model ended the text|--max-tokens 123)\n/.test(
      short.stderr,
    ),
    short.stderr,
  );
});

Deno.test("`deno task start` with -m, -c, --chat-template and the default log: the template renders chats, probes stay out of the log", async () => {
  const dir = await Deno.makeTempDir(); // outside the repository: the launcher must grant it
  const template = `${dir}/brackets.jinja`;
  await Deno.writeTextFile(
    template,
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
  );
  const root = new URL("..", import.meta.url).pathname;
  const { child, base, log } = await spawnUntilListening(
    [
      "task",
      "start",
      "-m",
      "stories260K-q8_0",
      "-c",
      "64",
      "--port",
      "0",
      "--kv-memory",
      "1MiB",
      "--chat-template",
      template,
    ],
    { cwd: root, env: { MODEL_MIRROR: modelMirror() } },
  );
  const post = (path: string, body: unknown) =>
    fetch(base + path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  try {
    const props = await (await fetch(`${base}/props`)).json();
    assertEquals(props.context_length, 64);
    assert(String(props.model_path).endsWith("stories260K-q8_0.gguf"), props.model_path);
    assertEquals(props.chat_template, await Deno.readTextFile(template));
    // The ids of a chat are those of the text the file's template writes, rendered by hand.
    const chat =
      await (await post("/tokenize", { messages: [{ role: "user", content: "Hi there" }] })).json();
    const byHand = await (await post("/tokenize", { prompt: "[user] Hi there\n" })).json();
    assertEquals(chat.tokens, byHand.tokens);
    for (const probe of ["/health", "/ready", "/metrics"]) {
      await (await fetch(base + probe)).body?.cancel();
    }
    const done = await post("/v1/completions", { prompt: "Once", max_tokens: 2, temperature: 0 });
    assertEquals(done.status, 200);
    await done.body?.cancel();
  } finally {
    child.kill("SIGTERM");
    assertEquals((await child.status).code, 0);
  }
  const out = await log();
  assertStringIncludes(out, `chat      template from --chat-template ${template}`);
  const requestLines = out.split("\n").filter((l) => REQUEST_LINE.test(l));
  // Each line is written when its response completes; the probes completed before the last
  // completion was sent, so had they been logged their lines would be in this list.
  assertEquals(requestLines.map((l) => l.split(" ").slice(1, 4).join(" ")), [
    "GET /props 200",
    "POST /tokenize 200",
    "POST /tokenize 200",
    "POST /v1/completions 200",
  ]);
  await Deno.remove(dir, { recursive: true });
});

Deno.test("`deno task start --log-probes` logs probes; --log-level warn keeps only 5xx lines; a bad --chat-template fails before binding", async () => {
  const root = new URL("..", import.meta.url).pathname;
  const env = { MODEL_MIRROR: modelMirror() };
  const withProbes = await spawnUntilListening(
    ["task", "start", "--port", "0", "--kv-memory", "1MiB", "--log-probes"],
    { cwd: root, env },
  );
  try {
    await (await fetch(withProbes.base + "/health")).body?.cancel();
    await (await fetch(withProbes.base + "/nope")).body?.cancel();
  } finally {
    withProbes.child.kill("SIGTERM");
    assertEquals((await withProbes.child.status).code, 0);
  }
  const lines = (await withProbes.log()).split("\n").filter((l) => REQUEST_LINE.test(l));
  // A request no route matched names its path.
  assertEquals(lines.map((l) => REQUEST_LINE.exec(l)![0].split(" ").slice(1).join(" ")), [
    "GET /health 200 ",
    "GET unmatched path=/nope 404 ",
  ]);

  // At warn only 5xx request lines are written (tests/http_request_log_test.ts has one); the
  // start-up and drain lines are not request lines and stay.
  const quiet = await spawnUntilListening(
    ["task", "start", "--port", "0", "--kv-memory", "1MiB", "--log-level", "warn", "--log-probes"],
    { cwd: root, env },
  );
  try {
    await (await fetch(quiet.base + "/health")).body?.cancel();
    await (await fetch(quiet.base + "/nope")).body?.cancel();
    const res = await fetch(quiet.base + "/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once", max_tokens: 2 }),
    });
    assertEquals(res.status, 200);
    await res.body?.cancel();
  } finally {
    quiet.child.kill("SIGTERM");
    assertEquals((await quiet.child.status).code, 0);
  }
  const quietLog = await quiet.log();
  assertEquals(quietLog.split("\n").filter((l) => REQUEST_LINE.test(l)), []);
  assertStringIncludes(quietLog, "drained: all in-flight generations finished");
  const bad = await new Deno.Command(Deno.execPath(), {
    args: ["task", "start", "--port", "0", "--chat-template", "/nonexistent/t.jinja"],
    cwd: root,
    env,
    stdout: "null",
    stderr: "piped",
  }).output();
  assertEquals(bad.code, 1);
  const err = decoder.decode(bad.stderr);
  assertStringIncludes(err, 'Cannot read --chat-template "/nonexistent/t.jinja"');
  assert(!err.includes("listening"), err);
});
