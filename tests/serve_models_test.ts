/**
 * One server with three compat models (and a corrupt fourth) under a memory budget that holds
 * any two of the three but not all: each answer equals what `generate` prints for the same
 * file alone; the least recently used idle model is the one unloaded, and reloaded on its next
 * request; a model whose stream is still being read is never unloaded; concurrent first
 * requests share one load; the corrupt file's load answers its requests with a clear error and
 * the others keep serving; keep_alive 0 unloads after the request, -1 outlasts the pressure
 * that takes the others.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { Ajv } from "ajv";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { otlpAttr, startOtlpCollector } from "./_otlp_collector.ts";

const A = "stories260K-q4_1";
const B = "stories260K-q5_1";
const C = "tinyllama-like-q4_0";
const BROKEN = "broken";
const PROMPT = "Once upon a time";
const N = 12;
const BUDGET = 17 * 2 ** 20;

const generateAlone = (stem: string) => generateCompat(stem, PROMPT, N);

Deno.test("three models in one server under a budget that fits two", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "serve_models_test_" });
  const whole = await Deno.readFile(compatPath(A));
  // The header is whole (so it is listed), the tensors are cut off (so its load fails).
  await Deno.writeFile(`${dir}/${BROKEN}.gguf`, whole.subarray(0, whole.length >> 1));
  const [oracle, server] = await Promise.all([
    Promise.all([A, B, C].map(generateAlone)).then(([a, b, c]): Record<string, string> => ({
      [A]: a!,
      [B]: b!,
      [C]: c!,
    })),
    spawnCpuServer([
      "--memory-budget",
      String(BUDGET),
      // keep_alive -1 keeps a model forever only where the operator allows it.
      "--max-keep-alive",
      "-1",
      "--model",
      compatPath(A),
      "--model",
      compatPath(B),
      "--model",
      compatPath(C),
      "--model",
      `${dir}/${BROKEN}.gguf`,
    ]),
  ]);
  const base = server.base;
  const { complete, text, health, phases, metric, openStream, inFlight, until } = client(base);
  try {
    await t.step("/v1/models lists every model, none loaded", async () => {
      const list = await (await fetch(`${base}/v1/models`)).json();
      assertEquals(list.data.map((m: { id: string }) => m.id), [A, B, C, BROKEN]);
      for (const m of list.data) assertEquals(m.loaded, false);
      const a = list.data[0];
      assertEquals([a.architecture, a.format, a.size_bytes], ["llama", "gguf", whole.length]);
      assert(a.quantization.startsWith("Q4_1"), a.quantization);
      assertEquals(list.data[2].max_model_len, 2048);
    });

    await t.step(
      "concurrent first requests share one load and get the model's own tokens",
      async () => {
        const texts = await Promise.all([text(A), text(A), text(A)]);
        assertEquals(texts, [oracle[A], oracle[A], oracle[A]]);
        assertEquals(await metric("llm_model_loads_total", A), 1);
      },
    );

    await t.step(
      "the least recently used idle model is unloaded, and reloaded when asked for",
      async () => {
        assertEquals(await text(B), oracle[B]);
        assertEquals(await phases(), {
          [A]: "loaded",
          [B]: "loaded",
          [C]: "unloaded",
          [BROKEN]: "unloaded",
        });
        const h = await health();
        const [a, b] = [h[A]!.bytes!, h[B]!.bytes!];
        assertEquals(await text(C), oracle[C]);
        const c = (await health())[C]!.bytes!;
        // The budget holds any two of them, never all three.
        assert(Math.max(a + b, a + c, b + c) <= BUDGET && a + b + c > BUDGET, `${a} ${b} ${c}`);
        assertEquals(await phases(), {
          [A]: "unloaded",
          [B]: "loaded",
          [C]: "loaded",
          [BROKEN]: "unloaded",
        });
        assertEquals(await metric("llm_model_evictions_total", A), 1);
        assertEquals(await text(A), oracle[A]); // B is now the least recently used
        assertEquals(await phases(), {
          [A]: "loaded",
          [B]: "unloaded",
          [C]: "loaded",
          [BROKEN]: "unloaded",
        });
        assertEquals(await metric("llm_model_loads_total", A), 2);
        // Alternating requests keep giving each model's own tokens across the swaps.
        for (const m of [B, C, A, B]) assertEquals(await text(m), oracle[m]);
      },
    );

    await t.step("a model with a generation running is never unloaded", async () => {
      assertEquals(await text(C), oracle[C]);
      assertEquals(await text(A), oracle[A]);
      assertEquals(await phases(), {
        [A]: "loaded",
        [B]: "unloaded",
        [C]: "loaded",
        [BROKEN]: "unloaded",
      });
      const evictionsOfC = await metric("llm_model_evictions_total", C);
      const onC = await openStream(C, 2000); // C is the least recently used, and busy
      assertEquals(await inFlight(C), 1);
      assertEquals(await text(B), oracle[B]); // so loading B unloads the idle A
      assertEquals(await inFlight(C), 1); // still running: it was busy throughout
      assertEquals(await phases(), {
        [A]: "unloaded",
        [B]: "loaded",
        [C]: "loaded",
        [BROKEN]: "unloaded",
      });
      const all = await onC.finish();
      assert(all.includes('"finish_reason":"length"'), all.slice(-400));
      assert(all.trimEnd().endsWith("data: [DONE]"), all.slice(-200));
      assertEquals(await metric("llm_model_evictions_total", C), evictionsOfC);
      assertEquals(await text(A), oracle[A]); // once idle, they can be unloaded again
    });

    await t.step(
      "a failing load answers its requests with a clear error; the others serve on",
      async () => {
        const results = await Promise.all([complete(BROKEN), complete(BROKEN)]);
        for (const r of results) {
          // The server cannot serve it as configured: a 503, with no Retry-After, since
          // waiting will not mend the file (never a 500, which says the server broke).
          assertEquals([r.status, r.retryAfter], [503, null], JSON.stringify(r.body));
          assertEquals(r.body.error.code, "model_load_failed");
          assertEquals(r.body.error.param, "model");
          assertStringIncludes(r.body.error.message, `Cannot load model "${BROKEN}": `);
          assertStringIncludes(r.body.error.message, BROKEN + ".gguf");
        }
        const stream = await fetch(`${base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: BROKEN, prompt: PROMPT, stream: true }),
        });
        const events = await stream.text();
        assert(events.startsWith(`: loading model "${BROKEN}"`), events.slice(0, 200));
        const last = JSON.parse(events.trimEnd().split("\n").pop()!.slice("data: ".length));
        assertEquals(last.error.code, "model_load_failed");
        assertStringIncludes(last.error.message, `Cannot load model "${BROKEN}": `);
        const h = await health();
        assertEquals(h[BROKEN]!.phase, "unloaded");
        assertStringIncludes(h[BROKEN]!.last_error!, `Cannot load model "${BROKEN}"`);
        for (const m of [A, C, B]) assertEquals(await text(m), oracle[m]);
        // The body is read to find the model, up to the same 1 MiB limit a model's app has.
        const huge = await fetch(`${base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: A, prompt: "x".repeat(2 << 20) }),
        });
        assertEquals(huge.status, 413);
        assertEquals((await huge.json()).error.code, "payload_too_large");
        const unknown = await complete("no-such-model");
        assertEquals(unknown.status, 404);
        assertEquals(unknown.body.error.code, "model_not_found");
        assertStringIncludes(unknown.body.error.message, `"${A}", "${B}", "${C}", "${BROKEN}"`);
      },
    );

    await t.step("keep_alive 0 unloads the model after its request", async () => {
      assertEquals(await text(A, { keep_alive: 0 }), oracle[A]);
      await until(A, "unloaded");
      // A stream for it now hears how the load goes first (SSE comments), then the tokens.
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: A,
          prompt: PROMPT,
          max_tokens: N,
          temperature: 0,
          stream: true,
        }),
      });
      assertEquals(res.status, 200);
      const sse = await res.text();
      assert(sse.startsWith(`: loading model "${A}"`), sse.slice(0, 200));
      const streamed = sse.split("\n").filter((l) => l.startsWith("data: {")).map((l) =>
        JSON.parse(l.slice(6)).choices[0].text
      ).join("");
      assertEquals(streamed, oracle[A]);
      assert(sse.trimEnd().endsWith("data: [DONE]"), sse.slice(-200));
      const bad = await complete(A, { keep_alive: "soon" });
      assertEquals(bad.status, 400);
      assertEquals(bad.body.error.param, "keep_alive");
      assertStringIncludes(bad.body.error.message, '"soon"');
    });

    await t.step(
      "keep_alive -1 keeps a model through the pressure that takes the others",
      async () => {
        const evictionsOfC = await metric("llm_model_evictions_total", C);
        assertEquals(await text(C, { keep_alive: -1 }), oracle[C]);
        assertEquals(await text(B), oracle[B]); // C is now the least recently used
        assertEquals(await text(A), oracle[A]); // must evict B, the unpinned one
        assertEquals(await phases(), {
          [A]: "loaded",
          [B]: "unloaded",
          [C]: "loaded",
          [BROKEN]: "unloaded",
        });
        assertEquals(await text(B), oracle[B]); // and again A, never C
        assertEquals((await phases())[C], "loaded");
        assertEquals(await metric("llm_model_evictions_total", C), evictionsOfC);
      },
    );

    await t.step("/metrics passes promtool with every model's families labelled", async () => {
      const body = await (await fetch(`${base}/metrics`)).text();
      assert(body.includes(`llm_http_requests_total{model="${A}",`), body.slice(0, 2000));
      const promtool = new Deno.Command("promtool", {
        args: ["check", "metrics"],
        stdin: "piped",
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      const w = promtool.stdin.getWriter();
      await w.write(new TextEncoder().encode(body));
      await w.close();
      const out = await promtool.output();
      const said = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
      assertEquals(said.trim(), "", said);
      assertEquals(out.code, 0);
    });
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
  const log = await server.log();
  assertStringIncludes(log, `model ${A} loaded in`);
  assertStringIncludes(log, "(3 waiting; grammar engine starting in the background)");
  // keep_alive 0 left A's parsed file, and the stream after it reused it (with its tokens).
  assert(
    new RegExp(
      `model ${A} loaded in [\\d.]+ s \\(1 waiting; reused its parsed file; grammar engine starting in the background\\)`,
    ).test(log),
    log,
  );
});

/** Requests to the server at `base`, and what its /health and /metrics say. */
function client(base: string) {
  const complete = async (model: string, extra: Record<string, unknown> = {}) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0, ...extra }),
    });
    return {
      status: res.status,
      body: await res.json(),
      retryAfter: res.headers.get("retry-after"),
    };
  };
  const text = async (model: string, extra: Record<string, unknown> = {}) => {
    const r = await complete(model, extra);
    assertEquals(r.status, 200, JSON.stringify(r.body));
    assertEquals(r.body.model, model);
    return r.body.choices[0].text as string;
  };
  const health = async () =>
    (await (await fetch(`${base}/health`)).json()).models as Record<
      string,
      { phase: string; bytes?: number; in_flight?: number; last_error?: string }
    >;
  const phases = async () =>
    Object.fromEntries(Object.entries(await health()).map(([k, v]) => [k, v.phase]));
  const metric = async (name: string, model: string) => {
    const body = await (await fetch(`${base}/metrics`)).text();
    const line = body.split("\n").find((l) => l.startsWith(`${name}{model="${model}"}`));
    if (line === undefined) throw new Error(`no ${name} for ${model} in /metrics`);
    return Number(line.split(" ").pop());
  };
  /**
   * Opens a long generation and reads its first chunk. The model is busy while it runs, which
   * /health's in_flight shows; the long ones here take seconds, a load a fraction of one.
   */
  const openStream = async (model: string, maxTokens: number) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model,
        prompt: PROMPT,
        max_tokens: maxTokens,
        temperature: 0,
        stream: true,
      }),
    });
    assertEquals(res.status, 200);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    let got = (await reader.read()).value ?? "";
    return {
      async finish() {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) return got;
          got += value;
        }
      },
    };
  };
  const inFlight = async (model: string) => (await health())[model]?.in_flight ?? 0;
  const until = async (model: string, phase: string) => {
    const deadline = Date.now() + 10_000;
    while ((await phases())[model] !== phase && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    assertEquals((await phases())[model], phase);
  };

  return { complete, text, health, phases, metric, openStream, inFlight, until };
}

Deno.test("--max-loaded-models 1: a load that needs the busy model gone is refused, then served", async () => {
  const server = await spawnCpuServer([
    "--max-loaded-models",
    "1",
    "--model",
    compatPath(C),
    "--model",
    compatPath(A),
  ]);
  const { complete, text, phases, openStream, inFlight } = client(server.base);
  try {
    const oracleA = await generateAlone(A);
    await text(C); // loaded first: the stream below is a running generation, not a load
    const onC = await openStream(C, 2000);
    assertEquals(await inFlight(C), 1);
    const refused = await complete(A);
    assertEquals(await inFlight(C), 1); // still running: it was busy when A was asked for
    assertEquals(refused.status, 503, JSON.stringify(refused.body));
    assertEquals(refused.body.error.code, "insufficient_memory");
    assertStringIncludes(
      refused.body.error.message,
      `Cannot load model "${A}": 1 models are loaded, the most --max-loaded-models allows`,
    );
    assertStringIncludes(refused.body.error.message, `${C} `);
    assertStringIncludes(refused.body.error.message, "(busy: 1 request running;");
    assertEquals((await phases())[C], "loaded");
    const all = await onC.finish();
    assert(all.includes('"finish_reason":"length"'), all.slice(-400));
    assertEquals(await text(A), oracleA); // C idle now: it makes way
    assertEquals(await phases(), { [C]: "unloaded", [A]: "loaded" });
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});

Deno.test("a server of several models honours response_format json_schema on each of them", async () => {
  const server = await spawnCpuServer([
    "--model",
    compatPath(A),
    "--model",
    compatPath(C),
  ]);
  const schema = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 8 },
      age: { type: "integer", minimum: 1, maximum: 20 },
      color: { enum: ["black", "white"] },
    },
    required: ["name", "age", "color"],
    additionalProperties: false,
  };
  const validate = new Ajv({ strict: false }).compile(schema);
  try {
    for (const model of [A, C]) {
      const res = await fetch(`${server.base}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model,
          messages: [{ role: "user", content: "Describe a cat" }],
          max_tokens: 256,
          seed: 7,
          response_format: { type: "json_schema", json_schema: { name: "cat", schema } },
        }),
      });
      const body = await res.json();
      assertEquals(res.status, 200, `${model}: ${JSON.stringify(body)}`);
      assertEquals(body.model, model);
      const content: string = body.choices[0].message.content;
      assertEquals(body.choices[0].finish_reason, "stop", `${model}: ${content}`);
      // Checked by an independent validator: the grammar service is not its own oracle.
      assert(
        validate(JSON.parse(content)),
        `${model}: ${content}: ${JSON.stringify(validate.errors)}`,
      );
    }
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});

Deno.test("each load has its own llm.model.load span, a failed one with its error", async () => {
  const collector = startOtlpCollector();
  const dir = await Deno.makeTempDir({ prefix: "serve_models_span_" });
  const whole = await Deno.readFile(compatPath(A));
  await Deno.writeFile(`${dir}/${BROKEN}.gguf`, whole.subarray(0, whole.length >> 1));
  const server = await spawnCpuServer([
    "--model",
    compatPath(A),
    "--model",
    `${dir}/${BROKEN}.gguf`,
  ], { env: collector.env });
  const { complete, text } = client(server.base);
  try {
    await text(A);
    assertEquals((await complete(BROKEN)).status, 503);
    server.child.kill("SIGTERM");
    assertEquals((await server.child.status).code, 0, await server.log());
    const loads = collector.spans.filter((s) => s.name === "llm.model.load");
    assertEquals(loads.map((s) => otlpAttr(s, "llm.model")).sort(), [BROKEN, A].sort());
    const ok = loads.find((s) => otlpAttr(s, "llm.model") === A)!;
    assert(Number(otlpAttr(ok, "llm.model.bytes")) > whole.length, JSON.stringify(ok.attributes));
    // Under the HTTP span of the request that asked for the model.
    assert(collector.spans.some((s) => s.spanId === ok.parentSpanId), "no parent span");
    const failed = loads.find((s) => otlpAttr(s, "llm.model") === BROKEN)!;
    assertEquals(otlpAttr(failed, "error.type"), "Error");
    assertEquals(failed.status?.code, 2); // STATUS_CODE_ERROR
    assertStringIncludes(failed.status?.message ?? "", `${BROKEN}.gguf`);
  } finally {
    await collector.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("--all-models serves every GGUF file of the models directory by its name, links included", async () => {
  const dir = await Deno.makeTempDir({ prefix: "serve_models_dir_" });
  await Deno.copyFile(compatPath(A), `${dir}/${A}.gguf`);
  // A shared model store: a link to the one copy of the file.
  await Deno.symlink(await Deno.realPath(compatPath(B)), `${dir}/${B}.gguf`);
  // A link whose target is gone is not a model.
  await Deno.symlink(`${dir}/gone.gguf`, `${dir}/dangling.gguf`);
  // Not a GGUF file: a llama2.c checkpoint needs its tokenizer, so --all-models leaves it out.
  await Deno.writeFile(`${dir}/notes.bin`, new Uint8Array(64));
  const server = await spawnCpuServer([
    "--models-dir",
    dir,
    "--all-models",
  ]);
  const { text } = client(server.base);
  try {
    const list = await (await fetch(`${server.base}/v1/models`)).json();
    assertEquals(list.data.map((m: { id: string }) => m.id), [A, B]);
    assertEquals(await text(B), await generateAlone(B));
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a model whose file's context does not fit --kv-memory loads with its context shortened, and says so", async () => {
  // qwen3-like declares 40,960 tokens; 64 MiB holds 2,048 of its 16-token blocks (its K and V
  // take 2 x 8 layers x 16 tokens x 8 KV heads x 128 x 2 bytes = 64 KiB a block, in f16).
  const server = await spawnCpuServer([
    "--kv-memory",
    "64MiB",
    "--model",
    compatPath(A),
    "--model",
    compatPath("qwen3-like-q4_k_m"),
  ]);
  try {
    const res = await fetch(`${server.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "qwen3-like-q4_k_m", prompt: "Hi", max_tokens: 2 }),
    });
    assertEquals(res.status, 200, await res.text());
    const props = await (await fetch(`${server.base}/props?model=qwen3-like-q4_k_m`)).json();
    assertEquals(props.context_length, 2048 * 16);
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
  assertStringIncludes(await server.log(), "context shortened from 40960 to 32768 tokens");
});
