/**
 * The logit controls over HTTP and the WebSocket: each field reaches the core as its controls,
 * is refused with a 400 naming it when out of range, and, on the real stories260K model, the
 * served text is what the reference engine generates with the same penalties and bias.
 */
// deno-lint-ignore-file no-explicit-any
import { assertAlmostEquals, assertEquals, assertMatch } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { serveService } from "../lib/http/serve.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { type LogitControls, PenaltyState } from "../lib/core/logit_controls.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { parseSse, postJson, startService, TestSocket } from "./_http_harness.ts";
import { topLogprobs } from "../lib/engine/top_logprobs.ts";
import { seedToU32 } from "../lib/util/rng.ts";
import { modelFile } from "./harness/model_files.ts";

const msgs = [{ role: "user", content: "Tell me a story" }];
const ENDPOINTS = [
  ["/v1/completions", { prompt: "Once upon a time", max_tokens: 4 }],
  ["/v1/chat/completions", { messages: msgs, max_tokens: 4 }],
] as const;

Deno.test("the penalties and logit_bias reach the core as its logit controls, on both endpoints", async () => {
  await using svc = await startService();
  const cases: [Record<string, unknown>, LogitControls | undefined][] = [
    [{ presence_penalty: 0.5, frequency_penalty: -1.25 }, {
      presencePenalty: 0.5,
      frequencyPenalty: -1.25,
    }],
    [{ logit_bias: { "17": -100, "3": 2.5, "9": 0 } }, { logitBias: [[3, 2.5], [17, -100]] }],
    // vLLM's spelling: no window; llama-server's: its default window of 64 unless given.
    [{ repetition_penalty: 1.3 }, { repetitionPenalty: 1.3, repeatLastN: -1 }],
    [{ repeat_penalty: 1.1 }, { repetitionPenalty: 1.1, repeatLastN: 64 }],
    [{ repeat_penalty: 1.1, repeat_last_n: 8 }, { repetitionPenalty: 1.1, repeatLastN: 8 }],
    [{ repetition_penalty: 1.2, repeat_penalty: 1.2 }, { repetitionPenalty: 1.2, repeatLastN: -1 }],
    // At their defaults, or a window of 0: no controls at all.
    [
      { presence_penalty: 0, frequency_penalty: 0, logit_bias: {}, repetition_penalty: 1 },
      undefined,
    ],
    [{ repeat_penalty: 1.5, repeat_last_n: 0 }, undefined],
  ];
  for (const [path, body] of ENDPOINTS) {
    for (const [fields, want] of cases) {
      const res = await postJson(svc.base + path, { ...body, ...fields });
      assertEquals(res.status, 200, `${path} ${JSON.stringify(fields)}: ${await res.text()}`);
      assertEquals(
        svc.backend.requests.at(-1)!.controls,
        want,
        `${path} ${JSON.stringify(fields)}`,
      );
    }
  }
});

Deno.test("out-of-range penalties and biases get a 400 naming the field, on both endpoints and the WebSocket", async () => {
  await using svc = await startService();
  const bad: [Record<string, unknown>, string, RegExp][] = [
    [{ presence_penalty: 2.5 }, "presence_penalty", /too big/],
    [{ frequency_penalty: -3 }, "frequency_penalty", /too small/],
    [{ logit_bias: { "5": 101 } }, "logit_bias.5", /too big/],
    [{ logit_bias: { "five": 1 } }, "logit_bias.five", /keys must be token ids/],
    [
      { logit_bias: { "512": 1 } },
      "logit_bias",
      /token id 512 is outside the model's vocabulary of 512 ids/,
    ],
    [{ repetition_penalty: 0 }, "repetition_penalty", /too small/],
    [{ repeat_penalty: 2.5 }, "repeat_penalty", /too big/],
    [{ repeat_last_n: -2 }, "repeat_last_n", /too small/],
    [{ repetition_penalty: 1.1, repeat_penalty: 1.2 }, "repeat_penalty", /the two differ/],
  ];
  for (const [path, body] of ENDPOINTS) {
    for (const [fields, param, message] of bad) {
      const res = await postJson(svc.base + path, { ...body, ...fields });
      const err = (await res.json()).error;
      assertEquals(res.status, 400, `${path} ${JSON.stringify(fields)}`);
      assertEquals(err.param, param);
      assertMatch(err.message, message);
    }
  }
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    for (const [fields, param, message] of bad) {
      ws.send({ type: "generate", id: "g", prompt: "Once", max_tokens: 2, ...fields });
      const f = await ws.take();
      assertEquals([f.type, f.param], ["error", param], JSON.stringify(fields));
      assertMatch(f.message as string, message);
    }
  } finally {
    await ws.close();
  }
  assertEquals(svc.backend.requests.length, 0, "nothing refused reached the core");
});

// The real model: the served text is the reference engine's, generated here with the core's
// PenaltyState over every token so far.
const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = { numBlocks: 64, blockSize: 16 };

Deno.test("a repetition penalty the engine's f32 cannot divide by gets a 400 naming the field, the bound and the value, over HTTP and the WebSocket", async () => {
  await using svc = await startService();
  const before = svc.backend.requests.length;
  // > 0 as a double: 1e-300 and 5e-46 are 0 as the f32 the engine divides by, and 1e-40 is
  // not, but a logit of 1 divided by it overflows f32 to Infinity.
  const bad: [Record<string, number>, string][] = [
    [{ repetition_penalty: 1e-300 }, "repetition_penalty"],
    [{ repeat_penalty: 5e-46 }, "repeat_penalty"],
    [{ repetition_penalty: 1e-40 }, "repetition_penalty"],
  ];
  const expected = (v: number) => new RegExp(`>= ?0\\.000001.*; got ${v}$`);
  for (const [path, body] of ENDPOINTS) {
    for (const [fields, param] of bad) {
      const res = await postJson(svc.base + path, { ...body, ...fields });
      const err = (await res.json()).error;
      assertEquals(res.status, 400, `${path} ${JSON.stringify(fields)}`);
      assertEquals([err.code, err.param], ["invalid_request", param]);
      assertMatch(err.message, expected(fields[param]!));
    }
  }
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    for (const [fields, param] of bad) {
      ws.send({ type: "generate", id: "g", prompt: "Once", max_tokens: 2, ...fields });
      const f = await ws.take();
      assertEquals([f.type, f.param], ["error", param], JSON.stringify(fields));
      assertMatch(f.message as string, expected(fields[param]!));
    }
  } finally {
    await ws.close();
  }
  assertEquals(svc.backend.requests.length, before, "nothing reached the backend");
  // The bound itself passes (compared as the f32 nearest it, as the engine holds both).
  const ok = { prompt: "Once", max_tokens: 2, repetition_penalty: 1e-6 };
  const res = await postJson(svc.base + "/v1/completions", ok);
  assertEquals(res.status, 200, await res.text());
});

async function oracleText(prompt: number[], n: number, controls: LogitControls): Promise<string> {
  const engine = new CpuEngine(model.config, model.weights, KV);
  const state = new PenaltyState(controls, prompt, prompt.length, [...tokenizer.eogIds]);
  const all = [...prompt], out: number[] = [];
  let start = 0;
  for (let step = 0; step < n; step++) {
    const adjust = state.adjust(all.length);
    const r = await engine.step({
      stepId: step,
      seqs: [{
        seqId: 1,
        tokens: all.slice(start),
        startPos: start,
        blockTable: [0, 1, 2, 3],
        sample: true,
        sampling: GREEDY,
        ...(adjust ? { adjust } : {}),
      }],
    });
    const t = r.sampled[0]!.token;
    if (tokenizer.eogIds.has(t)) break;
    start = all.length;
    all.push(t);
    state.push(t);
    out.push(t);
  }
  engine.dispose();
  return tokenizer.decode(out);
}

/** A service over the reference engine on stories260K, closed by the caller. */
function realService() {
  const make = () => new CpuEngine(model.config, model.weights, KV);
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const service = createApp({
    backend: new CoreBackend("stories260K", core, tokenizer),
    requestLog: new RequestLog("text", () => {}),
  });
  return { core, service };
}

async function post(
  service: { fetch(r: Request): Response | Promise<Response> },
  path: string,
  body: unknown,
) {
  return await service.fetch(
    new Request("http://x" + path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    }),
  );
}

Deno.test("POST /v1/completions on stories260K serves the reference engine's text under repetition, presence and frequency penalties and a logit bias", async () => {
  const { core, service } = realService();
  try {
    const prompt = tokenizer.encode("Once upon a time", { bos: true });
    const complete = async (fields: Record<string, unknown>) => {
      const res = await service.fetch(
        new Request("http://x/v1/completions", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            prompt: "Once upon a time",
            max_tokens: 40,
            temperature: 0,
            ...fields,
          }),
        }),
      );
      assertEquals(res.status, 200);
      return (await res.json()).choices[0].text as string;
    };
    const plain = await complete({});
    const cases: [Record<string, unknown>, LogitControls][] = [
      [{ repetition_penalty: 1.5 }, { repetitionPenalty: 1.5 }],
      [{ presence_penalty: 1.5, frequency_penalty: 0.5 }, {
        presencePenalty: 1.5,
        frequencyPenalty: 0.5,
      }],
      [{ logit_bias: { "432": -100, "426": 3 } }, { logitBias: [[426, 3], [432, -100]] }],
    ];
    for (const [fields, controls] of cases) {
      const got = await complete(fields);
      assertEquals(got, await oracleText(prompt, 40, controls), JSON.stringify(fields));
      assertEquals(got !== plain, true, `${JSON.stringify(fields)} changes the text`);
    }
  } finally {
    service.close();
    await core.close();
  }
});

/** Greedy tokens of the reference engine with each position's n alternatives, as texts. */
async function oracleTop(prompt: number[], steps: number, n: number) {
  const engine = new CpuEngine(model.config, model.weights, KV);
  const out: { text: string; logprob: number; top: [string, number][] }[] = [];
  let feed = prompt, pos = 0;
  for (let step = 0; step < steps; step++) {
    const r = await engine.step({
      stepId: step,
      returnLogits: true,
      seqs: [{
        seqId: 1,
        tokens: feed,
        startPos: pos,
        blockTable: [0, 1, 2, 3],
        sample: true,
        sampling: GREEDY,
      }],
    });
    const s = r.sampled[0]!;
    const t = topLogprobs(s.logits!, n);
    out.push({
      text: tokenizer.decode([s.token]),
      logprob: s.logprob,
      top: t.ids.map((id, k) => [tokenizer.decode([id]), t.logprobs[k]!]),
    });
    pos += feed.length;
    feed = [s.token];
  }
  engine.dispose();
  return out;
}

Deno.test("completions' logprobs: 5 on stories260K lists each position's 5 alternatives of the reference engine (and the sampled token), streaming and not", async () => {
  const { core, service } = realService();
  try {
    const want = await oracleTop(tokenizer.encode("Once upon a time", { bos: true }), 8, 5);
    const body = { prompt: "Once upon a time", max_tokens: 8, temperature: 0, logprobs: 5 };
    const res = await post(service, "/v1/completions", body);
    assertEquals(res.status, 200);
    const lp = (await res.json()).choices[0].logprobs;
    assertEquals(lp.tokens, want.map((w) => w.text));
    lp.top_logprobs.forEach((dict: Record<string, number>, i: number) => {
      const entries = Object.entries(dict);
      assertEquals(entries.map(([t]) => t), want[i]!.top.map(([t]) => t), `position ${i}`);
      entries.forEach(([, v], k) => assertAlmostEquals(v, want[i]!.top[k]![1], 1e-9));
      assertAlmostEquals(lp.token_logprobs[i], want[i]!.logprob, 1e-9);
    });
    const streamed = await post(service, "/v1/completions", { ...body, stream: true });
    const chunks = parseSse(await streamed.text()).filter((c) => c !== "[DONE]") as any[];
    const tops = chunks.flatMap((c) => c.choices[0]?.logprobs?.top_logprobs ?? []);
    assertEquals(tops, lp.top_logprobs, "streamed chunks carry the same alternatives");
  } finally {
    service.close();
    await core.close();
  }
});

Deno.test("chat's top_logprobs: 3 gives OpenAI's content entries with 3 alternatives each, the first the sampled token (greedy); over the WebSocket too", async () => {
  const { core, service } = realService();
  try {
    const body = { messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 };
    const res = await post(service, "/v1/chat/completions", body);
    assertEquals(res.status, 200);
    const content = (await res.json()).choices[0].logprobs.content;
    assertEquals(content.length, 6);
    for (const c of content) {
      assertEquals(c.top_logprobs.length, 3);
      assertEquals(c.top_logprobs[0].token, c.token);
      assertAlmostEquals(c.top_logprobs[0].logprob, c.logprob, 1e-9);
      assertEquals(c.top_logprobs[0].bytes, [...new TextEncoder().encode(c.token)]);
      assertEquals(c.top_logprobs[1].logprob <= c.top_logprobs[0].logprob, true);
    }
    const streamed = await post(service, "/v1/chat/completions", { ...body, stream: true });
    const chunks = parseSse(await streamed.text()).filter((c) => c !== "[DONE]") as any[];
    const entries = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
    assertEquals(entries, content);
    // Asking for alternatives without logprobs is refused, naming the field.
    const bad = await post(service, "/v1/chat/completions", { messages: msgs, top_logprobs: 2 });
    assertEquals([bad.status, (await bad.json()).error.param], [400, "top_logprobs"]);
    const tooMany = await post(service, "/v1/completions", { prompt: "x", logprobs: 21 });
    assertEquals([tooMany.status, (await tooMany.json()).error.param], [400, "logprobs"]);
    // The WebSocket's token frames carry them as top_logprobs: [{token_id, text, logprob}].
    const server = await serveService(service, {
      hostname: "127.0.0.1",
      port: 0,
      drainTimeoutMs: 1000,
      signals: [],
    });
    const ws = await TestSocket.open(`ws://127.0.0.1:${server.addr.port}/v1/stream`);
    try {
      ws.send({
        type: "generate",
        id: "a",
        prompt: "Once upon a time",
        max_tokens: 5,
        temperature: 0,
        logprobs: true,
        top_logprobs: 4,
      });
      const frames = (await ws.collect("a")).filter((f) => f.type === "token") as any[];
      const want = await oracleTop(tokenizer.encode("Once upon a time", { bos: true }), 5, 4);
      assertEquals(frames.length, 5);
      frames.forEach((f, i) => {
        assertEquals(f.top_logprobs.map((a: any) => a.text), want[i]!.top.map(([t]) => t));
        assertEquals(f.top_logprobs[0].token_id, f.token_ids[0]);
      });
      ws.send({ type: "generate", id: "b", prompt: "Once", top_logprobs: 2 });
      const err = await ws.take((f) => f.type === "error");
      assertEquals(err.param, "top_logprobs");
    } finally {
      await ws.close();
      await server.stop();
    }
  } finally {
    service.close();
    await core.close();
  }
});

Deno.test("stop_token_ids, min_tokens and ignore_eos reach the core; out of range they get a 400 naming them", async () => {
  await using svc = await startService();
  for (const [path, body] of ENDPOINTS) {
    const ok = await postJson(svc.base + path, {
      ...body,
      stop_token_ids: [7, 9, 7],
      min_tokens: 2,
      ignore_eos: true,
    });
    assertEquals(ok.status, 200, await ok.text());
    const req = svc.backend.requests.at(-1)!;
    assertEquals([req.stopTokenIds, req.ignoreEos, req.controls], [[7, 9], true, { minTokens: 2 }]);
    const bad: [Record<string, unknown>, string, RegExp][] = [
      [{ stop_token_ids: [-1] }, "stop_token_ids[0]", /too small/],
      [
        { stop_token_ids: [3, 512] },
        "stop_token_ids",
        /token id 512 at index 1 is outside the model's vocabulary of 512 ids/,
      ],
      [{ min_tokens: -1 }, "min_tokens", /too small/],
      [{ min_tokens: 5 }, "min_tokens", /above the 4 tokens this request may generate/],
      [{ ignore_eos: "yes" }, "ignore_eos", /expected boolean/],
    ];
    for (const [fields, param, message] of bad) {
      const res = await postJson(svc.base + path, { ...body, ...fields });
      const err = (await res.json()).error;
      assertEquals([res.status, err.param], [400, param], `${path} ${JSON.stringify(fields)}`);
      assertMatch(err.message, message);
    }
  }
});

/** Seed 6 at temperature 1: stories260K samples BOS (a new story: the end) as its 168th token. */
const STORY = { prompt: "Once upon a time", temperature: 1, seed: 6, max_tokens: 300 };
const SAMPLED = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: seedToU32(6) };

/** The reference engine's ids for STORY with a min_tokens suppression and the given stops. */
async function storyIds(stops: number[], minTokens = 0): Promise<number[]> {
  const engine = new CpuEngine(model.config, model.weights, KV);
  const prompt = tokenizer.encode(STORY.prompt, { bos: true });
  const state = new PenaltyState({ minTokens }, prompt, prompt.length, stops);
  const all = [...prompt], out: number[] = [];
  let start = 0;
  while (out.length < STORY.max_tokens) {
    const adjust = state.adjust(all.length);
    const r = await engine.step({
      stepId: out.length,
      seqs: [{
        seqId: 1,
        tokens: all.slice(start),
        startPos: start,
        blockTable: TABLE,
        sample: true,
        sampling: SAMPLED,
        ...(adjust ? { adjust } : {}),
      }],
    });
    const t = r.sampled[0]!.token;
    start = all.length;
    all.push(t);
    state.push(t);
    out.push(t);
    if (stops.includes(t)) break;
  }
  engine.dispose();
  return out;
}
const TABLE = Array.from({ length: 32 }, (_, i) => i);

Deno.test("on stories260K over the WebSocket: ignore_eos generates past the story's end, min_tokens holds it back, stop_token_ids ends it early; each the reference engine's ids", async () => {
  const { core, service } = realService();
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  const ws = await TestSocket.open(`ws://127.0.0.1:${server.addr.port}/v1/stream`);
  let n = 0;
  const run = async (fields: Record<string, unknown>) => {
    const id = `g${n++}`;
    ws.send({ type: "generate", id, ...STORY, ...fields });
    const frames = await ws.collect(id, 60_000);
    const ids = frames.filter((f) => f.type === "token").flatMap((f) => f.token_ids as number[]);
    const done = frames.at(-1)!;
    return { ids, finish: done.finish_reason, completion: (done.usage as any)?.completion_tokens };
  };
  try {
    const stops = [tokenizer.bosId, tokenizer.eosId];
    const plain = await run({});
    const story = await storyIds(stops);
    assertEquals(story.length, 168, "the oracle's story ends with BOS at 168");
    assertEquals([plain.ids, plain.finish, plain.completion], [story.slice(0, -1), "stop", 168]);

    const past = await run({ ignore_eos: true });
    const all = await storyIds([]);
    assertEquals([past.ids, past.finish, past.completion], [all, "length", 300]);

    const held = await run({ min_tokens: 200 });
    const want = await storyIds(stops, 200);
    assertEquals(held.ids.length >= 200, true, `min_tokens 200: got ${held.ids.length}`);
    assertEquals(held.ids, stops.includes(want.at(-1)!) ? want.slice(0, -1) : want);

    // Stop at the first occurrence of the story's 10th token.
    const stopId = story[9]!;
    const at = story.indexOf(stopId);
    const cut = await run({ stop_token_ids: [stopId] });
    assertEquals([cut.ids, cut.finish, cut.completion], [story.slice(0, at), "stop", at + 1]);
  } finally {
    await ws.close();
    await server.stop();
    service.close();
    await core.close();
  }
});
