/**
 * `deno task plan --calibrate`: measures what the planner's cost model needs of this machine,
 * in well under a minute, and writes it as a calibration file (lib/cluster/plan_calibration.ts):
 *
 * - one thread of the CPU engine decoding the model's file, at 1 and at 32 rows: steps that
 *   sample nothing give the layers' time (per layer: over their count), and the same steps
 *   sampling every row add the classifier's. Each step's time is the process's CPU time (its
 *   one worker and the host's work), which other processes' load leaves alike where wall time
 *   on a shared machine doubles; the variants alternate round by round, figures are medians;
 * - loopback NATS (a nats-server of its own on a free port): request/reply round trips of
 *   64 bytes give one message's cost (half a round trip), of 512 KiB its bytes'.
 */
import process from "node:process";
import { connect } from "@nats-io/transport-node";
import { loadModel } from "../model/load_model.ts";
import { WasmEngine } from "../../kernels/wasm/wasm_engine.ts";
import { wasmHeap } from "../../kernels/wasm/heap.ts";
import { placeInHeaps } from "../../kernels/wasm/tensor_placement.ts";
import { GREEDY, type SeqInput } from "../engine/engine.ts";
import { stepMatrixBytes } from "../model/weights.ts";
import { findNatsServer } from "./cluster.ts";
import type { Calibration } from "../cluster/plan_calibration.ts";

const ROWS = [1, 32] as const;
const ROUNDS = 5;
const SMALL_MESSAGE = 64, BIG_MESSAGE = 512 * 1024;

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** Seconds of steps of 1 and 32 rows, without and with the classifier, on one thread. */
async function timeEngine(path: string) {
  const heap = wasmHeap();
  const model = await loadModel(path, {
    allocate: (n) => heap.bytes(n, "the model's weights"),
    placeTensors: (tensors) => placeInHeaps(tensors),
  });
  const blocks = 1; // 16 positions per sequence: the steps stay at positions 0..ROUNDS
  const engine = await WasmEngine.create(
    model.config,
    model.weights,
    { numBlocks: 32 * blocks, blockSize: 16 },
    { threads: 1, maxSeqs: 32, maxBatchTokens: 64 },
  );
  try {
    const step = async (rows: number, sample: boolean, pos: number, id: number) => {
      const seqs: SeqInput[] = Array.from({ length: rows }, (_, i) => ({
        seqId: i,
        tokens: [(17 + 7 * i + pos) % model.config.vocabSize],
        startPos: pos,
        blockTable: [i],
        sample,
        sampling: GREEDY,
      }));
      const t0 = performance.now(), c0 = process.cpuUsage();
      await engine.step({ stepId: id, seqs });
      const c = process.cpuUsage(c0);
      return { wall: (performance.now() - t0) / 1000, cpu: (c.user + c.system) / 1e6 };
    };
    let id = 0;
    await step(32, false, 0, id++); // warm-up, and every sequence's position 0
    const times = new Map<string, { wall: number; cpu: number }[]>();
    for (let r = 0; r < ROUNDS; r++) {
      for (const rows of ROWS) {
        for (const sample of [false, true]) {
          const key = `${rows}${sample}`;
          times.set(key, [...(times.get(key) ?? []), await step(rows, sample, 1 + r, id++)]);
        }
      }
    }
    const of = (rows: number, sample: boolean, kind: "wall" | "cpu") =>
      median(times.get(`${rows}${sample}`)!.map((x) => x[kind]));
    const t = (rows: number, sample: boolean) => of(rows, sample, "cpu");
    const shown = (kind: "wall" | "cpu") =>
      ROWS.flatMap((rows) =>
        [false, true].map((sample) => `${(of(rows, sample, kind) * 1000).toPrecision(3)}`)
      ).join(" / ");
    const { nLayers } = model.config;
    const layerBytes = (stepMatrixBytes(model.weights) - byteLength(model.weights.output)) /
      nLayers;
    return {
      steps: `CPU time ${shown("cpu")} ms, wall ${shown("wall")} ms`,
      layerBytes,
      layerSeconds: { rows1: t(1, false) / nLayers, rows32: t(32, false) / nLayers },
      classifierBytes: byteLength(model.weights.output),
      classifierSeconds: {
        rows1: Math.max(1e-6, t(1, true) - t(1, false)),
        rows32: Math.max(1e-6, t(32, true) - t(32, false)),
      },
    };
  } finally {
    engine.dispose();
  }
}

function byteLength(t: { data: Uint8Array }): number {
  return t.data.byteLength;
}

/** One message's and one byte's one-way cost through a nats-server on loopback. */
async function timeNats(): Promise<Calibration["transport"]> {
  const bin = findNatsServer();
  if (bin === undefined) {
    throw new Error(
      "Cannot calibrate the transport: nats-server is not on PATH nor in the sbin folders (set NATS_SERVER)",
    );
  }
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = probe.addr.port;
  probe.close();
  const server = new Deno.Command(bin, {
    args: ["-a", "127.0.0.1", "-p", String(port)],
    stdout: "null",
    stderr: "null",
  }).spawn();
  try {
    const url = `nats://127.0.0.1:${port}`;
    let a;
    for (let i = 0;; i++) {
      try {
        a = await connect({ servers: url, name: "plan calibration a" });
        break;
      } catch (e) {
        if (i >= 50) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    const b = await connect({ servers: url, name: "plan calibration b" });
    b.subscribe("plan.echo", { callback: (_e, m) => void m.respond(new Uint8Array(0)) });
    await b.flush();
    const roundTrip = async (bytes: number, n: number) => {
      const payload = new Uint8Array(bytes);
      for (let i = 0; i < 5; i++) await a.request("plan.echo", payload, { timeout: 5000 });
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await a.request("plan.echo", payload, { timeout: 5000 });
      return (performance.now() - t0) / 1000 / n;
    };
    const small = [], big = [];
    for (let r = 0; r < ROUNDS; r++) {
      small.push(await roundTrip(SMALL_MESSAGE, 200));
      big.push(await roundTrip(BIG_MESSAGE, 20));
    }
    await a.close();
    await b.close();
    const rttSmall = median(small), rttBig = median(big);
    return {
      how:
        `request/reply through nats-server on 127.0.0.1: ${ROUNDS} alternating rounds of 200 round trips of ${SMALL_MESSAGE} B and 20 of ${BIG_MESSAGE} B, medians ${
          (rttSmall * 1e6).toFixed(0)
        } us and ${
          (rttBig * 1e6).toFixed(0)
        } us; a message is half a small round trip, a byte the difference over ${
          BIG_MESSAGE - SMALL_MESSAGE
        } B`,
      messageSeconds: rttSmall / 2,
      byteSeconds: Math.max(1e-12, (rttBig - rttSmall) / (BIG_MESSAGE - SMALL_MESSAGE)),
    };
  } finally {
    server.kill("SIGTERM");
    await server.status;
  }
}

function machine(): string {
  let cpu = "unknown CPU";
  try {
    cpu = /model name\s*:\s*(.*)/.exec(Deno.readTextFileSync("/proc/cpuinfo"))?.[1] ?? cpu;
  } catch { /* not Linux */ }
  const load = Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
  return `${cpu}, ${navigator.hardwareConcurrency} cores, load average ${load} at the start`;
}

/** Measures this machine on `modelPath` and writes the calibration to `out`. */
export async function calibrate(modelPath: string, out: string): Promise<Calibration> {
  const where = machine();
  const started = performance.now();
  const { steps, ...engine } = await timeEngine(modelPath);
  const transport = await timeNats();
  const cal: Calibration = {
    how: `deno task plan --calibrate --model ${
      modelPath.split("/").pop()
    }: the CPU engine on 1 thread, ${ROUNDS} alternating rounds of decode steps of 1 and 32 rows (one token per sequence at positions 1-${ROUNDS}), sampling none (the layers: over their count) and all (the classifier: the difference). The process's CPU time per step, which other processes' load leaves alike, where wall time on a shared machine is not; medians (1 row, 1 sampled, 32, 32 sampled): ${steps}; ${
      ((performance.now() - started) / 1000).toFixed(0)
    } s in all with loading`,
    machine: where,
    measuredAt: new Date().toISOString(),
    model: modelPath.split("/").pop() ?? modelPath,
    ...engine,
    transport,
  };
  await Deno.writeTextFile(out, JSON.stringify(cal, null, 2) + "\n");
  console.error(`wrote the calibration to ${out}`);
  return cal;
}
