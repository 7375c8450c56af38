/**
 * The model pool's rules on a fake loader that counts its loads and closes: shared loads, LRU
 * eviction of idle models only, --max-loaded-models, keep-alive 0 and forever, failed loads.
 */
import { assert, assertEquals, assertRejects } from "@std/assert";
import { type LoadContext, ModelPool } from "../lib/compose/model_pool.ts";
import { ModelLoadError, type PooledModel } from "../lib/http/model_directory.ts";
import { parseKeepAlive } from "../lib/util/duration.ts";

const MB = 1_000_000;

interface Fake {
  readonly loads: Map<string, number>;
  readonly closes: Map<string, number>;
  /** Resolves the pending load of a model (loads wait until released, to test sharing). */
  readonly gates: Map<string, () => void>;
  pool: ModelPool<string>;
}

function fakePool(
  sizes: Record<string, number>,
  opts: {
    budget?: number;
    maxLoaded?: number;
    keepAliveMs?: number;
    maxKeepAliveMs?: number;
    gated?: boolean;
    failing?: string[];
  } = {},
): Fake {
  const f: Fake = { loads: new Map(), closes: new Map(), gates: new Map(), pool: undefined! };
  let clock = 0;
  f.pool = new ModelPool<string>(
    Object.entries(sizes).map(([name, bytes]) => ({ name, estimateBytes: bytes })),
    async (name: string, ctx: LoadContext): Promise<PooledModel<string>> => {
      f.loads.set(name, (f.loads.get(name) ?? 0) + 1);
      if (opts.gated) await new Promise<void>((r) => f.gates.set(name, r));
      if (opts.failing?.includes(name)) throw new Error(`bad magic in ${name}.gguf`);
      ctx.reserve(sizes[name]!);
      return {
        service: `service of ${name}`,
        bytes: sizes[name]!,
        busy: () => 0,
        close: () => {
          f.closes.set(name, (f.closes.get(name) ?? 0) + 1);
          return Promise.resolve();
        },
      };
    },
    {
      memoryBudget: opts.budget ?? Infinity,
      ...(opts.maxLoaded === undefined ? {} : { maxLoaded: opts.maxLoaded }),
      keepAliveMs: opts.keepAliveMs ?? 60_000,
      ...(opts.maxKeepAliveMs === undefined ? {} : { maxKeepAliveMs: opts.maxKeepAliveMs }),
      // A clock that moves one tick a call: every use is later than the one before.
      now: () => ++clock,
    },
  );
  return f;
}

const phases = (pool: ModelPool<string>) =>
  Object.fromEntries(pool.status().map((s) => [s.name, s.phase]));

async function use(pool: ModelPool<string>, name: string, keepAliveMs?: number, tenant?: string) {
  const lease = await pool.acquire(name, keepAliveMs, tenant);
  lease.release();
  return lease;
}

Deno.test("concurrent first requests share one load", async () => {
  const f = fakePool({ a: 10 * MB }, { gated: true });
  const waiting = [f.pool.acquire("a"), f.pool.acquire("a"), f.pool.acquire("a")];
  // Let the load start, then finish it once.
  while (!f.gates.has("a")) await Promise.resolve();
  assertEquals(phases(f.pool).a, "loading");
  f.gates.get("a")!();
  const leases = await Promise.all(waiting);
  assertEquals(f.loads.get("a"), 1);
  assert(leases.every((l) => l.model.service === "service of a" && l.loaded));
  assertEquals(f.pool.status()[0]!.leases, 3);
  for (const l of leases) l.release();
  assertEquals(f.pool.status()[0]!.loads, 1);
  await f.pool.close();
});

Deno.test("a load that needs memory unloads the least recently used idle model", async () => {
  const f = fakePool({ a: 40 * MB, b: 40 * MB, c: 40 * MB }, { budget: 100 * MB });
  await use(f.pool, "a");
  await use(f.pool, "b");
  await use(f.pool, "a"); // b is now the least recently used
  await use(f.pool, "c");
  assertEquals(phases(f.pool), { a: "loaded", b: "unloaded", c: "loaded" });
  assertEquals(f.closes.get("b"), 1);
  const b = f.pool.status().find((s) => s.name === "b")!;
  assertEquals([b.evictions, b.loads], [1, 1]);
  // Reloaded on its next request, which evicts a (older than c).
  await use(f.pool, "b");
  assertEquals(phases(f.pool), { a: "unloaded", b: "loaded", c: "loaded" });
  assertEquals(f.loads.get("b"), 2);
  await f.pool.close();
});

Deno.test("a busy model is never unloaded: the load fails when only busy ones could make room", async () => {
  const f = fakePool({ a: 60 * MB, b: 60 * MB }, { budget: 100 * MB });
  const held = await f.pool.acquire("a");
  const err = await assertRejects(() => f.pool.acquire("b"), ModelLoadError);
  assert(err.insufficientMemory);
  assert(err.message.includes('Cannot load model "b"'), err.message);
  assert(
    err.message.includes("a 57.2 MiB (busy: 1 request running; kept 1m after its last request)"),
    err.message,
  );
  assert(err.message.endsWith("retry when the busy ones are idle"), err.message);
  assertEquals(err.retryAfterSeconds, 1);
  assertEquals(phases(f.pool), { a: "loaded", b: "unloaded" });
  assertEquals(f.closes.get("a"), undefined);
  held.release();
  await use(f.pool, "b");
  assertEquals(phases(f.pool), { a: "unloaded", b: "loaded" });
  await f.pool.close();
});

Deno.test("--max-loaded-models counts loaded models whatever their size", async () => {
  const f = fakePool({ a: 1, b: 1, c: 1 }, { maxLoaded: 2 });
  await use(f.pool, "a");
  await use(f.pool, "b");
  await use(f.pool, "c");
  assertEquals(phases(f.pool), { a: "unloaded", b: "loaded", c: "loaded" });
  await f.pool.close();
});

Deno.test("keep_alive 0 unloads once idle; -1 survives the pressure that takes others", async () => {
  const f = fakePool({ a: 40 * MB, b: 40 * MB, c: 40 * MB }, { budget: 100 * MB });
  const lease = await f.pool.acquire("a", 0);
  assertEquals(phases(f.pool).a, "loaded"); // held: not before the request ends
  lease.release();
  assertEquals(phases(f.pool).a, "unloaded");
  assertEquals(f.closes.get("a"), 1);
  assertEquals(f.pool.status().find((s) => s.name === "a")!.evictions, 0);

  await use(f.pool, "a", Infinity); // kept forever, and least recently used from here
  await use(f.pool, "b");
  await use(f.pool, "c"); // must evict b, not the older a
  assertEquals(phases(f.pool), { a: "loaded", b: "unloaded", c: "loaded" });
  await f.pool.close();
  assertEquals(phases(f.pool), { a: "unloaded", b: "unloaded", c: "unloaded" });
});

Deno.test("--max-keep-alive lowers a request's keep_alive -1 to the cap: the model is then evicted under pressure like any idle one", async () => {
  const HOUR = 3_600_000;
  const f = fakePool({ a: 40 * MB, b: 40 * MB, c: 40 * MB }, {
    budget: 100 * MB,
    maxKeepAliveMs: HOUR,
  });
  await use(f.pool, "a", Infinity);
  await use(f.pool, "b", 100 * 24 * HOUR); // "2400h"
  const status = (m: string) => f.pool.status().find((s) => s.name === m)!;
  assertEquals([status("a").keepAliveMs, status("b").keepAliveMs], [HOUR, HOUR]);
  assert(
    status("a").expiresInMs! <= HOUR && status("a").expiresInMs! > 0,
    String(status("a").expiresInMs),
  );
  await use(f.pool, "c"); // a, the least recently used, is not pinned: it makes room
  assertEquals(phases(f.pool), { a: "unloaded", b: "loaded", c: "loaded" });
  await f.pool.close();
});

Deno.test("keep_alive is each tenant's own: one key's 0 does not unload what another asked to keep, its own later 0 does", async () => {
  const f = fakePool({ a: 1 }, { keepAliveMs: 60_000 });
  await use(f.pool, "a", Infinity, "alice");
  await use(f.pool, "a", 0, "mallory"); // shortens only mallory's wish
  assertEquals(phases(f.pool).a, "loaded");
  assertEquals(f.pool.status()[0]!.expiresInMs, Infinity);
  await use(f.pool, "a", 0, "alice"); // alice takes hers back: nobody wants it kept
  assertEquals(phases(f.pool).a, "unloaded");
  // Without keys every request is one tenant's (""): the last keep_alive wins, as in Ollama.
  await use(f.pool, "a", Infinity);
  await use(f.pool, "a", 0);
  assertEquals(phases(f.pool).a, "unloaded");
  await f.pool.close();
});

Deno.test("no room because of models kept forever: the error names each with its size and keep-alive, and does not advise retrying", async () => {
  const f = fakePool({ a: 60 * MB, b: 60 * MB }, { budget: 100 * MB });
  await use(f.pool, "a", Infinity, "alice");
  const err = await assertRejects(() => f.pool.acquire("b"), ModelLoadError);
  assert(err.insufficientMemory);
  assertEquals(err.retryAfterSeconds, null);
  assertEquals(
    err.message,
    'Cannot load model "b": it needs 57.2 MiB and 57.2 MiB of the 95.4 MiB budget (--memory-budget) ' +
      "is held, by models that cannot be unloaded now: a 57.2 MiB (idle; kept forever (keep_alive -1)); " +
      "waiting will not help: they stay until every key keeping them forever sends keep_alive 0 " +
      "for them, or the server restarts (--max-keep-alive caps keep_alive)",
  );
  await use(f.pool, "a", 0, "alice");
  await use(f.pool, "b");
  assertEquals(phases(f.pool), { a: "unloaded", b: "loaded" });
  await f.pool.close();
});

Deno.test("the keep-alive timer unloads an idle model, and a new request cancels it", async () => {
  const f = fakePool({ a: 1, b: 1 }, { keepAliveMs: 30 });
  const until = async (model: string) => {
    const deadline = Date.now() + 60_000; // a hang guard: a loaded machine delays timers
    while (phases(f.pool)[model] !== "unloaded" && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 5));
    }
    assertEquals(phases(f.pool)[model], "unloaded");
  };
  await use(f.pool, "a");
  const held = await f.pool.acquire("a"); // cancels a's timer
  // b's timer is set after a's was: once b expired, a's would have too.
  await use(f.pool, "b");
  await until("b");
  assertEquals(phases(f.pool).a, "loaded");
  held.release();
  await until("a");
  await f.pool.close();
});

Deno.test("a failed load answers every waiter with its error and leaves the others loaded", async () => {
  const f = fakePool({ good: 1, bad: 1 }, { gated: true, failing: ["bad"] });
  const good = f.pool.acquire("good");
  while (!f.gates.has("good")) await Promise.resolve();
  f.gates.get("good")!();
  (await good).release();
  const waiters = [f.pool.acquire("bad"), f.pool.acquire("bad")];
  while (!f.gates.has("bad")) await Promise.resolve();
  f.gates.get("bad")!();
  const results = await Promise.allSettled(waiters);
  for (const r of results) {
    assertEquals(r.status, "rejected");
    const e = (r as PromiseRejectedResult).reason as ModelLoadError;
    assertEquals(e.message, 'Cannot load model "bad": bad magic in bad.gguf');
  }
  assertEquals(f.loads.get("bad"), 1);
  const bad = f.pool.status().find((s) => s.name === "bad")!;
  assertEquals([bad.phase, bad.leases, bad.loadFailures], ["unloaded", 0, 1]);
  assertEquals(bad.lastError, 'Cannot load model "bad": bad magic in bad.gguf');
  assertEquals(phases(f.pool).good, "loaded");
  await f.pool.close();
});

Deno.test("a model larger than the whole budget is refused naming both sizes", async () => {
  const f = fakePool({ big: 200 * MB }, { budget: 100 * MB });
  const e = await assertRejects(() => f.pool.acquire("big"), ModelLoadError);
  assert(e.message.includes("190.7 MiB, more than the whole memory budget of 95.4 MiB"), e.message);
  assertEquals(f.loads.get("big"), undefined);
});

Deno.test("keep_alive durations as Ollama reads them", () => {
  assertEquals(parseKeepAlive(0), 0);
  assertEquals(parseKeepAlive(-1), Infinity);
  assertEquals(parseKeepAlive("-1"), Infinity);
  assertEquals(parseKeepAlive(30), 30_000);
  assertEquals(parseKeepAlive("30"), 30_000);
  assertEquals(parseKeepAlive("5m"), 300_000);
  assertEquals(parseKeepAlive("1h30m"), 5_400_000);
  assertEquals(parseKeepAlive("250ms"), 250);
  assertEquals(parseKeepAlive("-5m"), Infinity);
  for (const bad of ["5 minutes", "", "m", true, null, {}]) {
    const r = parseKeepAlive(bad);
    assert(typeof r === "string" && r.includes("received"), String(r));
  }
});

Deno.test("an expired model's parsed file is kept for its next load and dropped first for room", async () => {
  const dropped: string[] = [];
  let clock = 0;
  const pool = new ModelPool<string>(
    [{ name: "a", estimateBytes: 40 * MB }, { name: "b", estimateBytes: 40 * MB }, {
      name: "c",
      estimateBytes: 40 * MB,
    }],
    (name, ctx) => {
      ctx.reserve(40 * MB);
      return Promise.resolve({
        service: name,
        bytes: 40 * MB,
        busy: () => 0,
        close: () => Promise.resolve({ bytes: 10 * MB, drop: () => void dropped.push(name) }),
      });
    },
    { memoryBudget: 85 * MB, keepAliveMs: 60_000, now: () => ++clock },
  );
  const status = (n: string) => pool.status().find((s) => s.name === n)!;
  const settle = () => new Promise((r) => setTimeout(r, 0));
  (await pool.acquire("a", 0)).release(); // expires at once: its file stays
  await settle();
  assertEquals([status("a").phase, status("a").residueBytes], ["unloaded", 10 * MB]);
  await use(pool, "b"); // b 40 + a's file 10 fit in 85
  assertEquals(dropped, []);
  // c: b 40 + a's file 10 + c 40 do not: a's file goes, not the loaded b.
  await use(pool, "c");
  assertEquals(dropped, ["a"]);
  assertEquals(phases(pool), { a: "unloaded", b: "loaded", c: "loaded" });
  // a again: b (idle, least recent) is evicted, and an evicted model's file goes with it.
  await use(pool, "a");
  await settle();
  assertEquals(phases(pool), { a: "loaded", b: "unloaded", c: "loaded" });
  assertEquals(dropped, ["a", "b"]);
  assertEquals(status("b").residueBytes, 0);
  await pool.close();
  assertEquals(dropped, ["a", "b", "a", "c"]);
});
