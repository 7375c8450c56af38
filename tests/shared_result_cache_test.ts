/**
 * The replicas' shared result cache in NATS JetStream's key-value store, against a real
 * nats-server with JetStream: the store alone (what an entry reveals, whose key opens it, the
 * bound on a value), then two real replicas behind a real router (one computes, the other
 * replays; tenants stay apart; with the store gone requests are still answered, counted).
 */
import { assert, assertEquals, assertGreater, assertNotEquals } from "@std/assert";
import { Kvm } from "@nats-io/kv";
import { connectNats } from "../lib/cluster/nats_connection.ts";
import { NatsResultStore } from "../lib/cluster/nats_result_store.ts";
import type { StoredResult } from "../lib/core/result_cache.ts";
import type { SharedResultStore } from "../lib/core/shared_result_store.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { ServingCore } from "../actors/core.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CachedBackend } from "../lib/backend/cached_backend.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { compatPath } from "./harness/compat.ts";
import { metricValue, scrape } from "./_http_harness.ts";
import { Cluster, type Member, NatsServer, until } from "./_cluster.ts";

const SECRET = "test-secret-0123456789abcdef";

function result(text: string): StoredResult {
  return {
    promptTokens: 3,
    tokens: [...text].map((ch, i) => ({ text: ch, ids: [100 + i], logprob: -0.5 })),
    finishReason: "length",
    usage: { promptTokens: 3, completionTokens: text.length, cachedTokens: 0 },
    totalMs: 12,
  };
}

Deno.test("the NATS result store: an entry opens only for its tenant and secret, and reveals neither", async () => {
  const nats = await NatsServer.start();
  const nc = await connectNats({ url: nats.url, name: "store-test" });
  try {
    const logs: string[] = [];
    const store = new NatsResultStore({
      secret: SECRET,
      ttlMs: 600_000,
      bucket: "store_test",
      log: (l) => logs.push(l),
    });
    store.attach(nc);
    const answer = result("the-answer-only-tenant-a-may-read");
    const keyA = JSON.stringify(["scope-a", "model", "prompt"]);
    await store.set(keyA, "scope-a", answer);
    assertEquals(store.stats().stored, 1, logs.join("\n"));
    assertEquals(await store.get(keyA, "scope-a"), answer);

    // What the bus credentials alone see: a name and sealed bytes.
    const kv = await new Kvm(nc).open("store_test");
    const names: string[] = [];
    for await (const k of await kv.keys()) names.push(k);
    const name = await store.entryName(keyA);
    assertEquals(names, [name]);
    assert(/^[0-9a-f]{64}$/.test(name), name);
    const sealed = (await kv.get(name))!.value;
    const asText = new TextDecoder().decode(sealed);
    assert(!asText.includes("tenant-a"), "the answer travels and rests encrypted");
    assert(!name.includes("scope-a") && !asText.includes("scope-a"));
    assertEquals((await kv.status()).ttl, 600_000);

    // Another tenant's key does not open it, nor does another secret.
    assertEquals(await store.open(sealed, name, "scope-b"), undefined);
    const other = new NatsResultStore({ secret: `${SECRET}-other`, ttlMs: 600_000, log: () => {} });
    assertEquals(await other.open(sealed, name, "scope-a"), undefined);
    assertNotEquals(await other.entryName(keyA), name);
    // Moved under another entry's name, it does not open either (the name is bound in).
    assertEquals(await store.open(sealed, await store.entryName("another"), "scope-a"), undefined);
    // Tenant b's identical request is another entry: a miss.
    const keyB = JSON.stringify(["scope-b", "model", "prompt"]);
    assertEquals(await store.get(keyB, "scope-b"), undefined);
    assertEquals(store.stats().misses, 1);

    // Values are bounded: a result too big is not stored, and counted.
    const small = new NatsResultStore({
      secret: SECRET,
      ttlMs: 600_000,
      bucket: "store_test_small",
      maxValueBytes: 600,
      log: () => {},
    });
    small.attach(nc);
    await small.set("short", "", result("ok"));
    await small.set("long", "", result("x".repeat(200)));
    assertEquals(small.stats().stored, 1);
    assertEquals(small.stats().tooLarge, 1);
    assertEquals(await small.get("long", ""), undefined);
    assertEquals(await small.get("short", ""), result("ok"));
  } finally {
    await nc.close();
    await nats.stop();
    await Deno.remove(nats.dir, { recursive: true }).catch(() => {});
  }
});

/** The CPU reference core behind a CoreBackend that counts the generations it runs. */
class CountingBackend extends CoreBackend {
  runs = 0;
  override generate(req: GenerationRequest, signal: AbortSignal): AsyncIterable<GenerationEvent> {
    this.runs++;
    return super.generate(req, signal);
  }
}

async function tokenIds(events: AsyncIterable<GenerationEvent>): Promise<number[]> {
  const ids: number[] = [];
  for await (const ev of events) {
    if (ev.type === "token") ids.push(...ev.ids);
    if (ev.type === "error") throw new Error(ev.message);
  }
  return ids;
}

Deno.test("requests arriving together while the store is asked generate once; another server replays it", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const tokenizer = new Tokenizer(model.tokenizer!);
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const nats = await NatsServer.start();
  const conns = [
    await connectNats({ url: nats.url, name: "server-1" }),
    await connectNats({ url: nats.url, name: "server-2" }),
  ];
  try {
    const servers = conns.map((nc) => {
      const store = new NatsResultStore({ secret: SECRET, ttlMs: 600_000, log: () => {} });
      store.attach(nc);
      const inner = new CountingBackend("stories260K", core, tokenizer);
      return { store, inner, backend: new CachedBackend(inner, 1 << 20, undefined, store) };
    });
    const req: GenerationRequest = {
      prompt: tokenizer.encode("Once upon a time"),
      maxTokens: 12,
      sampling: GREEDY,
      stop: [],
      deterministic: true,
      cacheScope: "scope-a",
      priority: "interactive",
      requestId: "r",
    };
    const [one, two] = servers as [typeof servers[0], typeof servers[0]];
    const signal = new AbortController().signal;
    const together = await Promise.all(
      [0, 1, 2].map(() => tokenIds(one.backend.generate(req, signal))),
    );
    assertEquals(one.inner.runs, 1);
    assertEquals(together[1], together[0]);
    assertEquals(together[2], together[0]);
    assertGreater(together[0]!.length, 0);
    // The store is written after the answer, without holding it up.
    await until("the answer to reach the store", () => one.store.stats().stored === 1, 5000);
    // The other server: nothing in its own cache, the answer from the store, no generation.
    assertEquals(await tokenIds(two.backend.generate(req, signal)), together[0]);
    assertEquals(two.inner.runs, 0);
    assertEquals(two.store.stats().hits, 1);
    // Kept in its own cache: asked again, the store is not asked.
    assertEquals(await tokenIds(two.backend.generate(req, signal)), together[0]);
    assertEquals(two.store.stats().hits + two.store.stats().misses, 1);
    assertEquals(two.backend.stats().resultCache?.hits, 2);
  } finally {
    for (const nc of conns) await nc.close();
    await core.close();
    await nats.stop();
    await Deno.remove(nats.dir, { recursive: true }).catch(() => {});
  }
});

const KEY_A = "tenant-a-key-0001";
const KEY_B = "tenant-b-key-0002";
const auth = (key: string) => ({ authorization: `Bearer ${key}` });

/** A deterministic completion (greedy): its text, and whether it says it was replayed. */
async function completion(
  base: string,
  key: string,
  prompt: string,
): Promise<{ text: string; cached: boolean }> {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...auth(key) },
    body: JSON.stringify({ prompt, max_tokens: 16, temperature: 0 }),
  });
  const body = await res.json();
  assertEquals(res.status, 200, JSON.stringify(body));
  return { text: body.choices[0].text, cached: body.cached };
}

async function complete(base: string, key: string, prompt: string): Promise<string> {
  return (await completion(base, key, prompt)).text;
}

/** What each replica's /metrics says of its work and of the shared cache. */
async function counters(m: Member) {
  const text = await scrape(m.base, auth(KEY_A));
  const shared = (event: string) =>
    metricValue(text, `llm_shared_result_cache_events_total{event="${event}"}`) ?? 0;
  return {
    // Executor steps: the engine's work, which a replayed answer does not cause.
    steps: metricValue(text, "llm_steps_total") ?? 0,
    hit: shared("hit"),
    miss: shared("miss"),
    unavailable: shared("unavailable"),
    stored: shared("stored"),
  };
}

Deno.test("two replicas behind a router share one result cache in JetStream", async (t) => {
  await using cluster = await Cluster.start();
  const keys = ["--api-key", KEY_A, "--api-key", KEY_B];
  const replicaFlags = [
    ...keys,
    "--result-cache",
    "4MiB",
    "--shared-cache-secret",
    SECRET,
    "--shared-cache-ttl",
    "10m",
    "--kv-memory",
    "8MiB",
  ];
  const replicas = [await cluster.replica(replicaFlags), await cluster.replica(replicaFlags)];
  // Round-robin: two requests in a row land on the two replicas.
  const router = await cluster.router([...keys, "--routing", "round-robin"]);
  await cluster.routerSees(router, 2, 15_000, auth(KEY_A));
  const all = () => Promise.all(replicas.map(counters));
  const delta = (a: Awaited<ReturnType<typeof all>>, b: Awaited<ReturnType<typeof all>>) =>
    b.map((x, i) => ({
      steps: x.steps - a[i]!.steps,
      hit: x.hit - a[i]!.hit,
      miss: x.miss - a[i]!.miss,
      unavailable: x.unavailable - a[i]!.unavailable,
      stored: x.stored - a[i]!.stored,
    }));
  const prompt = "Once upon a time, a little fox";

  let first = "";
  await t.step(
    "the same request twice is computed once, on one replica, replayed on the other",
    async () => {
      const s0 = await all();
      const one = await completion(router.base, KEY_A, prompt);
      // The store is written after the answer, without holding it up.
      await until("the answer to reach the store", async () => {
        const now = await all();
        return now.reduce((n, x, i) => n + x.stored - s0[i]!.stored, 0) === 1;
      }, 5000);
      const s1 = await all();
      const two = await completion(router.base, KEY_A, prompt);
      const s2 = await all();
      first = one.text;
      assertEquals(two.text, first);
      // The router's client is told which answer was replayed.
      assertEquals([one.cached, two.cached], [false, true]);
      const d1 = delta(s0, s1), d2 = delta(s1, s2);
      const computer = d1.findIndex((d) => d.steps > 0);
      assert(computer >= 0, `one replica computed the first: ${JSON.stringify(d1)}`);
      assertEquals(d1[computer]!.miss, 1);
      assertEquals(d1[computer]!.stored, 1);
      assertEquals(d1[1 - computer]!.steps, 0);
      // The second landed on the other replica, missed its own cache, hit the shared one, and
      // neither replica's engine ran a step for it.
      assertEquals(d2[1 - computer]!.hit, 1, JSON.stringify(d2));
      assertEquals(d2.map((d) => d.steps), [0, 0]);
    },
  );

  await t.step(
    "another tenant's identical request does not read the entry: it is computed",
    async () => {
      const s0 = await all();
      const b = await complete(router.base, KEY_B, prompt);
      const s1 = await all();
      const d = delta(s0, s1);
      // The same model and request give the same text; what matters is that it was computed.
      assertEquals(b, first);
      assertGreater(d[0]!.steps + d[1]!.steps, 0, JSON.stringify(d));
      assertEquals(d[0]!.hit + d[1]!.hit, 0);
      assertEquals(d[0]!.miss + d[1]!.miss, 1);
    },
  );

  await t.step(
    "with the store gone every request is still answered, the miss counted",
    async () => {
      await cluster.nats.stop();
      const s0 = await all();
      const texts = [];
      for (const r of replicas) texts.push(await complete(r.base, KEY_A, "A dog ran to the"));
      const s1 = await all();
      const d = delta(s0, s1);
      assertEquals(texts[0], texts[1]);
      for (const x of d) {
        assertGreater(x.steps, 0, JSON.stringify(d));
        assertGreater(x.unavailable, 0, JSON.stringify(d));
      }
    },
  );
});

/** The sum of a counter's series (any labels) that include `label`, as /metrics renders them. */
function counterSum(text: string, name: string, label: string): number {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith(`${name}{`) && line.includes(label)) {
      sum += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return sum;
}

Deno.test("replicas of several models share the result cache too", async () => {
  await using cluster = await Cluster.start();
  const args = [
    "--model",
    compatPath("stories260K-q4_1"),
    "--model",
    compatPath("stories260K-q5_1"),
    "--backend",
    "cpu",
    "--kv-memory",
    "2MiB",
    "--result-cache",
    "4MiB",
    "--shared-cache-secret",
    SECRET,
  ];
  const replicas = await Promise.all([cluster.replicaServing(args), cluster.replicaServing(args)]);
  const ask = async (base: string) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "stories260K-q4_1",
        prompt: "Once upon a time",
        max_tokens: 8,
        temperature: 0,
      }),
    });
    const body = await res.json();
    assertEquals(res.status, 200, JSON.stringify(body));
    return { text: body.choices[0].text as string, cached: body.cached as boolean };
  };
  const events = async (base: string, event: string) =>
    counterSum(
      await (await fetch(`${base}/metrics`)).text(),
      "llm_shared_result_cache_events_total",
      `event="${event}"`,
    );
  const one = await ask(replicas[0]!.base);
  await until(
    "the answer to reach the store",
    async () => await events(replicas[0]!.base, "stored") === 1,
    5000,
  );
  const two = await ask(replicas[1]!.base);
  assertEquals(two.text, one.text);
  assertEquals([one.cached, two.cached], [false, true]);
  assertEquals(await events(replicas[1]!.base, "hit"), 1);
  assertEquals(await events(replicas[1]!.base, "stored"), 0);
});

/**
 * A store held in memory whose lookups wait for the test to let them answer: what a slow store
 * does to requests in flight, made an order instead of a race.
 */
class GatedStore implements SharedResultStore {
  readonly #held: (() => void)[] = [];
  readonly #entries = new Map<string, StoredResult>();
  #stats = { hits: 0, misses: 0, unavailable: 0, tooLarge: 0, stored: 0 };
  async get(key: string, scope: string): Promise<StoredResult | undefined> {
    // A read answers with what the store held when it was asked (a write that lands meanwhile
    // is not in it), as a read already on its way to NATS does.
    const found = this.#entries.get(scope + "\n" + key);
    await new Promise<void>((resolve) => this.#held.push(resolve));
    found ? this.#stats.hits++ : this.#stats.misses++;
    return found;
  }
  set(key: string, scope: string, result: StoredResult): Promise<void> {
    this.#entries.set(scope + "\n" + key, result);
    this.#stats.stored++;
    return Promise.resolve();
  }
  stats() {
    return { ...this.#stats };
  }
  get waiting(): number {
    return this.#held.length;
  }
  /** Lets the oldest held lookup answer. */
  release(): void {
    this.#held.shift()!();
  }
}

Deno.test("a request whose store lookup answers after an identical one finished replays that answer instead of generating again", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const tokenizer = new Tokenizer(model.tokenizer!);
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  try {
    const store = new GatedStore();
    const inner = new CountingBackend("stories260K", core, tokenizer);
    const backend = new CachedBackend(inner, 1 << 20, undefined, store);
    const req: GenerationRequest = {
      prompt: tokenizer.encode("Once upon a time"),
      maxTokens: 12,
      sampling: GREEDY,
      stop: [],
      deterministic: true,
      priority: "interactive",
      requestId: "r",
    };
    const signal = new AbortController().signal;
    const first = tokenIds(backend.generate(req, signal));
    const second = tokenIds(backend.generate(req, signal));
    await until("both lookups to wait", () => store.waiting === 2, 5000);
    store.release(); // the first misses and generates to its end
    const a = await first;
    store.release(); // only now does the second's lookup miss too
    assertEquals(await second, a);
    assertEquals(inner.runs, 1);
    assertEquals(store.stats().misses, 2);
  } finally {
    await core.close();
  }
});
