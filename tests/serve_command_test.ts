import { assert, assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { parseServeArgs, serveInfo } from "../lib/cli/serve_args.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile, modelMirror } from "./harness/model_files.ts";
import { spawnServer, spawnUntilListening } from "./_serve_child.ts";

const noEnv = () => undefined;

Deno.test("parseServeArgs() maps flags to settings and collects repeated API keys", () => {
  const c = parseServeArgs([
    "--port",
    "0",
    "--kv-memory",
    "1MiB",
    "--api-key",
    "secret-one",
    "--api-key",
    "secret-two",
  ], noEnv);
  assertEquals(c.port, 0);
  assertEquals(c.kvMemory, 2 ** 20);
  assertEquals(c.apiKey, ["secret-one", "secret-two"]);
});

Deno.test("parseServeArgs() reads served model names, log format, public metrics and the result cache from flags or the environment", () => {
  const c = parseServeArgs([
    "--served-model-name",
    "gpt-4o-mini",
    "--served-model-name",
    "llama",
    "--log-format",
    "json",
    "--metrics-public",
    "--result-cache",
    "64MiB",
  ], noEnv);
  assertEquals(c.servedModelName, ["gpt-4o-mini", "llama"]);
  assertEquals([c.logFormat, c.metricsPublic, c.resultCache], ["json", true, 64 * 2 ** 20]);
  const defaults = parseServeArgs([], noEnv);
  assertEquals(defaults.servedModelName, []);
  assertEquals([defaults.logFormat, defaults.metricsPublic, defaults.resultCache], [
    "text",
    false,
    0,
  ]);
  const env: Record<string, string> = {
    LLMSERVE_SERVED_MODEL_NAMES: "a, b",
    LLMSERVE_METRICS_PUBLIC: "1",
    LLMSERVE_RESULT_CACHE: "1MiB",
  };
  const fromEnv = parseServeArgs([], (n) => env[n]);
  assertEquals([fromEnv.servedModelName, fromEnv.metricsPublic, fromEnv.resultCache], [
    ["a", "b"],
    true,
    2 ** 20,
  ]);
  assertThrows(() => parseServeArgs(["--log-format", "xml"], noEnv), Error, "--log-format");
  assertThrows(() => parseServeArgs(["--result-cache", "lots"], noEnv), Error, "--result-cache");
});

Deno.test("parseServeArgs() refuses an unknown flag by name", () => {
  assertThrows(() => parseServeArgs(["--prot", "80"], noEnv), Error, "--prot");
});

async function expectedGreedy(prompt: string, n: number): Promise<string> {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const tok = new Tokenizer(model.tokenizer!);
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const { tokens } = await referenceGenerate(engine, tok.encode(prompt), n, GREEDY);
  return tok.decode(tokens);
}

for (const backend of ["cpu", "webgpu"]) {
  Deno.test(`the served model (${backend}) streams two concurrent generations on one socket with the reference's greedy text, then drains on SIGTERM`, async () => {
    const { child, base, log } = await spawnServer([], { backend });
    try {
      const ws = new WebSocket(`${base.replace("http", "ws")}/v1/stream`);
      await new Promise((r) => ws.onopen = r);
      const texts: Record<string, string> = { a: "", b: "" };
      const done: Record<string, unknown> = {};
      const finished = new Promise<void>((resolve) => {
        ws.onmessage = (e) => {
          const f = JSON.parse(e.data);
          if (f.type === "token") texts[f.id] += f.text;
          if (f.type === "done" || f.type === "error") done[f.id] = f;
          if (Object.keys(done).length === 2) resolve();
        };
      });
      ws.send(
        JSON.stringify({
          type: "generate",
          id: "a",
          prompt: "Once upon a time",
          max_tokens: 40,
          temperature: 0,
        }),
      );
      ws.send(
        JSON.stringify({
          type: "generate",
          id: "b",
          prompt: "Tom and his dog",
          max_tokens: 30,
          temperature: 0,
        }),
      );
      await finished;
      ws.close();
      assertEquals(texts.a, await expectedGreedy("Once upon a time", 40));
      assertEquals(texts.b, await expectedGreedy("Tom and his dog", 30));
      assertEquals((done.a as { finish_reason: string }).finish_reason, "length");
      const metrics = await (await fetch(`${base}/metrics`)).text();
      assertStringIncludes(metrics, "llm_kv_blocks_used 0");
      assert(/llm_steps_total [1-9]/.test(metrics), "steps should be counted");
    } finally {
      child.kill("SIGTERM");
      const status = await child.status;
      const text = await log();
      assertEquals(status.code, 0, text);
      assertStringIncludes(text, `backend   ${backend}`);
    }
  });
}

Deno.test("the served model refuses a prompt longer than the context with its token count", async () => {
  const { child, base, log } = await spawnServer(["--context-length", "32"]);
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: "Once upon a time there was a very long story ".repeat(4),
        max_tokens: 4,
      }),
    });
    assertEquals(res.status, 400);
    const body = await res.json();
    assertEquals(body.error.code, "context_length_exceeded");
    // The count as the server's tokenizer gives it (llama.cpp's /tokenize shape), and the limit.
    const tokens = (await (await fetch(`${base}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        content: "Once upon a time there was a very long story ".repeat(4),
        add_special: true,
      }),
    })).json()).tokens as number[];
    assert(tokens.length > 32, `${tokens.length} tokens`);
    assertStringIncludes(body.error.message, `The prompt is ${tokens.length} tokens`);
    assertStringIncludes(body.error.message, "32");
  } finally {
    child.kill("SIGTERM");
    assertEquals((await child.status).code, 0, await log());
  }
});

Deno.test("`deno task start` serves the default model under the task's narrow permissions", async () => {
  const root = new URL("..", import.meta.url).pathname;
  const { child, base, log } = await spawnUntilListening(
    ["task", "start", "--port", "0", "--kv-memory", "1MiB"],
    { cwd: root, env: { MODEL_MIRROR: modelMirror() } },
  );
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 12, temperature: 0 }),
    });
    assertEquals(res.status, 200);
    const body = await res.json();
    assertEquals(body.choices[0].text, await expectedGreedy("Once upon a time", 12));
  } finally {
    child.kill("SIGTERM");
    await child.status;
  }
  assertStringIncludes(await log(), "drained: all in-flight generations finished");
});

Deno.test("parseServeArgs() lets a negative number reach validation, which refuses it with the value", () => {
  const err = assertThrows(() => parseServeArgs(["--drain-timeout", "-1"], noEnv)) as Error;
  assertEquals(
    err.message,
    'Invalid configuration:\n  --drain-timeout: must be 0 or more seconds (received "-1")',
  );
  assertThrows(
    () => parseServeArgs(["--port", "-5"], noEnv),
    Error,
    '--port: must be 0 to 65535 (received "-5")',
  );
  // A value that merely starts with a dash is a value too.
  assertEquals(parseServeArgs(["--model", "-odd-name.gguf"], noEnv).model, "-odd-name.gguf");
});

Deno.test("serve --version names the release and --help ends with examples", () => {
  assertEquals(/^llmserve \d+\.\d+\.\d+ \(deno \d/.test(serveInfo(["--version"])!), true);
  const help = serveInfo(["--help"])!;
  assertStringIncludes(help, "--version");
  assertStringIncludes(help, "Examples:\n  deno task start ");
  assertStringIncludes(help, "--model stories260K-q8_0");
});

Deno.test("--grammar-compile-timeout bounds each structured-output compile: one that outlasts it gets a 400 naming the budget", async () => {
  // A string of up to 100,000 characters expands to that many automaton states: about 0.4 s
  // of compile (grammar_limits.ts), far past a 20 ms budget, well inside the 10 s default.
  const schema = { type: "object", properties: { s: { type: "string", maxLength: 100_000 } } };
  const ask = (base: string) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: "Hi" }],
        max_tokens: 4,
        response_format: { type: "json_schema", json_schema: { name: "s", schema } },
      }),
    });
  const tight = await spawnServer(["--grammar-compile-timeout", "20ms"]);
  try {
    const res = await ask(tight.base);
    const body = await res.json();
    assertEquals(res.status, 400, JSON.stringify(body));
    assertStringIncludes(body.error.message, "the 20 ms compile budget");
  } finally {
    tight.child.kill("SIGTERM");
    assertEquals((await tight.child.status).code, 0, await tight.log());
  }
  const roomy = await spawnServer([]);
  try {
    const res = await ask(roomy.base);
    assertEquals(res.status, 200, await res.text());
  } finally {
    roomy.child.kill("SIGTERM");
    assertEquals((await roomy.child.status).code, 0, await roomy.log());
  }
});

Deno.test("the served model takes --served-model-name, --log-format json, --metrics-public and --result-cache end to end", async () => {
  const { child, base, log } = await spawnServer([
    "--served-model-name",
    "gpt-4o-mini",
    "--served-model-name",
    "tiny",
    "--log-format",
    "json",
    "--metrics-public",
    "--api-key",
    "sk-end-to-end",
    "--result-cache",
    "1MiB",
  ]);
  const auth = { authorization: "Bearer sk-end-to-end", "content-type": "application/json" };
  try {
    const models = await (await fetch(`${base}/v1/models`, { headers: auth })).json();
    assertEquals(models.data.map((m: { id: string }) => m.id), ["gpt-4o-mini", "tiny"]);
    const ask = async () => {
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { ...auth, "x-request-id": "e2e-1" },
        body: JSON.stringify({
          model: "tiny",
          prompt: "Once upon a time",
          max_tokens: 12,
          temperature: 0,
        }),
      });
      assertEquals(res.status, 200);
      return await res.json();
    };
    const first = await ask();
    const second = await ask();
    assertEquals([first.model, first.cached, second.cached], ["tiny", false, true]);
    assertEquals(second.choices[0].text, first.choices[0].text);
    assertEquals(first.choices[0].text, await expectedGreedy("Once upon a time", 12));
    // No key needed for /metrics; the API still wants one.
    const metrics = await fetch(`${base}/metrics`);
    assertEquals(metrics.status, 200);
    assertStringIncludes(await metrics.text(), "llm_result_cache_hits_total 1");
    const refused = await fetch(`${base}/v1/models`);
    await refused.body?.cancel();
    assertEquals(refused.status, 401);
  } finally {
    child.kill("SIGTERM");
    assertEquals((await child.status).code, 0);
  }
  const lines = (await log()).split("\n").filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l));
  const completions = lines.filter((l) => l.route === "/v1/completions");
  assertEquals(completions.map((l) => [l.request_id, l.status, l.cached]), [
    ["e2e-1", 200, false],
    ["e2e-1", 200, true],
  ]);
  assert(
    lines.some((l) => l.route === "/v1/models" && l.status === 401 && l.code === "unauthorized"),
  );
});

Deno.test("the served /metrics passes `promtool check metrics` (Debian's prometheus package)", async () => {
  const { child, base } = await spawnServer();
  try {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 4 }),
    });
    assertEquals(res.status, 200);
    await res.body?.cancel();
    const text = await (await fetch(`${base}/metrics`)).text();
    let promtool: Deno.ChildProcess;
    try {
      promtool = new Deno.Command("promtool", {
        args: ["check", "metrics"],
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
    } catch (e) {
      throw new Error(`promtool is required (apt-get install prometheus; .ci/run does): ${e}`);
    }
    const w = promtool.stdin.getWriter();
    await w.write(new TextEncoder().encode(text));
    await w.close();
    const out = await promtool.output();
    const complaints = new TextDecoder().decode(out.stdout).concat(
      new TextDecoder().decode(out.stderr),
    ).split("\n").map((l) => l.trim()).filter((l) => l !== "");
    assertEquals(
      complaints,
      [],
      `promtool (exit ${out.code}) complained:\n${complaints.join("\n")}`,
    );
    assertEquals(out.code, 0, `promtool exited ${out.code}`);
  } finally {
    child.kill("SIGTERM");
    await child.status;
  }
});
