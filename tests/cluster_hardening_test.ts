/**
 * A router and replicas over a real nats-server with stock limits (max_payload 1 MiB), under
 * inputs chosen to break them: requests too large for the bus, hostile peers on the request
 * and heartbeat subjects. The expected text comes from the CPU reference engine in this process
 * (one sequence alone, no scheduler, no NATS).
 */
import { prefixBlockHashes } from "../lib/core/block_allocator.ts";
import { assert, assertEquals, assertMatch } from "@std/assert";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { metricValue, scrape } from "./_http_harness.ts";
import { Cluster } from "./_cluster.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = ["--kv-memory", "8MiB", "--max-batch-tokens", "128"];
const MIB = 1 << 20;

/** Greedy text of one sequence alone on the CPU engine (stops at EOS or BOS, as the server). */
async function greedyText(prompt: string, maxTokens: number): Promise<string> {
  const ids = tokenizer.encode(prompt, { bos: true });
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const stops = [tokenizer.eosId, tokenizer.bosId];
  const { tokens } = await referenceGenerate(engine, ids, maxTokens, GREEDY, {
    stopTokens: stops,
  });
  const out = stops.includes(tokens.at(-1)!) ? tokens.slice(0, -1) : tokens;
  const dec = tokenizer.createDecoder({ afterBos: ids.at(-1) === tokenizer.bosId });
  return out.map((t) => dec.push(t)).join("") + dec.flush();
}

async function complete(base: string, body: string) {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  return { status: res.status, body: await res.json() };
}

/** A request body just under the HTTP limit (1 MiB), nearly all of it stop strings. */
function bigStopBody(prompt: string): string {
  const head = JSON.stringify({ prompt, max_tokens: 5, temperature: 0, stop: [] }).length;
  const per = Math.floor((MIB - 64 - head) / 16) - 3;
  const stop = Array.from({ length: 16 }, (_, i) => String.fromCharCode(65 + i).repeat(per));
  const body = JSON.stringify({ prompt, max_tokens: 5, temperature: 0, stop });
  assert(body.length < MIB, `body is ${body.length} bytes`);
  return body;
}

/**
 * Heartbeats every 100 ms as replica `id`, copying a real replica's beat `base`: idle, holding
 * the prefix of `ids` and the streams in `streams` (read on each beat). Returns the interval.
 */
function beatAs(
  peer: { publish(subject: string, data: Uint8Array): void },
  base: Record<string, unknown> & { load: Record<string, unknown> },
  id: string,
  streams: string[],
  ids: number[],
): ReturnType<typeof setInterval> {
  let beat = 0;
  const enc = new TextEncoder();
  return setInterval(() =>
    peer.publish(
      "llmserve.replicas",
      enc.encode(JSON.stringify({
        ...base,
        replica: id,
        beat: beat++,
        load: { ...base.load, running: 0, waiting: 0, streams: streams.length },
        prefix: { blockSize: 16, hashes: prefixBlockHashes(ids, 16) },
        streamIds: streams,
      })),
    ), 100);
}

Deno.test("a request too large for the bus is refused with 413 and leaks no replica slot", async () => {
  await using cluster = await Cluster.start();
  const replica = await cluster.replica([...KV, "--max-running", "1", "--max-waiting", "1"]);
  const router = await cluster.router();
  await cluster.routerSees(router, 1);
  const prompt = "Once upon a time";
  // The replica itself takes it: only the hop over NATS is too large.
  const direct = await complete(replica.base, bigStopBody(prompt));
  assertEquals(direct.status, 200, JSON.stringify(direct.body).slice(0, 300));
  // More than max-running + max-waiting of them: a leaked slot each would leave none.
  for (let i = 0; i < 4; i++) {
    const r = await complete(router.base, bigStopBody(prompt));
    assertEquals(r.status, 413, JSON.stringify(r.body).slice(0, 300));
    assertEquals(r.body.error.code, "payload_too_large");
    assertMatch(r.body.error.message, /over the NATS server's max_payload of 1048576 bytes/);
  }
  const ok = await complete(
    router.base,
    JSON.stringify({ prompt, max_tokens: 20, temperature: 0 }),
  );
  assertEquals(ok.status, 200, JSON.stringify(ok.body));
  assertEquals(ok.body.choices[0].text, await greedyText(prompt, 20));
  assertEquals(await fetch(`${router.base}/ready`).then((r) => r.status), 200);
  assertEquals(metricValue(await scrape(replica.base), "llm_requests_running"), 0);
});

const pick = <T>(rand: () => number, xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
const BAD_TOKENS = ["bad id", "a.b", "*", ">", "", "x".repeat(300), "tab\there", "é", "a\nb"];

/**
 * Messages a hostile or broken peer could put on the replica's request subject and on the
 * heartbeat subject: bytes that are not JSON, JSON of the wrong shape, each message type with
 * one field wrong (ids no subject can hold, out-of-range numbers), requests for streams that do
 * not exist, and 1 MB heartbeats with 100,000 bad entries.
 */
function hostileMessages(
  rand: () => number,
  n: number,
  replica: string,
  heartbeat: Record<string, unknown>,
): Array<{ subject: string; data: Uint8Array }> {
  const enc = new TextEncoder();
  const out: Array<{ subject: string; data: Uint8Array }> = [];
  const toReplica = `llmserve.replica.${replica}`;
  const generate = {
    type: "generate",
    stream: "s-fuzz",
    replyTo: "fuzz.sink",
    prompt: [1, 403],
    maxTokens: 1,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
    stop: [],
    priority: "interactive",
    requestId: "fuzz",
    logprobs: false,
    credit: 64,
  };
  for (let i = 0; i < n; i++) {
    const kind = Math.floor(rand() * 12);
    const subject = rand() < 0.5 ? toReplica : "llmserve.replicas";
    let body: unknown;
    switch (kind) {
      case 0: {
        const bytes = new Uint8Array(Math.floor(rand() * 200));
        for (let j = 0; j < bytes.length; j++) bytes[j] = Math.floor(rand() * 256);
        out.push({ subject, data: bytes });
        continue;
      }
      case 1:
        out.push({ subject, data: enc.encode(pick(rand, ['{"type":', "[1,2", "nul", "{}}"])) });
        continue;
      case 2:
        body = pick(rand, [null, 7, "heartbeat", [], [{ type: "info" }], { type: "nope" }]);
        break;
      case 3:
        body = { ...generate, stream: `s-${i}`, replyTo: pick(rand, BAD_TOKENS) };
        break;
      case 4:
        body = { ...generate, stream: pick(rand, BAD_TOKENS) };
        break;
      case 5:
        body = {
          ...generate,
          stream: `s-${i}`,
          prompt: pick(rand, [[], [-1], [1e12], ["a"], null]),
          maxTokens: pick(rand, [0, -5, 1.5, 1e300]),
        };
        break;
      case 6:
        body = {
          type: pick(rand, ["credit", "cancel"]),
          stream: pick(rand, [...BAD_TOKENS, "s-none"]),
          upTo: pick(rand, [-1, 1e20, 3]),
          how: pick(rand, ["cancel", "gone", "x"]),
        };
        break;
      case 7:
        body = { type: "info", part: pick(rand, [-1, 1e9, 0.5, "0"]) };
        break;
      case 8:
        body = { ...heartbeat, replica: pick(rand, BAD_TOKENS) };
        break;
      case 9:
        body = {
          ...heartbeat,
          streamIds: [pick(rand, BAD_TOKENS)],
          beat: pick(rand, [-1, 0.5, 3]),
        };
        break;
      case 10:
        body = { type: "goodbye", replica: pick(rand, BAD_TOKENS) };
        break;
      default:
        if (rand() < 0.02) {
          // A malformed 1 MB heartbeat: 100,000 issues for zod.
          body = { ...heartbeat, prefix: { blockSize: 16, hashes: Array(100_000).fill("xxxxxx") } };
        } else {
          body = { ...generate, stream: `ok-${i}`, replyTo: `fuzz.sink.${i}` };
        }
    }
    out.push({ subject, data: enc.encode(JSON.stringify(body)) });
  }
  return out;
}

Deno.test("thousands of hostile NATS messages leave router and replica serving exact tokens, with bounded logs", async () => {
  const { connectNats } = await import("../lib/cluster/nats_connection.ts");
  await using cluster = await Cluster.start();
  const replica = await cluster.replica(KV);
  const router = await cluster.router();
  await cluster.routerSees(router, 1);
  const nc = await connectNats({ url: cluster.nats.url, name: "fuzzer" });
  try {
    // A real heartbeat, to copy its shape.
    const beats = nc.subscribe("llmserve.replicas", { max: 1 });
    let heartbeat: Record<string, unknown> = {};
    for await (const m of beats) heartbeat = m.json();
    const id = heartbeat.replica as string;
    const enc = new TextEncoder();
    // A heartbeat whose id holds a space, then client requests (it killed the router); a
    // generate whose replyTo holds a space (it killed the replica).
    const spaced = enc.encode(JSON.stringify({ ...heartbeat, replica: "bad id" }));
    const spacedBeats = setInterval(() => nc.publish("llmserve.replicas", spaced), 50);
    try {
      nc.publish(
        `llmserve.replica.${id}`,
        enc.encode(JSON.stringify({
          type: "generate",
          stream: "s-spaced",
          replyTo: "bad reply",
          prompt: [1, 403],
          maxTokens: 2,
          sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
          stop: [],
          priority: "interactive",
          requestId: "spaced",
          logprobs: false,
          credit: 64,
        })),
      );
      // Barriers, not a pause: each process logs the message it refused once it has handled
      // it, so the requests below run after both bad messages, never before.
      await router.logMatch(/router: ignored a malformed announcement/);
      await replica.logMatch(/ignored a malformed request/);
      const during = await Promise.all(
        Array.from(
          { length: 4 },
          () =>
            complete(
              router.base,
              JSON.stringify({ prompt: "Once", max_tokens: 3, temperature: 0 }),
            ),
        ),
      );
      for (const r of during) assertEquals(r.status, 200, JSON.stringify(r.body));
    } finally {
      clearInterval(spacedBeats);
    }
    const rand = (await import("./_fuzz_cases.ts")).seeded(21);
    const messages = hostileMessages(rand, 3000, id, heartbeat);
    for (let i = 0; i < messages.length; i++) {
      nc.publish(messages[i]!.subject, messages[i]!.data);
      if (i % 200 === 199) await nc.flush();
    }
    await nc.flush();
  } finally {
    await nc.close();
  }
  await cluster.routerSees(router, 1);
  for (const prompt of ["Once upon a time", "The little dog"]) {
    const r = await complete(
      router.base,
      JSON.stringify({ prompt, max_tokens: 20, temperature: 0 }),
    );
    assertEquals(r.status, 200, JSON.stringify(r.body));
    assertEquals(r.body.choices[0].text, await greedyText(prompt, 20));
  }
  assertEquals((await fetch(`${replica.base}/health`)).status, 200);
  // What peers make a process log is capped: 10 lines per 10 s of at most ~300 characters.
  for (const m of [replica, router]) {
    m.child.kill("SIGTERM");
    await m.child.status;
    const log = await m.log();
    assert(
      log.length < 64_000,
      `${m.role} logged ${log.length} characters:\n${log.slice(0, 3000)}`,
    );
  }
});

Deno.test("a replica that lists a stream but makes no progress loses it to another replica, exactly", async () => {
  const { connectNats } = await import("../lib/cluster/nats_connection.ts");
  const { RouterBackend } = await import("../lib/cluster/router_backend.ts");
  await using cluster = await Cluster.start();
  await cluster.replica(KV);
  const peer = await connectNats({ url: cluster.nats.url, name: "hung-peer" });
  const routerNc = await connectNats({ url: cluster.nats.url, name: "test-router" });
  const router = await RouterBackend.start(routerNc, { progressTimeoutMs: 1500, waitMs: 15_000 });
  const enc = new TextEncoder();
  const prompt = "Once upon a time there was a little girl named Lily. She loved to play outside";
  const ids = tokenizer.encode(prompt, { bos: true });
  assert(ids.length > 17, `the prompt needs a full block, it has ${ids.length} ids`);
  // A peer that answers "started", lists the stream in every heartbeat, and sends nothing
  // more; it claims the prompt's prefix so the router picks it first.
  const HUNG = "replica-hung";
  const hung: string[] = [];
  const real = await (async () => {
    for await (const m of peer.subscribe("llmserve.replicas", { max: 1 })) return m.json<any>();
  })();
  peer.subscribe(`llmserve.replica.${HUNG}`, {
    callback: (_e, m) => {
      const g = m.json<any>();
      if (g.type !== "generate") return;
      hung.push(g.stream);
      peer.publish(
        g.replyTo,
        enc.encode(JSON.stringify({
          type: "event",
          stream: g.stream,
          seq: 0,
          event: { type: "started", promptTokens: g.prompt.length },
        })),
      );
    },
  });
  const beats = beatAs(peer, real, HUNG, hung, ids);
  try {
    const { until } = await import("./_cluster.ts");
    await until(
      "the router to take the hung peer",
      () => router.registry.inRotation().some((v) => v.id === HUNG),
    );
    const events: GenerationEvent[] = [];
    const run = (async () => {
      for await (
        const e of router.generate({
          prompt: tokenizer.encode(prompt),
          maxTokens: 20,
          sampling: GREEDY,
          stop: [],
          priority: "interactive",
          requestId: "hung",
        }, new AbortController().signal)
      ) events.push(e);
    })();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stuck = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error("the generation was held past 20 s")), 20_000);
    });
    await Promise.race([run, stuck]).finally(() => clearTimeout(timer));
    assertEquals(hung.length, 1, "the hung peer got the request first");
    assertEquals(events.at(-1)?.type, "done", JSON.stringify(events.at(-1)));
    const text = events.map((e) => (e.type === "token" ? e.text : "")).join("");
    assertEquals(text, await greedyText(prompt, 20));
    assertEquals(router.failovers, 1);
  } finally {
    clearInterval(beats);
    router.close();
    await peer.close();
    await routerNc.close();
  }
});

Deno.test("a replica whose frames were lost gives the stream up when the router's credit says so", async () => {
  const { connectNats } = await import("../lib/cluster/nats_connection.ts");
  const { until } = await import("./_cluster.ts");
  await using cluster = await Cluster.start();
  await cluster.replica(KV);
  const nc = await connectNats({ url: cluster.nats.url, name: "router-stand-in" });
  try {
    let listed: string[] = [];
    let id = "";
    nc.subscribe("llmserve.replicas", {
      callback: (_e, m) => {
        const hb = m.json<any>();
        if (hb.type !== "heartbeat") return;
        id = hb.replica;
        listed = hb.streamIds;
      },
    });
    await until("a heartbeat", () => id !== "");
    const enc = new TextEncoder();
    const send = (msg: unknown) =>
      nc.publish(`llmserve.replica.${id}`, enc.encode(JSON.stringify(msg)));
    // Its frames go where nobody listens: lost, as in a reconnect. With credit 2 it sends
    // "started" and one token, then waits for credit.
    send({
      type: "generate",
      stream: "s-lost",
      replyTo: "nobody.listens.here",
      prompt: tokenizer.encode("Once upon a time", { bos: true }),
      maxTokens: 200,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
      stop: [],
      priority: "interactive",
      requestId: "lost",
      logprobs: false,
      credit: 2,
    });
    await until("the replica to list the stream", () => listed.includes("s-lost"));
    // The router got nothing (next 0) and re-sends its grant, as it does for a quiet stream.
    const regrant = setInterval(
      () => send({ type: "credit", stream: "s-lost", upTo: 2, next: 0 }),
      500,
    );
    try {
      // Without the re-sync it would wait for credit for 30 s (the credit timeout).
      await until("the replica to give the stream up", () => !listed.includes("s-lost"), 8000);
    } finally {
      clearInterval(regrant);
    }
  } finally {
    await nc.close();
  }
});

Deno.test("SIGTERM to the router: in-flight HTTP, SSE and WebSocket generations all get their full answers", async () => {
  const { TestSocket, parseSse } = await import("./_http_harness.ts");
  await using cluster = await Cluster.start();
  await cluster.replica(KV);
  const router = await cluster.router();
  await cluster.routerSees(router, 1);
  const prompts = ["Once upon a time", "The little dog", "Lily went to the park"];
  // Streams end first, plain answers last: those are written after their generation ends,
  // which is where a drain that closed every socket at once lost them.
  const n = 150, nStream = 60;
  const refs = await Promise.all(prompts.map((p) => greedyText(p, n)));
  const streamRefs = await Promise.all(prompts.map((p) => greedyText(p, nStream)));
  const body = (prompt: string, stream: boolean) =>
    JSON.stringify({ prompt, max_tokens: stream ? nStream : n, temperature: 0, stream });
  const post = (prompt: string, stream: boolean) =>
    fetch(`${router.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: body(prompt, stream),
    });
  const plain = Array.from(
    { length: 8 },
    (_, i) => post(prompts[i % 3]!, false).then((r) => r.json()),
  );
  const streams = await Promise.all(prompts.map((p) => post(p, true)));
  const readers = streams.map((r) => r.body!.pipeThrough(new TextDecoderStream()).getReader());
  const firstChunks = await Promise.all(readers.map((r) => r.read().then((c) => c.value ?? "")));
  const ws = await TestSocket.open(router.base.replace("http", "ws") + "/v1/stream");
  try {
    prompts.forEach((p, i) =>
      ws.send({ type: "generate", id: `w${i}`, prompt: p, max_tokens: nStream, temperature: 0 })
    );
    const firstWs = await Promise.all(
      prompts.map((_, i) => ws.take((f) => f.id === `w${i}` && f.type === "token")),
    );
    const status = cluster.kill(router, "SIGTERM");
    const rest = readers.map(async (r, i) => {
      let text = firstChunks[i]!;
      for (let c = await r.read(); !c.done; c = await r.read()) text += c.value;
      return text;
    });
    for (const [i, a] of (await Promise.all(plain)).entries()) {
      assertEquals(
        a.choices?.[0]?.text,
        refs[i % 3],
        `HTTP ${i}: ${JSON.stringify(a).slice(0, 200)}`,
      );
    }
    for (const [i, text] of (await Promise.all(rest)).entries()) {
      const events = parseSse(text) as any[];
      assertEquals(events.at(-1), "[DONE]", `SSE ${i}`);
      assertEquals(events.slice(0, -1).map((e) => e.choices[0].text).join(""), streamRefs[i]);
    }
    for (const [i, first] of firstWs.entries()) {
      const frames = await ws.collect(`w${i}`);
      const text = [first, ...frames].filter((f) => f.type === "token").map((f) => f.text).join("");
      assertEquals(frames.at(-1)!.finish_reason, "length");
      assertEquals(text, streamRefs[i], `WebSocket ${i}`);
    }
    assertEquals((await status).code, 0);
  } finally {
    await ws.close();
  }
});

Deno.test("failover after text the stop matcher held: the client gets every character, once", async () => {
  const { connectNats } = await import("../lib/cluster/nats_connection.ts");
  const { RouterBackend } = await import("../lib/cluster/router_backend.ts");
  const { TestSocket } = await import("./_http_harness.ts");
  const { until } = await import("./_cluster.ts");
  await using cluster = await Cluster.start();
  const real = await cluster.replica(KV);
  const prompt = "Once upon a time there was a little girl named Lily. She loved to play outside";
  const ids = tokenizer.encode(prompt, { bos: true });
  const n = 20;
  const want = await greedyText(prompt, n);
  // A stop that begins inside the second generated token's text and never completes: the
  // matcher sends that token's text up to its last character and holds the rest.
  const refIds = await (async () => {
    const ws = await TestSocket.open(real.base.replace("http", "ws") + "/v1/stream");
    ws.send({ type: "generate", id: "r", prompt, max_tokens: n, temperature: 0 });
    const frames = await ws.collect("r");
    await ws.close();
    return frames.filter((f) => f.type === "token").flatMap((f) => f.token_ids as number[]);
  })();
  const second = tokenizer.createDecoder({ afterBos: false });
  const texts = refIds.map((id) => second.push(id));
  const stop = texts[1]!.slice(-1) + "#";
  assert(texts[1]!.length >= 2 && !want.includes(stop), `stop ${JSON.stringify(stop)}`);
  // What the replica sends for that request: the peer below replays its first two token events.
  const events = await (async () => {
    const ws = await TestSocket.open(real.base.replace("http", "ws") + "/v1/stream");
    ws.send({ type: "generate", id: "s", prompt, max_tokens: n, temperature: 0, stop: [stop] });
    const frames = await ws.collect("s");
    await ws.close();
    return frames.filter((f) => f.type === "token").slice(0, 2).map((f) => ({
      type: "token",
      text: f.text,
      ids: f.token_ids,
      logprob: f.logprob ?? 0,
    }));
  })();
  const peer = await connectNats({ url: cluster.nats.url, name: "dying-peer" });
  const routerNc = await connectNats({ url: cluster.nats.url, name: "test-router" });
  // Round-robin over ids sorted: the peer ("replica-0000") takes the first attempt, although
  // the real replica holds the prompt's prefix from the reference runs above.
  const router = await RouterBackend.start(routerNc, {
    progressTimeoutMs: 1500,
    waitMs: 15_000,
    policy: "round-robin",
  });
  const enc = new TextEncoder();
  const PEER = "replica-0000";
  const served: string[] = [];
  const hb = await (async () => {
    for await (const m of peer.subscribe("llmserve.replicas", { max: 1 })) return m.json<any>();
  })();
  peer.subscribe(`llmserve.replica.${PEER}`, {
    callback: (_e, m) => {
      const g = m.json<any>();
      if (g.type !== "generate") return;
      served.push(g.stream);
      const frames = [{ type: "started", promptTokens: g.prompt.length }, ...events];
      frames.forEach((event, seq) =>
        peer.publish(
          g.replyTo,
          enc.encode(JSON.stringify({ type: "event", stream: g.stream, seq, event })),
        )
      );
    },
  });
  const beats = beatAs(peer, hb, PEER, served, ids);
  try {
    await until(
      "the router to take the peer",
      () => router.registry.inRotation().some((v) => v.id === PEER),
    );
    const got: GenerationEvent[] = [];
    for await (
      const e of router.generate({
        prompt: tokenizer.encode(prompt),
        maxTokens: n,
        sampling: GREEDY,
        stop: [stop],
        priority: "interactive",
        requestId: "held",
      }, new AbortController().signal)
    ) got.push(e);
    assertEquals(served.length, 1, "the peer served the first attempt");
    assertEquals(router.failovers, 1);
    assertEquals(got.at(-1)?.type, "done", JSON.stringify(got.at(-1)));
    assertEquals(got.map((e) => (e.type === "token" ? e.text : "")).join(""), want);
  } finally {
    clearInterval(beats);
    router.close();
    await peer.close();
    await routerNc.close();
  }
});
