import { assert, assertEquals } from "@std/assert";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import type { Model } from "../lib/model/weights.ts";
import { modelFile } from "./harness/model_files.ts";

const KV = { numBlocks: 32, blockSize: 16 };

/** run.c's prompt and greedy continuation for "Once upon a time" (see fixtures/run_c/README.md). */
function runC(name: string): { prompt: number[]; generated: number[] } {
  const lines = Deno.readTextFileSync(new URL(`./fixtures/run_c/${name}.ids.txt`, import.meta.url))
    .trim().split("\n").map((l) => l.split(" ").slice(1).map(Number));
  return { prompt: lines[0]!, generated: lines[1]! };
}

/** Logits at every position, feeding one token per step. */
async function logitsPerPosition(model: Model, ids: number[]): Promise<Float32Array[]> {
  const engine = new CpuEngine(model.config, model.weights, KV);
  const table = Array.from({ length: KV.numBlocks }, (_, i) => i);
  const out: Float32Array[] = [];
  for (const [pos, token] of ids.entries()) {
    const r = await engine.step({
      stepId: pos,
      returnLogits: true,
      seqs: [{
        seqId: 0,
        tokens: [token],
        startPos: pos,
        blockTable: table,
        sample: true,
        sampling: GREEDY,
      }],
    });
    out.push(r.sampled[0]!.logits!);
  }
  return out;
}

Deno.test("CpuEngine gives the same logits from the F32 GGUF as from the llama2.c checkpoint at every position of a 64-token run", async () => {
  const { prompt, generated } = runC("once_upon_a_time_n64");
  const ids = [...prompt, ...generated].slice(0, 64);
  const bin = await logitsPerPosition(await loadModel(modelFile("stories260K.bin")), ids);
  const gguf = await logitsPerPosition(await loadModel(modelFile("stories260K.gguf")), ids);
  let worst = 0;
  bin.forEach((b, pos) => {
    let diff = 0;
    let mag = 0;
    b.forEach((v, i) => {
      diff = Math.max(diff, Math.abs(v - gguf[pos]![i]!));
      mag = Math.max(mag, Math.abs(v));
    });
    worst = Math.max(worst, diff / mag);
  });
  assert(worst < 1e-4, `largest relative logit difference ${worst}`);
});

Deno.test("CpuEngine on the F32 GGUF reproduces run.c's greedy tokens", async () => {
  const { prompt, generated } = runC("once_upon_a_time_n64");
  const m = await loadModel(modelFile("stories260K.gguf"));
  const { tokens } = await referenceGenerate(
    new CpuEngine(m.config, m.weights, KV),
    prompt,
    generated.length,
    GREEDY,
  );
  assertEquals(tokens, generated);
});

Deno.test("CpuEngine on the Q8_0 GGUF gives run.c's first 20 greedy tokens", async () => {
  const { prompt, generated } = runC("once_upon_a_time_n64");
  const m = await loadModel(modelFile("stories260K-q8_0.gguf"));
  const { tokens } = await referenceGenerate(
    new CpuEngine(m.config, m.weights, KV),
    prompt,
    20,
    GREEDY,
  );
  assertEquals(tokens, generated.slice(0, 20));
});
