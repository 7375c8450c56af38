/**
 * A plain router's front (lib/cluster/router_front.ts) and a router by model, in process: real
 * ReplicaAgents of several models (each model its own serving core over the fake model,
 * tests/_fake_core.ts) and real routers on an in-process NATS (tests/_fake_nats.ts). Each
 * answer's text is the fake model's own continuation, computed without any core, and the core
 * that served it is the one of the model it named, on a replica serving that model; aliases a
 * replica advertises reach the same core as the model's name.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { ServiceMetrics } from "../lib/http/service_metrics.ts";
import type { ServiceApp } from "../lib/http/app.ts";
import { ModelRouterDirectory } from "../lib/cluster/model_router.ts";
import { ReplicaAgent, type ReplicaModels } from "../lib/cluster/replica.ts";
import { coreReplicaSource } from "../lib/cluster/replica_source.ts";
import { RouterBackend } from "../lib/cluster/router_backend.ts";
import { createPlainRouter } from "../lib/cluster/router_front.ts";
import { createModelsFront } from "../lib/http/models_front.ts";
import { parseLlama2cTokenizer } from "../lib/tokenizer/llama2c_tokenizer.ts";
import { FakeCore } from "./_fake_core.ts";
import { FakeNatsServer } from "./_fake_nats.ts";
import {
  assertRefusesInvalidUtf8 as refusesInvalidUtf8,
  invalidUtf8Completion,
  metricValue,
  TestSocket,
} from "./_http_harness.ts";
import { serveService } from "../lib/http/serve.ts";
import { modelFile } from "./harness/model_files.ts";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { Cluster, until } from "./_cluster.ts";

const TOKENIZER_DATA = parseLlama2cTokenizer(
  await Deno.readFile(modelFile("tok512.bin")),
  512,
  "tok512.bin",
);
const PROMPT = "Once upon a time there was a little dog";
const N = 6;

interface Served {
  readonly name: string;
  readonly aliases?: readonly string[];
  readonly core: FakeCore;
}

/** A replica's models, every one loaded: each generate runs on its model's own core. */
function replicaModels(models: readonly Served[]): ReplicaModels {
  const sources = new Map(models.map((m) => [
    m.name,
    coreReplicaSource({
      backend: m.core,
      core: m.core.serving,
      tokenizer: TOKENIZER_DATA,
      blockSize: 16,
      modelName: m.name,
      modelId: undefined,
      limits: { maxRunning: 8, maxWaiting: 8 },
    }),
  ]));
  return {
    maxRunning: 8,
    maxWaiting: 8,
    blockSize: 16,
    list: () =>
      models.map((m) => ({
        name: m.name,
        ...(m.aliases === undefined ? {} : { aliases: m.aliases }),
        phase: "loaded" as const,
        source: sources.get(m.name)!,
      })),
    acquire: (name) => Promise.resolve({ source: sources.get(name)!, release() {} }),
  };
}

/**
 * Two replicas: replica-0 serves alpha (alias a-alias) and beta (alias b-alias), replica-1
 * beta (alias b-alias) and gamma. The router's own model is alpha: replica-0 starts first.
 */
async function cluster() {
  const server = new FakeNatsServer();
  const core = (name: string) => new FakeCore({ modelName: name });
  const cores = {
    alpha0: core("alpha"),
    beta0: core("beta"),
    beta1: core("beta"),
    gamma1: core("gamma"),
  };
  const replicas: Served[][] = [
    [{ name: "alpha", aliases: ["a-alias"], core: cores.alpha0 }, {
      name: "beta",
      aliases: ["b-alias"],
      core: cores.beta0,
    }],
    [{ name: "beta", aliases: ["b-alias"], core: cores.beta1 }, {
      name: "gamma",
      core: cores.gamma1,
    }],
  ];
  const conns = replicas.map((_, i) => server.connect(`replica-${i}`));
  const agents = replicas.map((models, i) =>
    new ReplicaAgent(conns[i]!, replicaModels(models), { id: `replica-${i}`, heartbeatMs: 50 })
  );
  await agents[0]!.start();
  const log: string[] = [];
  const routerConn = server.connect("router");
  // As lib/cli/router.ts makes them: the replicas run the steps.
  const metrics = new ServiceMetrics({ core: "replicas" });
  const backend = await RouterBackend.start(routerConn, {
    waitMs: 5000,
    staleAfterMs: 1000,
    metrics,
    log: (l) => log.push(l),
  });
  await agents[1]!.start();
  return {
    cores,
    routerConn,
    backend,
    metrics,
    log,
    async [Symbol.asyncDispose]() {
      backend.close();
      await routerConn.close();
      for (const a of agents) await a.close();
      for (const c of conns) await c.close();
      for (const c of Object.values(cores)) await c.close();
    },
  };
}

type InProcess = Awaited<ReturnType<typeof cluster>>;

async function complete(service: ServiceApp, model: string | undefined) {
  const res = await service.fetch(
    new Request("http://router/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        ...(model === undefined ? {} : { model }),
        prompt: PROMPT,
        max_tokens: N,
        temperature: 0,
      }),
    }),
  );
  return { status: res.status, body: await res.json() };
}

/** A front's answer to a body that is not UTF-8: 400, and nothing generated. */
async function assertRefusesInvalidUtf8(service: ServiceApp, c: InProcess, model: string) {
  const before = counts(c);
  await refusesInvalidUtf8(
    await service.fetch(new Request("http://router/v1/completions", invalidUtf8Completion(model))),
  );
  assertEquals(counts(c), before, "nothing reached a replica");
}

/** How many generations each core ran. */
const counts = (c: InProcess) =>
  Object.fromEntries(Object.entries(c.cores).map(([k, v]) => [k, v.requests.length]));

/** The families a core's executor measures: its replicas run the steps, never a router. */
const STEP_FAMILIES = [
  "llm_steps_total",
  "llm_step_duration_seconds",
  "llm_batch_size",
  "llm_executor_busy_seconds_total",
  "llm_executor_busy_fraction",
  "llm_executor_restarts_total",
  "llm_pipeline_depth",
];

/**
 * A front of several models has samples without a `model` label only for what it records
 * itself (its connections, its requests, its errors): the queues and executors are each
 * model's, and a front-wide 0 beside them would read as a measurement.
 */
function assertOnlyFrontFamiliesUnlabelled(text: string): void {
  const unlabelled = text.split("\n")
    .filter((l) => l !== "" && !l.startsWith("#") && !l.includes('model="'));
  for (const l of unlabelled) {
    assert(/^llm_(http_|errors_total|generations_total)/.test(l), `unlabelled: ${l}`);
  }
}

/**
 * Waits until the router's `family` (fed by its replicas' heartbeats, not by its own requests)
 * reads 0: a heartbeat sent before the earlier requests ended still counts them.
 */
async function heartbeatSays0(fetchMetrics: () => Promise<string>, family: string): Promise<void> {
  await until(
    `the replicas' heartbeat to bring ${family} to 0`,
    async () => metricValue(await fetchMetrics(), family) === 0,
  );
}

/** Waits until the route of `model` (built by `directory`) has both replicas of beta ready. */
async function bothReplicasReady(directory: ModelRouterDirectory, model: string): Promise<void> {
  await until(`${model}'s route to see two replicas`, async () => {
    const app = directory.loaded().find((m) => m.name === model)?.service;
    if (app === undefined) return false;
    const text = await (await app.fetch(new Request("http://router/metrics"))).text();
    return metricValue(text, 'llm_router_replicas{state="ready"}') === 2;
  });
}

Deno.test("a plain router serves every model its replicas advertise, by name and by alias", async (t) => {
  await using c = await cluster();
  const oracle = c.cores.alpha0.continuation(PROMPT, N).text;
  const { service, directory } = createPlainRouter(c.routerConn, c.backend, {
    metrics: c.metrics,
    policy: "round-robin",
    log: (l) => c.log.push(l),
  });
  try {
    assertEquals(c.backend.modelName, "alpha");
    await until(
      "the router to hear gamma and beta",
      () => directory.has("gamma") && directory.has("beta"),
    );

    await t.step("/v1/models lists its own model, the others and every alias", async () => {
      const list = await (await service.fetch(new Request("http://router/v1/models"))).json();
      const ids = list.data.map((m: { id: string; root: string }) => `${m.id}->${m.root}`).sort();
      assertEquals(ids, [
        "a-alias->alpha",
        "alpha->alpha",
        "b-alias->beta",
        "beta->beta",
        "gamma->gamma",
      ]);
      const one = await service.fetch(new Request("http://router/v1/models/b-alias"));
      assertEquals(one.status, 200);
      assertEquals((await one.json()).root, "beta");
    });

    await t.step(
      "its own model, by name, by alias and by default, runs on alpha's core",
      async () => {
        for (const model of ["alpha", "a-alias", undefined]) {
          const r = await complete(service, model);
          assertEquals(r.status, 200, JSON.stringify(r.body));
          assertEquals(r.body.choices[0].text, oracle);
          assertEquals(r.body.model, model ?? "alpha");
        }
        assertEquals(counts(c), { alpha0: 3, beta0: 0, beta1: 0, gamma1: 0 });
      },
    );

    await t.step("a model only the second replica serves runs there", async () => {
      const r = await complete(service, "gamma");
      assertEquals(r.status, 200, JSON.stringify(r.body));
      assertEquals(r.body.choices[0].text, oracle);
      assertEquals(r.body.model, "gamma");
      assertEquals(counts(c), { alpha0: 3, beta0: 0, beta1: 0, gamma1: 1 });
    });

    await t.step(
      "a model both serve is spread by the router's policy over both, alias or not",
      async () => {
        assertEquals((await complete(service, "beta")).status, 200);
        await bothReplicasReady(directory, "beta");
        const before = counts(c);
        for (const model of ["beta", "b-alias", "beta", "b-alias"]) {
          const r = await complete(service, model);
          assertEquals(r.status, 200, JSON.stringify(r.body));
          assertEquals(r.body.choices[0].text, oracle);
          assertEquals(r.body.model, model);
        }
        const after = counts(c);
        // Round-robin over the two replicas serving beta: two each, on beta's cores only.
        assertEquals(after.beta0! - before.beta0!, 2);
        assertEquals(after.beta1! - before.beta1!, 2);
        assertEquals([after.alpha0, after.gamma1], [before.alpha0, before.gamma1]);
      },
    );

    await t.step("an unknown model is a 404 naming every served one", async () => {
      const r = await complete(service, "no-such-model");
      assertEquals(r.status, 404);
      assertEquals(r.body.error.code, "model_not_found");
      for (const m of ["alpha", "a-alias", "beta", "b-alias", "gamma"]) {
        assertStringIncludes(r.body.error.message, `"${m}"`);
      }
      assertEquals(
        (await service.fetch(new Request("http://router/v1/models/no-such-model"))).status,
        404,
      );
    });

    await t.step(
      "/metrics has its replicas' queue but no steps: its replicas run them",
      async () => {
        const scrape = async () =>
          await (await service.fetch(new Request("http://router/metrics"))).text();
        await heartbeatSays0(scrape, "llm_requests_running");
        const metrics = await scrape();
        for (const family of STEP_FAMILIES) {
          assertEquals(metrics.includes(family), false, `${family} in the router's /metrics`);
        }
        assertEquals(metricValue(metrics, "llm_requests_running"), 0);
        assertEquals(metricValue(metrics, "llm_executor_healthy"), 1);
        // Its stats (WebSocket stats frames) have no step count or batch size either.
        const stats = c.backend.stats();
        assertEquals(["steps" in stats, "lastBatchSize" in stats], [false, false]);
      },
    );
  } finally {
    await directory.close();
    service.close();
  }
});

Deno.test("a plain router with API keys: another model needs the key, and so does its 404", async () => {
  await using c = await cluster();
  const { service, directory } = createPlainRouter(c.routerConn, c.backend, {
    metrics: c.metrics,
    apiKeys: ["k-123"],
    log: (l) => c.log.push(l),
  });
  const post = (model: string, key?: string) =>
    service.fetch(
      new Request("http://router/v1/completions", {
        method: "POST",
        headers: {
          "content-type": "application/json",
          ...(key === undefined ? {} : { authorization: `Bearer ${key}` }),
        },
        body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0 }),
      }),
    );
  try {
    await until("the router to hear gamma", () => directory.has("gamma"));
    for (const model of ["gamma", "no-such-model"]) {
      const res = await post(model);
      assertEquals(res.status, 401, model);
      assertEquals((await res.json()).error.code, "unauthorized");
    }
    assertEquals(c.cores.gamma1.requests.length, 0);
    const ok = await post("gamma", "k-123");
    const body = await ok.json();
    assertEquals(ok.status, 200, JSON.stringify(body));
    assertEquals(body.choices[0].text, c.cores.gamma1.continuation(PROMPT, N).text);
    assertEquals(c.cores.gamma1.requests.length, 1);
    const unknown = await post("no-such-model", "k-123");
    assertEquals(unknown.status, 404);
    assertStringIncludes((await unknown.json()).error.message, `"gamma"`);
  } finally {
    await directory.close();
    service.close();
  }
});

Deno.test("a router by model routes an advertised alias as the model's name", async () => {
  await using c = await cluster();
  const oracle = c.cores.beta0.continuation(PROMPT, N).text;
  const directory = new ModelRouterDirectory(c.routerConn, { policy: "round-robin" });
  const service = createModelsFront({
    pool: directory,
    catalog: () => directory.catalog(),
    // As lib/cli/router.ts makes it: each model's route exports the core families.
    metrics: new ServiceMetrics({ core: "none" }),
    modelMetrics: directory.modelMetrics,
  });
  try {
    await until(
      "the router to hear every model",
      () => ["alpha", "beta", "gamma"].every((m) => directory.has(m)),
    );
    const list = await (await service.fetch(new Request("http://router/v1/models"))).json();
    assertEquals(
      list.data.map((m: { id: string; root: string }) => `${m.id}->${m.root}`).sort(),
      ["a-alias->alpha", "alpha->alpha", "b-alias->beta", "beta->beta", "gamma->gamma"],
    );
    assertEquals((await complete(service, "b-alias")).status, 200);
    await bothReplicasReady(directory, "beta");
    const before = counts(c);
    for (let i = 0; i < 4; i++) {
      const r = await complete(service, "b-alias");
      assertEquals(r.status, 200, JSON.stringify(r.body));
      assertEquals(r.body.choices[0].text, oracle);
      assertEquals(r.body.model, "b-alias");
    }
    const after = counts(c);
    assertEquals([after.beta0! - before.beta0!, after.beta1! - before.beta1!], [2, 2]);
    assertEquals([after.alpha0, after.gamma1], [before.alpha0, before.gamma1]);
    const a = await complete(service, "a-alias");
    assertEquals(a.status, 200, JSON.stringify(a.body));
    assertEquals(after.alpha0! + 1, c.cores.alpha0.requests.length);
    const unknown = await complete(service, "no-such-model");
    assertEquals(unknown.status, 404);
    for (const m of ["alpha", "a-alias", "beta", "b-alias", "gamma"]) {
      assertStringIncludes(unknown.body.error.message, `"${m}"`);
    }
    await assertRefusesInvalidUtf8(service, c, "beta");
    // A router loads nothing: no load counts or resident bytes of its own, which would be zeros
    // beside the replicas' real ones.
    const scrape = async () =>
      await (await service.fetch(new Request("http://router/metrics"))).text();
    await heartbeatSays0(scrape, 'llm_requests_running{model="beta"}');
    const metrics = await scrape();
    for (
      const family of [
        "llm_model_loads_total",
        "llm_model_resident_bytes",
        "llm_model_evictions_total",
      ]
    ) {
      assertEquals(metrics.includes(family), false, `${family} in the router's /metrics`);
    }
    // Nor steps (its replicas run them), nor a front-wide queue or executor beside the models'.
    for (const family of STEP_FAMILIES) {
      assertEquals(metrics.includes(family), false, `${family} in the router's /metrics`);
    }
    assertOnlyFrontFamiliesUnlabelled(metrics);
    // Its /health says where each model stands, but no memory held or keep-alive: the
    // replicas hold the models and unload them.
    const health = await (await service.fetch(new Request("http://router/health"))).json();
    assertEquals(health.models.beta, { phase: "loaded", in_flight: 0 });
    // What the router does know, from beta's replicas' heartbeats.
    assertEquals(metricValue(metrics, 'llm_requests_running{model="beta"}'), 0);
    assertEquals(metricValue(metrics, 'llm_executor_healthy{model="beta"}'), 1);
  } finally {
    service.close();
    await directory.close();
  }
});

Deno.test("a plain router refuses a body that is not UTF-8 with a 400, for its own model and another", async () => {
  await using c = await cluster();
  const { service, directory } = createPlainRouter(c.routerConn, c.backend, {
    metrics: c.metrics,
    policy: "round-robin",
    log: (l) => c.log.push(l),
  });
  try {
    await until("the router to hear gamma", () => directory.has("gamma"));
    await assertRefusesInvalidUtf8(service, c, "alpha");
    await assertRefusesInvalidUtf8(service, c, "gamma");
  } finally {
    service.close();
    await directory.close();
  }
});

Deno.test("a plain router hands a WebSocket naming another model (?model=) to that model's replicas", async () => {
  await using c = await cluster();
  const { service, directory } = createPlainRouter(c.routerConn, c.backend, {
    metrics: c.metrics,
    policy: "round-robin",
    log: (l) => c.log.push(l),
  });
  // Over a real HTTP server: the upgrade is the server adapter's, passed on to gamma's app.
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
  });
  try {
    await until("the router to hear gamma", () => directory.has("gamma"));
    const before = counts(c);
    const ws = await TestSocket.open(`ws://127.0.0.1:${server.addr.port}/v1/stream?model=gamma`);
    try {
      ws.send({ type: "generate", id: "g", prompt: PROMPT, max_tokens: N, temperature: 0 });
      const frames = await ws.collect("g");
      assertEquals(frames.at(-1)!.type, "done", JSON.stringify(frames.at(-1)));
      const text = frames.filter((f) => f.type === "token").map((f) => f.text).join("");
      assertEquals(text, c.cores.gamma1.continuation(PROMPT, N).text);
    } finally {
      await ws.close();
    }
    const after = counts(c);
    assertEquals(after.gamma1! - before.gamma1!, 1);
    assertEquals([after.alpha0, after.beta0, after.beta1], [
      before.alpha0,
      before.beta0,
      before.beta1,
    ]);
  } finally {
    service.close();
    await server.stop();
    await directory.close();
  }
});

const A = "stories260K-q4_1";
const B = "tinyllama-like-q4_0";
/** Served alone by a replica of one model, under two names. */
const C = "stories260K-q5_1";
const TEXT_PROMPT = "Once upon a time";

const generateAlone = (stem: string) => generateCompat(stem, TEXT_PROMPT, N);

Deno.test("over nats-server: both routers serve a replica's every model, by name and by alias", async (t) => {
  await using cluster = await Cluster.start();
  const limits = [
    "--backend",
    "cpu",
    "--kv-memory",
    "2MiB",
    "--max-running",
    "4",
    "--max-batch-tokens",
    "128",
  ];
  const [oracleA, oracleB, oracleC, replica, solo] = await Promise.all([
    generateAlone(A),
    generateAlone(B),
    generateAlone(C),
    cluster.replicaServing([
      "--model",
      compatPath(A),
      "--model",
      compatPath(B),
      "--served-model-name",
      `chat=${B}`,
      "--served-model-name",
      `talk=${B}`,
      ...limits,
    ]),
    // A server of one model: the first --served-model-name is its name, the second an alias.
    cluster.replicaServing([
      "--model",
      compatPath(C),
      "--served-model-name",
      "solo",
      "--served-model-name",
      "solo2",
      ...limits,
    ]),
  ]);
  // A and C (two quantizations of stories260K) may answer alike: which replica ran each
  // request is told by the replicas' logs below.
  assert(oracleA !== oracleB && oracleC !== oracleB, "B must answer unlike A and C");
  const [plain, byModel] = await Promise.all([cluster.router(), cluster.router(["--by-model"])]);
  const served = [A, "chat", "talk", "solo", "solo2"];
  for (const [what, router] of [["plain", plain], ["by model", byModel]] as const) {
    await t.step(`${what}: /v1/models, answers by name and alias, and the 404`, async () => {
      await until("the router to hear every name", async () => {
        const list = await (await fetch(`${router.base}/v1/models`)).json();
        return list.data?.length === served.length;
      }, 30_000);
      const list = await (await fetch(`${router.base}/v1/models`)).json();
      assertEquals(
        list.data.map((m: { id: string; root: string }) => `${m.id}->${m.root}`).sort(),
        [`${A}->${A}`, "chat->chat", "talk->chat", "solo->solo", "solo2->solo"].sort(),
      );
      const asked = [["talk", oracleB], [A, oracleA], ["solo2", oracleC], ["chat", oracleB], [
        "solo",
        oracleC,
      ]];
      for (const [model, oracle] of asked) {
        const res = await fetch(`${router.base}/v1/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model, prompt: TEXT_PROMPT, max_tokens: N, temperature: 0 }),
        });
        const body = await res.json();
        assertEquals(res.status, 200, JSON.stringify(body));
        assertEquals(body.model, model);
        assertEquals(body.choices[0].text, oracle, `${model} through the ${what} router`);
      }
      // The file's own name is not served: the alias replaced it on the replica.
      const res = await fetch(`${router.base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: B, prompt: TEXT_PROMPT, max_tokens: N }),
      });
      const body = await res.json();
      assertEquals(res.status, 404, JSON.stringify(body));
      assertEquals(body.error.code, "model_not_found");
      for (const m of served) assertStringIncludes(body.error.message, `"${m}"`);
    });
  }
  for (const [what, router] of [["plain", plain], ["by model", byModel]] as const) {
    await t.step(
      `${what}: /metrics and stats frames hold no step counts of the router's own`,
      async () => {
        const metrics = await (await fetch(`${router.base}/metrics`)).text();
        for (const family of STEP_FAMILIES) {
          assertEquals(
            metrics.includes(family),
            false,
            `${family} in the ${what} router's /metrics`,
          );
        }
        if (router === byModel) {
          assertOnlyFrontFamiliesUnlabelled(metrics);
          assert(metricValue(metrics, 'llm_requests_running{model="chat"}') !== undefined, metrics);
          return;
        }
        await heartbeatSays0(
          async () => await (await fetch(`${router.base}/metrics`)).text(),
          "llm_requests_running",
        );
        const ws = new WebSocket(`${router.base.replace("http", "ws")}/v1/stream`);
        const frame = new Promise<Record<string, unknown>>((resolve, reject) => {
          ws.onmessage = (e) => {
            const f = JSON.parse(e.data);
            if (f.type === "stats") resolve(f);
          };
          ws.onerror = () => reject(new Error("the router's WebSocket failed"));
        });
        await new Promise((r) => ws.onopen = r);
        ws.send(JSON.stringify({ type: "subscribe_stats" }));
        const stats = await frame;
        ws.close();
        assertEquals([stats.running, stats.executor_healthy], [0, true], JSON.stringify(stats));
        assertEquals(
          ["steps" in stats, "batch_size" in stats],
          [false, false],
          JSON.stringify(stats),
        );
      },
    );
  }
  // Both routers' requests for chat and talk ran on the replica's one copy of the file.
  const metrics = await (await fetch(`${replica.base}/metrics`)).text();
  // The replicas ran the steps (and say so in the families the routers leave out).
  assert(metricValue(metrics, 'llm_steps_total{model="chat"}')! > 0, "the replica's steps");
  assertEquals(metricValue(metrics, 'llm_model_loads_total{model="chat"}'), 1);
  assertEquals(metricValue(metrics, `llm_model_loads_total{model="${A}"}`), 1);
  // Which replica served each: every generation a replica runs for a router is a request-log
  // line of its own (method NATS). Per router: A, chat and talk there; solo and solo2 on solo.
  for (const [member, n] of [[replica, 6], [solo, 4]] as const) {
    assertEquals((await cluster.kill(member, "SIGTERM")).code, 0);
    const log = await member.log();
    assertEquals(log.match(/ NATS generate 200 /g)?.length ?? 0, n, log);
  }
});
