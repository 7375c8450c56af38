/**
 * Driving an engine the way the scheduler does, for the tests that hold a split engine (pipeline
 * stages, tensor-parallel ranks, in one process or over links) to the one-process engine's logits.
 */
import type { Engine, SamplingParams, SeqInput } from "../../lib/engine/engine.ts";
import { seededRandom } from "../../lib/util/seeded_random.ts";

/** Seeded sampling that exercises top-k, top-p and the RNG. */
export const SEEDED: SamplingParams = { temperature: 0.9, topK: 40, topP: 0.95, minP: 0, seed: 11 };

/** A float array's bit patterns, so equal means bit for bit (NaN and −0 included). */
export const bits = (a: Float32Array) =>
  Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));

/**
 * `prompts` prefilled together, then `steps - 1` decodes from the token each sampled last
 * (useLastSampled); the logits and tokens of every prompt at every step. Sequence i uses KV
 * blocks 2i and 2i + 1.
 */
export async function runSteps(
  engine: Engine,
  prompts: number[][],
  steps: number,
  sampling: SamplingParams,
) {
  const logits = prompts.map(() => [] as number[][]);
  const tokens = prompts.map(() => [] as number[]);
  const inFlight: Promise<unknown>[] = [];
  for (let step = 0; step < steps; step++) {
    const seqs: SeqInput[] = prompts.map((p, i) => ({
      seqId: i,
      tokens: step === 0 ? p : [],
      ...(step === 0 ? {} : { useLastSampled: true }),
      startPos: step === 0 ? 0 : p.length + step - 1,
      blockTable: [2 * i, 2 * i + 1],
      sample: true,
      sampling,
    }));
    // Called before the step before ended, as the scheduler's pipelining does.
    inFlight.push(
      engine.step({ stepId: step, seqs, returnLogits: true }).then((r) =>
        r.sampled.forEach((s, i) => {
          logits[i]![step] = bits(s.logits!);
          tokens[i]![step] = s.token;
        })
      ),
    );
  }
  await Promise.all(inFlight);
  prompts.forEach((_, i) => engine.release?.(i));
  return { logits, tokens };
}

/** `n` prompts of 2-13 random token ids below `vocab`, seeded by `n`. */
export function randomPrompts(n: number, vocab: number): number[][] {
  const rand = seededRandom(n);
  return Array.from(
    { length: n },
    () => Array.from({ length: 2 + Math.floor(rand() * 12) }, () => Math.floor(rand() * vocab)),
  );
}
