/**
 * Tensor-parallel ranks over the stage links: the head is rank 0 (its own CPU engine, gathering
 * as the hub), the other ranks are stages (startStage) on a real nats-server, each gather a
 * frame each way on the direct TCP link. Exactness against one process.
 */
import { assertEquals, assertRejects, assertStringIncludes } from "@std/assert";
import { NatsServer } from "./_cluster.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { tpShard } from "../kernels/wasm/tp_shard.ts";
import { TensorParallelEngine } from "../lib/engine/tensor_parallel_engine.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { connectNats, type NatsConnection } from "../lib/cluster/nats_connection.ts";
import { attachStages } from "../lib/cluster/stage_client.ts";
import { type RunningStage, startStage } from "../lib/cluster/stage_server.ts";
import { modelIdentity } from "../lib/cluster/model_identity.ts";
import { HubGather } from "../lib/cluster/tp_link.ts";
import { subjects } from "../lib/cluster/subjects.ts";
import { decodeFrame, encodeFrame } from "../lib/cluster/binary_frame.ts";
import { FrameReader, writeFrame } from "../lib/cluster/frame_stream.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";
import { randomPrompts, runSteps, SEEDED } from "./harness/engine_steps.ts";

const KV = { numBlocks: 48, blockSize: 16 };
const LIMITS = { maxBatchTokens: 256, maxSeqs: 16 };
const CTX = 512;
/** `main.ts stage --tp-rank rank/size` as its own process; its stderr is read by the caller. */
function spawnRank(nats: string, model: string, rank: string): Deno.ChildProcess {
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
      "--tp-rank",
      rank,
      "--threads",
      "1",
      "--context-length",
      String(CTX),
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
}

/** TP `size` over `path`: rank 0 here, ranks 1.. attached over NATS and their links. */
async function head(nc: NatsConnection, path: string, size: number, timeoutMs = 30_000) {
  const m = await loadModel(path, { contextLength: CTX });
  const hub = new HubGather();
  const local = await WasmEngine.create(m.config, m.weights, KV, {
    ...LIMITS,
    threads: 1,
    tensorParallel: { shard: tpShard(m.config, 0, size), exchange: hub },
  });
  const remote = await attachStages(nc, {
    model: await modelIdentity(path, CTX),
    ranges: [{ start: 0, end: m.config.nLayers }],
    tpSize: size,
    kv: KV,
    limits: LIMITS,
    contextLength: CTX,
    timeoutMs,
  }).catch((e) => {
    local.dispose();
    throw e;
  });
  hub.attach(remote);
  return new TensorParallelEngine(m.config, KV, [local, ...remote], LIMITS, (e) => hub.fail(e));
}

Deno.test("TP over stage links on a real nats-server gives the one-process logits bit for bit and its tokens, greedy and seeded, at 1 and 16 sequences (stories260K TP 2 and 3, llama3-like TP 2)", async () => {
  const nats = await NatsServer.start();
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  const cases = [
    { path: modelFile("stories260K.gguf"), size: 2 },
    { path: modelFile("stories260K.gguf"), size: 3 },
    { path: compatPath("llama3-like-q4_k_m"), size: 2 },
  ];
  try {
    for (const { path, size } of cases) {
      const stages: RunningStage[] = [];
      for (let rank = 1; rank < size; rank++) {
        stages.push(
          await startStage(nc, {
            modelPath: path,
            tensorParallel: { rank, size },
            contextLength: CTX,
            threads: 1,
          }),
        );
      }
      const whole = await loadModel(path, { contextLength: CTX });
      const single = await WasmEngine.create(whole.config, whole.weights, KV, {
        ...LIMITS,
        threads: 1,
      });
      const tp = await head(nc, path, size);
      for (const n of [1, 16]) {
        for (const sampling of [GREEDY, SEEDED]) {
          const p = randomPrompts(n, whole.config.vocabSize);
          const want = await runSteps(single, p, 4, sampling);
          const got = await runSteps(tp, p, 4, sampling);
          const what = `${path} TP ${size}, ${n} seqs, temperature ${sampling.temperature}`;
          assertEquals(got.tokens, want.tokens, what);
          assertEquals(got.logits, want.logits, what);
        }
      }
      tp.dispose();
      single.dispose();
      for (const s of stages) await s.close();
    }
  } finally {
    await nc.close();
    await nats.stop();
  }
});

Deno.test("TP 2 with rank 1 as a real `stage --tp-rank 1/2` process gives the one-process logits bit for bit and its tokens at 1 and 16 sequences (llama3-like, qwen2-like); a rank 0 or a size the KV heads cannot take is refused at start", async () => {
  const nats = await NatsServer.start();
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  const files = [compatPath("llama3-like-q4_k_m"), compatPath("qwen2-like-q4_k_m")];
  const ranks = files.map((f) => spawnRank(nats.url, f, "1/2"));
  try {
    for (const path of files) {
      const whole = await loadModel(path, { contextLength: CTX });
      const single = await WasmEngine.create(whole.config, whole.weights, KV, {
        ...LIMITS,
        threads: 1,
      });
      const tp = await head(nc, path, 2);
      for (const n of [1, 16]) {
        for (const sampling of [GREEDY, SEEDED]) {
          const p = randomPrompts(n, whole.config.vocabSize);
          const want = await runSteps(single, p, 4, sampling);
          const got = await runSteps(tp, p, 4, sampling);
          const what =
            `${path} TP 2 across processes, ${n} seqs, temperature ${sampling.temperature}`;
          assertEquals(got.tokens, want.tokens, what);
          assertEquals(got.logits, want.logits, what);
        }
      }
      tp.dispose();
      single.dispose();
    }
    // llama3-like has 1 KV head and 4 query heads: TP 3 does not divide them.
    for (
      const [rank, want] of [["0/2", "rank 0 is the head"], [
        "1/3",
        "Invalid tensor-parallel size 3",
      ]]
    ) {
      const bad = spawnRank(nats.url, files[0]!, rank!);
      const { code, stderr } = await bad.output();
      assertEquals(code !== 0, true, rank);
      assertStringIncludes(new TextDecoder().decode(stderr), want!);
    }
  } finally {
    await nc.close();
    for (const r of ranks) {
      r.kill("SIGTERM");
      await r.status;
      await r.stderr.cancel();
    }
    await nats.stop();
  }
});

Deno.test("a head wanting another TP size finds no rank, naming the one announced; a rank refuses an attach for another rank and answers a gather of the wrong size with an error", async () => {
  const nats = await NatsServer.start();
  const nc = await connectNats({ url: nats.url, name: "test-head" });
  const path = modelFile("stories260K.gguf");
  const stage = await startStage(nc, {
    modelPath: path,
    tensorParallel: { rank: 1, size: 2 },
    contextLength: CTX,
    threads: 1,
  });
  const ann = stage.announcement;
  try {
    assertEquals([ann.tp, ann.layers], [{ rank: 1, size: 2 }, { start: 0, end: 5 }]);
    const wrongSize = await assertRejects(() => head(nc, path, 3, 3000));
    assertStringIncludes(
      (wrongSize as Error).message,
      "no stage announced layers 0-5 as tensor-parallel rank 1 of 3, 0-5 as tensor-parallel rank 2 of 3",
    );
    assertStringIncludes(
      (wrongSize as Error).message,
      `stage ${ann.id} advertises layers 0-5 as tensor-parallel rank 1 of 2, which the head does not want`,
    );
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
    const attach = {
      type: "attach",
      model: ann.model,
      layers: ann.layers,
      kv: KV,
      limits: LIMITS,
      contextLength: CTX,
    };
    assertEquals(await ask(attach), {
      type: "refused",
      message:
        `stage ${ann.id} is tensor-parallel rank 1 of 2, the head asked for no tensor-parallel rank`,
    });
    assertEquals(await ask({ ...attach, tp: { rank: 2, size: 3 } }), {
      type: "refused",
      message:
        `stage ${ann.id} is tensor-parallel rank 1 of 2, the head asked for tensor-parallel rank 2 of 3`,
    });
    const ok = await ask({ ...attach, tp: { rank: 1, size: 2 } });
    assertEquals(ok.type, "attached");
    const conn = await Deno.connect({ hostname: ann.host, port: ann.port });
    const reader = new FrameReader(conn, 1 << 20);
    const answer = async (frame: unknown) => {
      await writeFrame(conn, encodeFrame(frame));
      return decodeFrame((await reader.next())!) as { type: string; message?: string };
    };
    assertEquals((await answer({ type: "hello", ticket: ok.ticket })).type, "welcome");
    const three = [new Float32Array(1), new Float32Array(0), new Float32Array(1)];
    assertStringIncludes(
      (await answer({ type: "gather", parts: three })).message!,
      "expected the columns of 2 ranks, received 3",
    );
    conn.close();
  } finally {
    await stage.close();
    await nc.close();
    await nats.stop();
  }
});
