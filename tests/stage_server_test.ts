/**
 * Pipeline stages as real processes (`main.ts stage`) on a real nats-server with a password:
 * the head (this process) runs stage 0 and attaches to the others over NATS and their direct
 * TCP links. Exactness against one process, and the stage protocol's refusals.
 */
import { assert, assertEquals, assertRejects, assertStringIncludes } from "@std/assert";
import { NatsServer } from "./_cluster.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { stagePlacement } from "../kernels/wasm/stage_placement.ts";
import { PipelineEngine } from "../lib/engine/pipeline_engine.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { connectNats, type NatsConnection } from "../lib/cluster/nats_connection.ts";
import { attachStages } from "../lib/cluster/stage_client.ts";
import { budgetProblem } from "../lib/cluster/stage_server.ts";
import { modelIdentity } from "../lib/cluster/model_identity.ts";
import { subjects } from "../lib/cluster/subjects.ts";
import { decodeFrame, encodeFrame } from "../lib/cluster/binary_frame.ts";
import { FrameReader, writeFrame } from "../lib/cluster/frame_stream.ts";
import { StageAnnouncementSchema } from "../lib/cluster/stage_messages.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";
import { randomPrompts, runSteps, SEEDED } from "./harness/engine_steps.ts";

const KV = { numBlocks: 48, blockSize: 16 };
const LIMITS = { maxBatchTokens: 256, maxSeqs: 16 };
const CTX = 512;

/** A stage process; kill() ends it. */
function spawnStage(
  nats: string,
  model: string,
  layers: string,
  extra: string[] = [],
): Deno.ChildProcess {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      "main.ts",
      "stage",
      "--nats",
      nats,
      "--model",
      model,
      "--layers",
      layers,
      "--threads",
      "1",
      "--context-length",
      String(CTX),
      ...extra,
    ],
    stdout: "null",
    stderr: "null",
  }).spawn();
}

async function stop(c: Deno.ChildProcess, signal: Deno.Signal = "SIGTERM") {
  try {
    c.kill(signal);
  } catch { /* gone */ }
  await c.status;
}

/** The head of a 2-stage pipeline over `path`: stage 0-`cut` here, the rest remote. */
async function head(nc: NatsConnection, path: string, cut: number, timeoutMs = 60_000) {
  const m = await loadModel(path, {
    contextLength: CTX,
    placeTensors: stagePlacement({ start: 0, end: cut }, path),
  });
  const local = await WasmEngine.create(m.config, m.weights, KV, {
    ...LIMITS,
    threads: 1,
    layers: { start: 0, end: cut },
  });
  try {
    const remote = await attachStages(nc, {
      model: await modelIdentity(path, CTX),
      ranges: [{ start: cut, end: m.config.nLayers }],
      kv: KV,
      limits: LIMITS,
      contextLength: CTX,
      timeoutMs,
    });
    return new PipelineEngine(m.config, KV, [local, ...remote], LIMITS);
  } catch (e) {
    local.dispose();
    throw e;
  }
}

Deno.test("PP 2 across real processes on a real nats-server gives the one-process logits bit for bit and its tokens, greedy and seeded, at 1 and 16 sequences (llama3-like, qwen2-like)", async () => {
  const nats = await NatsServer.start();
  const files = [compatPath("llama3-like-q4_k_m"), compatPath("qwen2-like-q4_k_m")];
  const stages = files.map((f) => spawnStage(nats.url, f, "1-2"));
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  try {
    for (const path of files) {
      const whole = await loadModel(path, { contextLength: CTX });
      const single = await WasmEngine.create(whole.config, whole.weights, KV, {
        ...LIMITS,
        threads: 1,
      });
      const pp = await head(nc, path, 1);
      for (const n of [1, 16]) {
        for (const sampling of [GREEDY, SEEDED]) {
          const p = randomPrompts(n, whole.config.vocabSize);
          const want = await runSteps(single, p, 4, sampling);
          const got = await runSteps(pp, p, 4, sampling);
          const what = `${path}, ${n} seqs, temperature ${sampling.temperature}`;
          assertEquals(got.tokens, want.tokens, what);
          assertEquals(got.logits, want.logits, what);
        }
      }
      pp.dispose();
      single.dispose();
    }
  } finally {
    await nc.close();
    await Promise.all(stages.map((s) => stop(s)));
    await nats.stop();
  }
});

Deno.test("the head refuses a stage of another model file or other layers, naming both; a stage answers bad attach requests and bad link frames with errors; a restarted stage serves a new head", async () => {
  const nats = await NatsServer.start();
  const llama = compatPath("llama3-like-q4_k_m"), stories = modelFile("stories260K.gguf");
  let stage = spawnStage(nats.url, llama, "1-2");
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  try {
    // The stage's announcement, as every peer sees it.
    const ann = await new Promise<ReturnType<typeof StageAnnouncementSchema.parse>>((resolve) => {
      const sub = nc.subscribe(subjects.stages, {
        callback: (_e, m) => {
          sub.unsubscribe();
          resolve(StageAnnouncementSchema.parse(JSON.parse(new TextDecoder().decode(m.data))));
        },
      });
    });
    assertEquals(ann.layers, { start: 1, end: 2 });
    // A head over another file finds only a stage of the wrong model.
    const other = await assertRejects(() => head(nc, stories, 3, 3000));
    assertStringIncludes((other as Error).message, "no stage announced layers 3-5");
    assertStringIncludes(
      (other as Error).message,
      `stage ${ann.id} serves model ${ann.model}, the head runs ${await modelIdentity(
        stories,
        CTX,
      )}`,
    );
    // An attach request naming other layers, and one that is not an attach request.
    const ask = async (body: unknown) =>
      JSON.parse(
        new TextDecoder().decode(
          (await nc.request(
            subjects.stage(ann.id),
            new TextEncoder().encode(JSON.stringify(body)),
            { timeout: 10_000 },
          )).data,
        ),
      );
    const wrongLayers = await ask({
      contextLength: CTX,
      type: "attach",
      model: ann.model,
      layers: { start: 0, end: 2 },
      kv: KV,
      limits: LIMITS,
    });
    assertEquals(wrongLayers, {
      type: "refused",
      message: `stage ${ann.id} runs layers 1-2, the head asked for 0-2`,
    });
    const junk = await ask({ type: "attach", model: ann.model });
    assertEquals(junk.type, "refused");
    assertStringIncludes(junk.message, "Invalid attach request: layers");
    // Bad frames on the link: garbage, a step before the hello, a hello with a wrong ticket.
    const conn = await Deno.connect({ hostname: ann.host, port: ann.port });
    const reader = new FrameReader(conn, 1 << 20);
    const answer = async (frame: Uint8Array) => {
      await writeFrame(conn, frame);
      return decodeFrame((await reader.next())!) as { type: string; message: string };
    };
    assertStringIncludes(
      (await answer(new Uint8Array([1, 2, 3]))).message,
      "Malformed frame of 3 bytes",
    );
    assertStringIncludes(
      (await answer(encodeFrame({ type: "step", plan: { stepId: 1, seqs: "x" } }))).message,
      "Invalid link message: plan.seqs",
    );
    assertStringIncludes(
      (await answer(encodeFrame({ type: "release", seqId: 1 }))).message,
      "a release before a hello with a valid ticket",
    );
    assertStringIncludes(
      (await answer(encodeFrame({ type: "hello", ticket: "not-the-ticket" }))).message,
      "the hello's ticket is not the one its last attach gave",
    );
    conn.close();
    // A head on the right model works; the stage killed, its steps fail naming the stage.
    const pp = await head(nc, llama, 1);
    const p = randomPrompts(2, 128000);
    const before = await runSteps(pp, p, 2, GREEDY);
    await stop(stage, "SIGKILL");
    const dead = await assertRejects(() => runSteps(pp, p, 2, GREEDY));
    assertStringIncludes((dead as Error).message, `stage ${ann.id}`);
    pp.dispose();
    // Restarted (a new process, a new id), a new head attaches and gets the same tokens.
    stage = spawnStage(nats.url, llama, "1-2");
    const again = await head(nc, llama, 1);
    assertEquals(await runSteps(again, p, 2, GREEDY), before);
    again.dispose();
    assert(true);
  } finally {
    await nc.close();
    await stop(stage);
    await nats.stop();
  }
});

Deno.test("with --memory-budget at 60% of the file, a stage of all layers is refused, naming its size, and PP 2 (each stage within it) gives one process's tokens and logits", async () => {
  const nats = await NatsServer.start();
  const path = compatPath("tinyllama-like-q4_k_m");
  const budget = Math.floor(0.6 * (await Deno.stat(path)).size);
  const flags = ["--memory-budget", String(budget)];
  const stages = [
    spawnStage(nats.url, path, "0-2", flags),
    spawnStage(nats.url, path, "1-2", flags),
  ];
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  try {
    // One process's worth: a stage of every layer, within the same budget.
    const alone = await assertRejects(async () =>
      attachStages(nc, {
        model: await modelIdentity(path, CTX),
        ranges: [{ start: 0, end: 2 }],
        kv: KV,
        limits: LIMITS,
        contextLength: CTX,
        timeoutMs: 60_000,
      })
    );
    assertStringIncludes((alone as Error).message, `layers 0-2 need`);
    assertStringIncludes((alone as Error).message, `more than the --memory-budget of ${budget}`);
    const whole = await loadModel(path, { contextLength: CTX });
    const single = await WasmEngine.create(whole.config, whole.weights, KV, {
      ...LIMITS,
      threads: 1,
    });
    const pp = await head(nc, path, 1);
    assertEquals(budgetProblem(pp.stages[0] as WasmEngine, budget), undefined);
    const p = randomPrompts(4, whole.config.vocabSize);
    assertEquals(await runSteps(pp, p, 4, GREEDY), await runSteps(single, p, 4, GREEDY));
    pp.dispose();
    single.dispose();
  } finally {
    await nc.close();
    await Promise.all(stages.map((st) => stop(st)));
    await nats.stop();
  }
});
