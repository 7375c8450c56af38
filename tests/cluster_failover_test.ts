/**
 * The router's failover, in process: two real ReplicaAgents (each over the real serving core
 * with the fake model, tests/_fake_core.ts) and a real RouterBackend, on an in-process NATS
 * (tests/_fake_nats.ts) whose tap kills the first stream at every point: each frame in turn
 * (the `started` frame, before any token; each token; the final `done`), in each way a stream
 * is lost (frames lost on the way, the replica dying without a word, the replica saying
 * goodbye, a replica listing the stream but sending nothing, a refusal before the start).
 *
 * Exactness: the client's ids and text equal the uninterrupted run's (the same seeded request
 * through the same cluster with nothing killed), which equals the fake model's own
 * continuation computed without any core; no token repeated, none missing, usage counts each
 * once. The typed loss reason is checked in llm_router_lost_streams_total and the log.
 */
import { assert, assertEquals } from "@std/assert";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import type { SamplingParams } from "../lib/engine/engine.ts";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { decodeMessage, StreamFrame } from "../lib/cluster/messages.ts";
import { ReplicaAgent, type ReplicaSource } from "../lib/cluster/replica.ts";
import { RouterBackend, type RouterOptions } from "../lib/cluster/router_backend.ts";
import type { StreamLossKind } from "../lib/cluster/stream_loss.ts";
import { LOSS_LABEL } from "../lib/cluster/stream_loss.ts";
import { tokenizerToWire } from "../lib/cluster/tokenizer_wire.ts";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { FakeCore } from "./_fake_core.ts";
import { metricValue } from "./_http_harness.ts";
import { modelFile } from "./harness/model_files.ts";
import { FakeNatsConnection, FakeNatsServer, type TappedMessage } from "./_fake_nats.ts";

const TOKENIZER_DATA = parseLlama2cTokenizer(
  await Deno.readFile(modelFile("tok512.bin")),
  512,
  "tok512.bin",
);
const SAMPLING: SamplingParams = { temperature: 0.9, topK: 0, topP: 1, minP: 0, seed: 424242 };
const PROMPT = "Once upon a time there was a little dog";
const MAX_TOKENS = 8;

function source(core: FakeCore, refuse?: { first: boolean }): ReplicaSource {
  // With `refuse`, the first generation any replica sharing it is asked for is refused
  // (overloaded) before it starts, as a full scheduler answers; the agent's path is the real one.
  const backend = refuse === undefined ? core : new Proxy(core, {
    get(target, key) {
      if (key !== "generate") {
        const v = Reflect.get(target, key);
        return typeof v === "function" ? v.bind(target) : v;
      }
      return (req: GenerationRequest, signal: AbortSignal) => {
        if (!refuse.first) return target.generate(req, signal);
        refuse.first = false;
        return (async function* (): AsyncGenerator<GenerationEvent> {
          yield { type: "error", code: "overloaded", message: "the scheduler is full" };
        })();
      };
    },
  });
  return {
    backend,
    info: {
      modelName: core.modelName,
      contextLength: core.contextLength,
      vocabSize: core.vocabSize,
      bosToken: core.bosToken,
      eosToken: core.eosToken,
      chatTemplate: core.chatTemplate,
      tokenizer: tokenizerToWire(TOKENIZER_DATA),
    },
    blockSize: 16,
    load: () => {
      const s = core.serving.schedulerStats();
      return {
        running: s.running,
        waiting: s.waiting,
        maxRunning: 8,
        maxWaiting: 8,
        kvBlocksUsed: s.kvBlocksUsed,
        kvBlocksTotal: s.kvBlocksTotal,
        prefixQueryTokens: s.prefixQueryTokens,
        prefixHitTokens: s.prefixHitTokens,
      };
    },
    cachedBlockHashes: (limit) => core.serving.cachedBlockHashes(limit),
  };
}

interface Cluster {
  readonly server: FakeNatsServer;
  readonly cores: FakeCore[];
  readonly agents: ReplicaAgent[];
  readonly conns: FakeNatsConnection[];
  readonly router: RouterBackend;
  readonly metrics: ServiceMetrics;
  readonly log: string[];
  [Symbol.asyncDispose](): Promise<void>;
}

async function cluster(
  routerOpts: RouterOptions = {},
  refuse?: { first: boolean },
): Promise<Cluster> {
  const server = new FakeNatsServer();
  const cores = [new FakeCore(), new FakeCore()];
  const conns = cores.map((_, i) => server.connect(`replica-${i}`));
  const agents = cores.map((core, i) =>
    new ReplicaAgent(conns[i]!, source(core, refuse), {
      id: `replica-${i}`,
      heartbeatMs: 50,
      creditTimeoutMs: 1000,
    })
  );
  for (const a of agents) await a.start();
  const metrics = new ServiceMetrics();
  const log: string[] = [];
  const routerConn = server.connect("router");
  const router = await RouterBackend.start(routerConn, {
    metrics,
    log: (l) => log.push(l),
    peerLog: (l) => log.push(l),
    policy: "round-robin",
    streamTimeoutMs: 300,
    staleAfterMs: 300,
    waitMs: 5000,
    ...routerOpts,
  });
  // Both replicas in the rotation before the first request (the 60 s is a hang guard).
  const t0 = performance.now();
  while (router.registry.inRotation().length < 2) {
    if (performance.now() - t0 > 60_000) throw new Error("the replicas did not both join");
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    server,
    cores,
    agents,
    conns,
    router,
    metrics,
    log,
    async [Symbol.asyncDispose]() {
      server.tap = undefined;
      router.close();
      await routerConn.close();
      for (const a of agents) await a.close();
      for (const c of conns) await c.close();
      for (const c of cores) await c.close();
      // Replica streams still waiting for credit give up within creditTimeoutMs.
      await new Promise((r) => setTimeout(r, 1100));
    },
  };
}

function request(id: string): GenerationRequest {
  return {
    prompt: new Tokenizer(TOKENIZER_DATA).encode(PROMPT),
    maxTokens: MAX_TOKENS,
    sampling: SAMPLING,
    stop: [],
    priority: "interactive",
    requestId: id,
  };
}

interface Output {
  readonly ids: number[];
  readonly text: string;
  readonly events: GenerationEvent[];
}

async function run(c: Cluster, id: string): Promise<Output> {
  const ids: number[] = [];
  let text = "";
  const events: GenerationEvent[] = [];
  for await (const ev of c.router.generate(request(id), new AbortController().signal)) {
    events.push(ev);
    if (ev.type === "token") {
      ids.push(...ev.ids);
      text += ev.text;
    }
  }
  return { ids, text, events };
}

/** The generation frame a replica sends on a router's frames subject, if `m` is one. */
function frameOf(m: TappedMessage): { stream: string; seq: number; type: string } | undefined {
  if (!m.subject.endsWith(".frames")) return undefined;
  const f = decodeMessage(StreamFrame, m.data);
  if (!f.ok || f.value.type !== "event") return undefined;
  return { stream: f.value.stream, seq: f.value.seq, type: f.value.event.type };
}

function assertExact(got: Output, want: Output, what: string): void {
  assertEquals(got.ids, want.ids, `${what}: the token ids`);
  assertEquals(got.text, want.text, `${what}: the text`);
  const done = got.events.at(-1);
  if (done?.type !== "done") {
    throw new Error(`${what}: ends with done, got ${JSON.stringify(done)}`);
  }
  assertEquals(done.finishReason, "length", what);
  assertEquals(done.usage.completionTokens, MAX_TOKENS, `${what}: usage counts each token once`);
  assertEquals(got.events.filter((e) => e.type === "started").length, 1, `${what}: one started`);
  assertEquals(got.events.filter((e) => e.type === "error").length, 0, what);
}

function lostCount(c: Cluster, kind: StreamLossKind): number {
  return metricValue(
    c.metrics.render(),
    `llm_router_lost_streams_total{why="${LOSS_LABEL[kind]}"}`,
  ) ?? 0;
}

/** The uninterrupted run, and the fake model's own continuation it must equal. */
const reference = await (async () => {
  await using c = await cluster();
  const out = await run(c, "reference");
  const oracle = c.cores[0]!.continuation(PROMPT, MAX_TOKENS, SAMPLING);
  assertEquals(out.ids, oracle.ids, "the uninterrupted run is the model's continuation");
  assertEquals(c.router.failovers, 0);
  return out;
})();
/** Frames of one stream: started, one per token event, done. */
const FRAMES = reference.events.length;

type Kill = "frames_lost" | "replica_dies" | "goodbye";

/**
 * Kills the first stream at frame `k`: drops that frame only (frames_lost), or closes its
 * replica's connection there (replica_dies: no goodbye, heartbeats stop), or has its replica
 * stop sending and say goodbye (goodbye).
 */
function killFirstStream(c: Cluster, kill: Kill, k: number): { killed: () => boolean } {
  let target: string | undefined;
  let killed = false;
  let gone: FakeNatsConnection | undefined;
  c.server.tap = (m) => {
    if (gone !== undefined && m.from === gone && m.subject.endsWith(".frames")) return false;
    const f = frameOf(m);
    if (f === undefined) return true;
    target ??= f.stream;
    if (killed || f.stream !== target || f.seq !== k) return true;
    killed = true;
    if (kill === "replica_dies") {
      void m.from.close();
    } else if (kill === "goodbye") {
      gone = m.from;
      const agent = c.agents[c.conns.indexOf(m.from)]!;
      setTimeout(() => void agent.close(), 0);
    }
    return false;
  };
  return { killed: () => killed };
}

const EXPECTED: Record<Kill, (k: number) => StreamLossKind> = {
  // A dropped frame is seen at the next one; after the last (done) nothing comes: silence.
  frames_lost: (k) => (k < FRAMES - 1 ? "frames_lost" : "timed_out"),
  replica_dies: () => "timed_out",
  goodbye: () => "replica_gone",
};

for (const kill of ["frames_lost", "replica_dies", "goodbye"] as const) {
  Deno.test(`failover is exact when the stream is killed (${kill}) at every frame`, async () => {
    assert(FRAMES >= MAX_TOKENS + 2, `frames: ${FRAMES}`);
    for (let k = 0; k < FRAMES; k++) {
      const what = `${kill} at frame ${k} (${
        k === 0 ? "started" : k === FRAMES - 1 ? "done" : `token ${k - 1}`
      })`;
      await using c = await cluster();
      const killer = killFirstStream(c, kill, k);
      const out = await run(c, `kill-${kill}-${k}`);
      assert(killer.killed(), `${what}: the tap killed the stream`);
      assertExact(out, reference, what);
      const want = EXPECTED[kill](k);
      assertEquals(lostCount(c, want), 1, `${what}: one ${want} loss counted`);
      const line = c.log.find((l) => l.includes(`lost (${want}:`));
      assert(line !== undefined, `${what}: the log names the loss: ${c.log.join(" | ")}`);
      // Lost at `done`, every token was delivered: the router ends it, nothing is resubmitted.
      assertEquals(c.router.failovers, k === FRAMES - 1 ? 0 : 1, what);
    }
  });
}

Deno.test("failover is exact when a replica lists the stream but its frames stop (no_progress)", async () => {
  // A small window makes the replica wait for credit, listed in its heartbeats, while the tap
  // swallows every frame of the stream from the third on.
  await using c = await cluster({ window: 2, progressTimeoutMs: 300, streamTimeoutMs: 2000 });
  let target: string | undefined;
  c.server.tap = (m) => {
    const f = frameOf(m);
    if (f === undefined) return true;
    target ??= f.stream;
    return !(f.stream === target && f.seq >= 3);
  };
  const out = await run(c, "no-progress");
  assertExact(out, reference, "no_progress");
  assertEquals(lostCount(c, "no_progress"), 1);
  assert(c.log.some((l) => l.includes("lost (no_progress:")), c.log.join(" | "));
});

Deno.test("a replica that refuses before the start (overloaded) hands the generation to another, exactly", async () => {
  const refuse = { first: true };
  await using c = await cluster({}, refuse);
  const out = await run(c, "refused");
  assertEquals(refuse.first, false, "a replica refused");
  assertExact(out, reference, "refused");
  assertEquals(lostCount(c, "refused"), 1);
  // A refusal is no failover: nothing had started.
  assertEquals(c.router.failovers, 0);
});

Deno.test("the fake NATS answers a request nobody listens to at once with no responders", async () => {
  const server = new FakeNatsServer();
  const a = server.connect("a");
  const err = await a.request("nobody.here", new Uint8Array(), { timeout: 5000 }).catch((e) => e);
  assertEquals((err as { code?: string }).code, "503");
  const sub = a.subscribe("echo.*", { callback: (_e, msg) => msg.respond(msg.data) });
  const reply = await a.request("echo.x", new TextEncoder().encode("hi"), { timeout: 1000 });
  assertEquals(new TextDecoder().decode(reply.data), "hi");
  sub.unsubscribe();
  await a.close();
  assert(a.isClosed());
  let threw = false;
  try {
    a.publish("x", new Uint8Array());
  } catch {
    threw = true;
  }
  assert(threw, "a closed connection does not publish");
});
