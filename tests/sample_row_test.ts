/**
 * sampleRow() (the CPU engine's sampler, no full sort) against sample() (the reference's,
 * which sorts the vocabulary): the same token and logprob for every parameter mix, seed and
 * position, on logits shaped like a model's (a few likely tokens over a long flat tail).
 */
import { assertAlmostEquals, assertEquals } from "@std/assert";
import { sampleRow } from "../lib/engine/sample_row.ts";
import { sample } from "../lib/engine/sampling.ts";
import type { SamplingParams } from "../lib/engine/engine.ts";
import { rng } from "./_gpu.ts";

function logits(vocab: number, seed: number, spread: number): Float32Array {
  const rand = rng(seed);
  return Float32Array.from(
    { length: vocab },
    () => (rand() - 0.5) * spread + (rand() < 0.002 ? 8 : 0),
  );
}

const MIXES: Array<Omit<SamplingParams, "seed">> = [
  { temperature: 0, topK: 0, topP: 1, minP: 0 },
  { temperature: 1, topK: 0, topP: 1, minP: 0 },
  { temperature: 0.7, topK: 40, topP: 1, minP: 0 },
  { temperature: 1.3, topK: 0, topP: 0.9, minP: 0 },
  { temperature: 0.8, topK: 0, topP: 1, minP: 0.05 },
  { temperature: 1, topK: 50, topP: 0.95, minP: 0.01 },
  { temperature: 1, topK: 1, topP: 1, minP: 0 },
  { temperature: 2, topK: 0, topP: 1, minP: 1e-12 },
];

for (const [i, mix] of MIXES.entries()) {
  Deno.test(`sampleRow() draws what sample() draws: ${JSON.stringify(mix)}`, () => {
    for (let trial = 0; trial < 40; trial++) {
      // Flat logits put most of the mass in the sorted tail, peaked ones in a few tokens.
      const l = logits(4000, 100 * i + trial, trial % 2 === 0 ? 4 : 40);
      const p = { ...mix, seed: 7 + trial };
      const want = sample(l, p, trial);
      const got = sampleRow(l, p, trial);
      assertEquals(got.token, want.token, `trial ${trial}`);
      assertAlmostEquals(got.logprob, want.logprob, 1e-9);
    }
  });
}

Deno.test("sampleRow() refuses the parameters sample() refuses, with the same message", () => {
  const l = logits(100, 1, 4);
  for (const bad of [{ topP: 2 }, { minP: -1 }, { topK: -1 }, { temperature: NaN }]) {
    const p = { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1, ...bad };
    let a = "", b = "";
    try {
      sample(l, p, 0);
    } catch (e) {
      a = (e as Error).message;
    }
    try {
      sampleRow(l, p, 0);
    } catch (e) {
      b = (e as Error).message;
    }
    assertEquals(b, a);
  }
});
