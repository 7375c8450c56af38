/**
 * Replicas serving several models over NATS (`serve --nats --model a --model b`) behind
 * `router --by-model`: each replica's heartbeats list its models and which are loaded; a
 * request goes to a replica serving its model (the answer is `generate`'s for that file), to
 * one with it loaded when there is one, else to one that loads it; an unknown model is a 404
 * naming every served one.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { Cluster, until } from "./_cluster.ts";

/** Served by the first replica only, the second only, and both. */
const ONLY_1 = "stories260K-q4_1";
const ONLY_2 = "stories260K-q5_1";
const BOTH = "tinyllama-like-q4_0";
const PROMPT = "Once upon a time";
const N = 8;

const generateAlone = (stem: string) => generateCompat(stem, PROMPT, N);

const replicaArgs = (stems: string[]) => [
  ...stems.flatMap((s) => ["--model", compatPath(s)]),
  "--backend",
  "cpu",
  "--kv-memory",
  "2MiB",
  "--max-running",
  "4",
  "--max-batch-tokens",
  "128",
];

/** A member's /health models, and one /metrics series of a model. */
async function phases(base: string): Promise<Record<string, string>> {
  const h = await (await fetch(`${base}/health`)).json();
  return Object.fromEntries(
    Object.entries(h.models as Record<string, { phase: string }>).map(([k, v]) => [k, v.phase]),
  );
}
async function loads(base: string, model: string): Promise<number> {
  const body = await (await fetch(`${base}/metrics`)).text();
  const line = body.split("\n").find((l) =>
    l.startsWith(`llm_model_loads_total{model="${model}"}`)
  );
  if (line === undefined) throw new Error(`no llm_model_loads_total for ${model} at ${base}`);
  return Number(line.split(" ").pop());
}

Deno.test("replicas of several models: routed by name, to the one with the model loaded", async (t) => {
  await using cluster = await Cluster.start();
  const [oracles, r1, r2] = await Promise.all([
    Promise.all([ONLY_1, ONLY_2, BOTH].map(generateAlone)).then(([a, b, c]) => ({
      [ONLY_1]: a!,
      [ONLY_2]: b!,
      [BOTH]: c!,
    } as Record<string, string>)),
    cluster.replicaServing(replicaArgs([ONLY_1, BOTH])),
    cluster.replicaServing(replicaArgs([BOTH, ONLY_2])),
  ]);
  assert(oracles[ONLY_1] !== oracles[BOTH] && oracles[ONLY_2] !== oracles[BOTH]);
  const router = await cluster.router(["--by-model"]);
  const complete = async (model: string, stream = false) => {
    const res = await fetch(`${router.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0, stream }),
    });
    return { status: res.status, text: await res.text() };
  };
  const text = async (model: string) => {
    const r = await complete(model);
    assertEquals(r.status, 200, r.text);
    const body = JSON.parse(r.text);
    assertEquals(body.model, model);
    return body.choices[0].text as string;
  };

  await t.step("the router lists every model of both replicas, none loaded", async () => {
    await until("the router to hear both replicas' models", async () => {
      const list = await (await fetch(`${router.base}/v1/models`)).json();
      return list.data.length === 3;
    }, 30_000);
    const list = await (await fetch(`${router.base}/v1/models`)).json();
    assertEquals(list.data.map((m: { id: string }) => m.id).sort(), [ONLY_1, ONLY_2, BOTH].sort());
    assertEquals(await phases(router.base), {
      [ONLY_1]: "unloaded",
      [ONLY_2]: "unloaded",
      [BOTH]: "unloaded",
    });
    assertEquals(await phases(r1.base), { [ONLY_1]: "unloaded", [BOTH]: "unloaded" });
  });

  await t.step("a model one replica serves is loaded and answered there", async () => {
    assertEquals(await text(ONLY_1), oracles[ONLY_1]);
    assertEquals(await text(ONLY_2), oracles[ONLY_2]);
    assertEquals((await phases(r1.base))[ONLY_1], "loaded");
    assertEquals((await phases(r2.base))[ONLY_2], "loaded");
    assertEquals(await loads(r1.base, ONLY_1), 1);
    assertEquals(await loads(r2.base, ONLY_2), 1);
  });

  await t.step("a model both serve is loaded on one, and its requests stay there", async () => {
    for (let i = 0; i < 4; i++) assertEquals(await text(BOTH), oracles[BOTH]);
    const counts = [await loads(r1.base, BOTH), await loads(r2.base, BOTH)];
    assertEquals(counts[0]! + counts[1]!, 1, `loads of ${BOTH} on the two replicas: ${counts}`);
  });

  await t.step("loaded on the other replica, its requests go there", async () => {
    // Unload it where it is (keep_alive 0 on that replica's own HTTP port) and load it on the
    // other one the same way; once the router hears it, the router's requests go there.
    const [holder, other] = (await loads(r1.base, BOTH)) === 1 ? [r1, r2] : [r2, r1];
    const direct = async (base: string, keepAlive: number | string) => {
      const res = await fetch(`${base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: BOTH,
          prompt: PROMPT,
          max_tokens: N,
          temperature: 0,
          keep_alive: keepAlive,
        }),
      });
      assertEquals(res.status, 200);
      assertEquals((await res.json()).choices[0].text, oracles[BOTH]);
    };
    // The router routes by each replica's latest heartbeat, which lags the replica's own
    // /health by up to two beats (the main thread's snapshot, then the heartbeat worker's
    // send), and its /health phase sums up every replica's: "loaded" there does not say where.
    // So each wait is for the one phase only the state wanted can give. First the holder's
    // load of the last step: until a beat says loaded, the router may still hear "unloaded"
    // or "loading" from before it (a later "unloaded" would not be the unload), and routing
    // counts a replica it sent work to as loading it (ReplicaRegistry.hasLoaded, up to 30 s)
    // until a beat says loaded.
    const routerPhase = async () => (await phases(router.base))[BOTH];
    await until(
      `the router to hear ${BOTH} loaded on the holder`,
      async () => (await routerPhase()) === "loaded",
    );
    await direct(holder.base, 0);
    await until(
      `${BOTH} to be unloaded on ${holder.base}`,
      async () => (await phases(holder.base))[BOTH] === "unloaded",
    );
    // Then the unload: "unloaded" only once no replica's beat says loading or loaded.
    await until(
      `the router to hear ${BOTH} unloaded`,
      async () => (await routerPhase()) === "unloaded",
    );
    await direct(other.base, "10m");
    // Now only the other replica can be the one the router hears it loaded on.
    await until(
      "the router to see it loaded on the other replica",
      async () => (await routerPhase()) === "loaded",
    );
    const before = [await loads(holder.base, BOTH), await loads(other.base, BOTH)];
    for (let i = 0; i < 4; i++) assertEquals(await text(BOTH), oracles[BOTH]);
    const after = [await loads(holder.base, BOTH), await loads(other.base, BOTH)];
    assertEquals(
      after,
      before,
      "no replica loaded it again: the router sent it where it was loaded",
    );
    assertEquals((await phases(holder.base))[BOTH], "unloaded");
  });

  await t.step(
    "a streamed request for a model loaded nowhere hears the load, then its tokens",
    async () => {
      // Unloaded on its replica first (keep_alive 0 on that replica's own HTTP port).
      const res = await fetch(`${r1.base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: ONLY_1, prompt: PROMPT, max_tokens: 1, keep_alive: 0 }),
      });
      assertEquals(res.status, 200);
      await res.body?.cancel();
      await until(
        `${ONLY_1} to be unloaded`,
        async () => (await phases(r1.base))[ONLY_1] === "unloaded",
      );
      await until("the router to hear it", async () => {
        const h = await (await fetch(`${router.base}/health`)).json();
        return h.models[ONLY_1]?.phase !== "loaded";
      });
      const r = await complete(ONLY_1, true);
      assertEquals(r.status, 200);
      assertStringIncludes(r.text, `: loading model "${ONLY_1}"`);
      const events = r.text.split("\n\n").filter((e) =>
        e.startsWith("data: ") && e !== "data: [DONE]"
      )
        .map((e) => JSON.parse(e.slice(6)));
      assertEquals(events.map((e) => e.choices?.[0]?.text ?? "").join(""), oracles[ONLY_1], r.text);
      assertEquals(await loads(r1.base, ONLY_1), 2);
    },
  );

  await t.step("an unknown model is a 404 naming every served one", async () => {
    const r = await complete("no-such-model");
    assertEquals(r.status, 404);
    const body = JSON.parse(r.text);
    assertEquals(body.error.code, "model_not_found");
    for (const m of [ONLY_1, ONLY_2, BOTH]) assertStringIncludes(body.error.message, `"${m}"`);
  });

  await t.step(
    "SIGTERM to a replica of several models: it leaves the rotation, drains and exits 0",
    async () => {
      const status = await cluster.kill(r2, "SIGTERM");
      assertEquals(status.code, 0);
      assertStringIncludes(await r2.log(), "replica drained: all NATS streams finished");
      // Its goodbye takes it out at once: ONLY_2, served by no replica now, is no longer served.
      const r = await complete(ONLY_2);
      assertEquals(r.status, 404, r.text);
      const message = JSON.parse(r.text).error.message as string;
      const served = message.slice(message.indexOf("serves "));
      for (const m of [BOTH, ONLY_1]) assertStringIncludes(served, `"${m}"`);
      assert(!served.includes(`"${ONLY_2}"`), message);
      // The shared one is served by the other replica (it loads it there).
      assertEquals(await text(BOTH), oracles[BOTH]);
    },
  );
});
