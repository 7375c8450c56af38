/**
 * The router's embeddings in process: real ReplicaAgents over the real serving core with the
 * fake model (tests/_fake_core.ts, whose engine returns hidden rows), a real RouterBackend, on
 * an in-process NATS (tests/_fake_nats.ts). The oracle of a vector is the replica's own embedder,
 * asked directly. What is checked is what a lost or refusing replica and a leaving client do:
 * a refusal goes to the other replica, a lone replica that dies gives a clear error within the
 * failover wait, never a hang, and a client that leaves frees the replica's sequence.
 */
import { assert, assertEquals, assertRejects } from "@std/assert";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import { ReplicaAgent, type ReplicaSource } from "../lib/cluster/replica.ts";
import { RouterBackend, type RouterOptions } from "../lib/cluster/router_backend.ts";
import { notTakenOver } from "../lib/cluster/failover.ts";
import { coreReplicaSource } from "../lib/cluster/replica_source.ts";
import { type Embedder, EmbeddingError } from "../lib/core/embedder.ts";
import { FakeCore, TOKENIZER } from "./_fake_core.ts";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { metricValue } from "./_http_harness.ts";
import { FakeNatsConnection, FakeNatsServer } from "./_fake_nats.ts";

const IDS = TOKENIZER.encode("Once upon a time there was a little dog");
const TOKENIZER_DATA = parseLlama2cTokenizer(
  await Deno.readFile(modelFile("tok512.bin")),
  512,
  "tok512.bin",
);

/** A replica's source over `core`, its embedder replaced by `embedder` where given. */
function source(core: FakeCore, embedder?: Embedder): ReplicaSource {
  const backend = embedder === undefined ? core : new Proxy(core, {
    get(target, key) {
      if (key === "embedder") return embedder;
      const v = Reflect.get(target, key);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  return {
    ...coreReplicaSource({
      backend: core,
      core: core.serving,
      tokenizer: TOKENIZER_DATA,
      blockSize: 16,
      modelId: undefined,
      limits: { maxRunning: 8, maxWaiting: 8 },
    }),
    backend,
  };
}

interface Cluster {
  readonly cores: FakeCore[];
  /** What each replica's request log was told of the work it served, in order of its end. */
  readonly served: { route: string; code?: string }[];
  readonly conns: FakeNatsConnection[];
  readonly router: RouterBackend;
  readonly metrics: ServiceMetrics;
  [Symbol.asyncDispose](): Promise<void>;
}

async function cluster(
  replicas: { core: FakeCore; embedder?: Embedder }[],
  opts: RouterOptions = {},
): Promise<Cluster> {
  const server = new FakeNatsServer();
  const conns = replicas.map((_, i) => server.connect(`replica-${i}`));
  const served: Cluster["served"] = [];
  const agents = replicas.map((r, i) =>
    new ReplicaAgent(conns[i]!, source(r.core, r.embedder), {
      id: `replica-${i}`,
      heartbeatMs: 50,
      served: (_, route) => ({
        firstToken() {},
        finished: (e) => served.push({ route, ...(e.code === undefined ? {} : { code: e.code }) }),
      }),
    })
  );
  for (const a of agents) await a.start();
  const metrics = new ServiceMetrics();
  const routerConn = server.connect("router");
  const router = await RouterBackend.start(routerConn, {
    metrics,
    policy: "round-robin",
    streamTimeoutMs: 300,
    staleAfterMs: 300,
    failoverWaitMs: 500,
    waitMs: 5000,
    ...opts,
  });
  const t0 = performance.now();
  while (router.registry.inRotation().length < replicas.length) {
    if (performance.now() - t0 > 60_000) throw new Error("the replicas did not all join");
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    served,
    cores: replicas.map((r) => r.core),
    conns,
    router,
    metrics,
    async [Symbol.asyncDispose]() {
      router.close();
      await routerConn.close();
      for (const a of agents) await a.close();
      for (const c of conns) await c.close();
      for (const r of replicas) await r.core.close();
    },
  };
}

const EMBEDDING = { pooling: "mean", normalize: 2 } as const;

Deno.test("the router's embedding is the replica's own, bit for bit; a replica that refuses it hands it to the other", async () => {
  const cores = [new FakeCore({ embedding: EMBEDDING }), new FakeCore({ embedding: EMBEDDING })];
  const oracle = await cores[0]!.embedder!.embed(IDS);
  // The first embedding any replica is asked for is refused, as a full scheduler refuses it.
  let refused = false;
  const refusing = (core: FakeCore): Embedder => ({
    ...core.embedder!,
    embed(ids, signal, priority) {
      if (!refused) {
        refused = true;
        return Promise.reject(new EmbeddingError("overloaded", "the scheduler is full"));
      }
      return core.embedder!.embed(ids, signal, priority);
    },
  });
  await using c = await cluster(cores.map((core) => ({ core, embedder: refusing(core) })));
  const embedder = c.router.embedder!;
  assertEquals([embedder.pooling, embedder.dimensions], ["mean", oracle.length]);
  const v = await embedder.embed(IDS);
  assert(refused);
  assertEquals(v, oracle);
  const text = c.metrics.render();
  assertEquals(metricValue(text, "llm_router_embedding_retries_total"), 1);
  assertEquals(metricValue(text, 'llm_router_lost_streams_total{why="refused"}'), 1);
  // Later ones are not refused: no retry.
  assertEquals(await embedder.embed(IDS), oracle);
  assertEquals(
    metricValue(c.metrics.render(), "llm_router_embedding_retries_total"),
    1,
  );
});

Deno.test("an embedding whose only replica dies gets a clear error within the failover wait, never a hang", async () => {
  // Every step is held (until the end): the embedding is in the replica's hands when its
  // connection goes.
  let release!: () => void;
  const held = new Promise<void>((r) => release = r);
  let taken!: () => void;
  const inHand = new Promise<void>((r) => taken = r);
  const core = new FakeCore({
    embedding: EMBEDDING,
    holdWhen: () => {
      taken();
      return held;
    },
  });
  await using c = await cluster([{ core }]);
  const t0 = performance.now();
  const answer = c.router.embedder!.embed(IDS);
  await inHand;
  await c.conns[0]!.close();
  const e = await assertRejects(() => answer, EmbeddingError);
  assertEquals(e.code, "internal");
  assertEquals(e.message, notTakenOver("embedding", 500));
  const ms = performance.now() - t0;
  assert(ms < 5000, `answered after ${ms} ms`);
  assertEquals(
    metricValue(c.metrics.render(), 'llm_router_lost_streams_total{why="silent"}'),
    1,
  );
  release();
});

Deno.test("a client that leaves during an embedding cancels it on the replica", async () => {
  let release!: () => void;
  const held = new Promise<void>((r) => release = r);
  let taken!: () => void;
  const inHand = new Promise<void>((r) => taken = r);
  const core = new FakeCore({
    embedding: EMBEDDING,
    holdWhen: () => {
      taken();
      return held;
    },
  });
  // The replica's own embedder, watched: the signal it was given aborts when the cancel arrives.
  let cancelled!: () => void;
  const reached = new Promise<void>((r) => cancelled = r);
  const watched: Embedder = {
    ...core.embedder!,
    embed(ids, signal, priority) {
      signal?.addEventListener("abort", () => cancelled(), { once: true });
      return core.embedder!.embed(ids, signal, priority);
    },
  };
  await using c = await cluster([{ core, embedder: watched }]);
  const client = new AbortController();
  const answer = c.router.embedder!.embed(IDS, client.signal);
  await inHand;
  const busy = core.serving.schedulerStats();
  assertEquals(busy.running + busy.waiting, 1);
  client.abort();
  const e = await assertRejects(() => answer, EmbeddingError);
  assertEquals(e.code, "cancelled");
  let guard: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    reached,
    new Promise((_, reject) => {
      guard = setTimeout(() => {
        release();
        reject(new Error("the cancel never reached the replica"));
      }, 5000);
    }),
  ]).finally(() => clearTimeout(guard));
  // Its step done, the replica ends the work as the router's leaving (a request log's 499), sends
  // no vector, and its scheduler holds nothing.
  release();
  const t0 = performance.now();
  while (c.served.length === 0) {
    if (performance.now() - t0 > 5000) throw new Error("the replica never ended the embedding");
    await new Promise((r) => setTimeout(r, 20));
  }
  assertEquals(c.served, [{ route: "embed", code: "router_gone" }]);
  const s = core.serving.schedulerStats();
  assertEquals(s.running + s.waiting, 0);
});

Deno.test("a replica's vector of the wrong length is an error naming both lengths", async () => {
  const core = new FakeCore({ embedding: EMBEDDING });
  const short: Embedder = { ...core.embedder!, embed: () => Promise.resolve(new Float32Array(3)) };
  await using c = await cluster([{ core, embedder: short }]);
  const e = await assertRejects(() => c.router.embedder!.embed(IDS), EmbeddingError);
  assertEquals(e.code, "internal");
  assert(
    e.message.includes("12 bytes") && e.message.includes(`${core.embedder!.dimensions} float32`),
    e.message,
  );
});

Deno.test("a replica of the model without embeddings passes each input on to one that has them", async () => {
  // replica-0 (asked for the model's facts first) gives embeddings; replica-1's engine does not.
  const cores = [new FakeCore({ embedding: EMBEDDING }), new FakeCore()];
  assertEquals(cores[1]!.embedder, undefined);
  const oracle = await cores[0]!.embedder!.embed(IDS);
  await using c = await cluster(cores.map((core) => ({ core })));
  // Round-robin sends some inputs to replica-1 first: each of those is asked again of replica-0.
  for (let i = 0; i < 4; i++) assertEquals(await c.router.embedder!.embed(IDS), oracle);
  const passedOn = c.served.filter((s) => s.code === "invalid_request").length;
  assert(passedOn > 0, "replica-1 was never asked");
  assertEquals(metricValue(c.metrics.render(), "llm_router_embedding_retries_total"), passedOn);
});
