import {
  assert,
  assertAlmostEquals,
  assertEquals,
  assertNotEquals,
  assertThrows,
} from "@std/assert";
import { GREEDY, type SamplingParams } from "../lib/engine/engine.ts";
import { uniform } from "../lib/util/rng.ts";
import {
  argmax,
  candidateSet,
  isGreedyTemperature,
  logSoftmaxAt,
  MIN_TEMPERATURE,
  sample,
} from "../lib/engine/sampling.ts";

const params = (p: Partial<SamplingParams>): SamplingParams => ({
  temperature: 1,
  topK: 0,
  topP: 1,
  minP: 0,
  seed: 42,
  ...p,
});

// Logits whose softmax is exactly (up to f32 rounding) the probabilities 0.5, 0.2, 0.3.
const P3 = new Float32Array([Math.log(0.5), Math.log(0.2), Math.log(0.3)]);

function assertProbs(actual: number[], expected: number[]) {
  assertEquals(actual.length, expected.length, `probs ${actual} vs ${expected}`);
  actual.forEach((p, i) => assertAlmostEquals(p, expected[i]!, 1e-6));
}

Deno.test("argmax() picks the largest logit, lowest index on ties", () => {
  assertEquals(argmax([0.1, 2, -3, 2]), 1);
  assertEquals(argmax([5]), 0);
  assertEquals(argmax(new Float32Array([-1, -1, -1])), 0);
  assertThrows(() => argmax([]), Error, "empty");
});

Deno.test("logSoftmaxAt() equals hand-computed log-probabilities", () => {
  assertAlmostEquals(logSoftmaxAt([0, 0], 1), -Math.LN2, 1e-12);
  assertAlmostEquals(logSoftmaxAt([0, Math.log(3)], 1), Math.log(0.75), 1e-12);
  // Stable for large logits, where a naive exp overflows.
  assertAlmostEquals(logSoftmaxAt([1000, 1000 + Math.log(3)], 0), Math.log(0.25), 1e-9);
  assertThrows(() => logSoftmaxAt([0, 1], 2), Error, "index 2 is outside 0..1");
});

Deno.test("candidateSet() with temperature 0 keeps only the argmax", () => {
  assertEquals(candidateSet([1, 3, 3, 0], GREEDY), { ids: [1], probs: [1] });
  assertEquals(candidateSet([1, 3, 3, 0], params({ temperature: -1, topK: 3 })), {
    ids: [1],
    probs: [1],
  });
});

Deno.test("candidateSet() with no filters keeps every token by descending probability", () => {
  const c = candidateSet(P3, params({}));
  assertEquals(c.ids, [0, 2, 1]);
  assertProbs(c.probs, [0.5, 0.3, 0.2]);
});

Deno.test("candidateSet() top-k keeps the k highest, lower index first on ties", () => {
  const logits = [1, 3, 2, 3, 0];
  const two = candidateSet(logits, params({ topK: 2 }));
  assertEquals(two.ids, [1, 3]);
  assertProbs(two.probs, [0.5, 0.5]);
  const three = candidateSet(logits, params({ topK: 3 }));
  assertEquals(three.ids, [1, 3, 2]);
  const e = Math.E;
  assertProbs(three.probs, [e / (2 * e + 1), e / (2 * e + 1), 1 / (2 * e + 1)]);
  assertEquals(candidateSet(logits, params({ topK: 99 })).ids, [1, 3, 2, 0, 4]);
});

Deno.test("candidateSet() top-p keeps the smallest prefix reaching p", () => {
  assertEquals(candidateSet(P3, params({ topP: 0.4 })).ids, [0]);
  const two = candidateSet(P3, params({ topP: 0.6 }));
  assertEquals(two.ids, [0, 2]);
  assertProbs(two.probs, [0.5 / 0.8, 0.3 / 0.8]);
  assertEquals(candidateSet(P3, params({ topP: 0.79 })).ids, [0, 2]);
  assertEquals(candidateSet(P3, params({ topP: 0.81 })).ids, [0, 2, 1]);
  assertEquals(candidateSet(P3, params({ topP: 0 })).ids, [0]);
});

Deno.test("candidateSet() min-p drops tokens below minP times the top probability", () => {
  // Floors: 0.35 * 0.5 = 0.175 keeps all; 0.5 * 0.5 = 0.25 drops 0.2; 0.7 * 0.5 = 0.35 keeps 0.5 only.
  assertEquals(candidateSet(P3, params({ minP: 0.35 })).ids, [0, 2, 1]);
  const two = candidateSet(P3, params({ minP: 0.5 }));
  assertEquals(two.ids, [0, 2]);
  assertProbs(two.probs, [0.625, 0.375]);
  assertEquals(candidateSet(P3, params({ minP: 0.7 })).ids, [0]);
});

Deno.test("candidateSet() applies top-k, then top-p on the top-k softmax, then min-p", () => {
  // top-k 2 leaves 0.5 and 0.3, renormalised to 0.625 and 0.375.
  assertEquals(candidateSet(P3, params({ topK: 2, topP: 0.6 })).ids, [0]);
  assertEquals(candidateSet(P3, params({ topK: 2, topP: 0.7 })).ids, [0, 2]);
  assertEquals(candidateSet(P3, params({ topK: 2, topP: 1, minP: 0.61 })).ids, [0]);
});

Deno.test("candidateSet() scales logits by 1/temperature before the softmax", () => {
  const c = candidateSet(P3, params({ temperature: 2 }));
  // softmax(log p / 2) is proportional to sqrt(p).
  const s = [0.5, 0.3, 0.2].map(Math.sqrt);
  const total = s.reduce((a, b) => a + b);
  assertEquals(c.ids, [0, 2, 1]);
  assertProbs(c.probs, s.map((x) => x / total));
});

Deno.test("candidateSet() rejects out-of-range parameters with the received value", () => {
  assertThrows(
    () => candidateSet(P3, params({ topK: -1 })),
    Error,
    "topK must be a non-negative integer, received -1",
  );
  assertThrows(() => candidateSet(P3, params({ topK: 1.5 })), Error, "received 1.5");
  assertThrows(
    () => candidateSet(P3, params({ topP: 1.2 })),
    Error,
    "topP must be within [0, 1], received 1.2",
  );
  assertThrows(
    () => candidateSet(P3, params({ minP: -0.1 })),
    Error,
    "minP must be within [0, 1], received -0.1",
  );
  assertThrows(() => candidateSet(P3, params({ temperature: NaN })), Error, "temperature");
});

Deno.test("sample() with temperature 0 is argmax whatever the seed and position", () => {
  const logits = new Float32Array(64).map((_, i) => Math.sin(i * 7.3));
  const best = argmax(logits);
  for (let pos = 0; pos < 20; pos++) {
    assertEquals(sample(logits, { ...GREEDY, seed: pos * 31 }, pos).token, best);
  }
});

Deno.test("sample() with a temperature below MIN_TEMPERATURE (1e-38, 1e-320, 9.9e-6) is argmax, with the raw logprob", () => {
  // Positive and negative logits: logit / 1e-38 overflows f32 to +-Infinity, which is what made
  // the least likely token come out.
  const logits = new Float32Array([2.5, -20, 3.25, -1, 0.5, 3]);
  for (const temperature of [1e-38, 1e-320, 9.9e-6, MIN_TEMPERATURE / 2]) {
    for (let pos = 0; pos < 16; pos++) {
      const got = sample(logits, params({ temperature, seed: pos * 13 + 1 }), pos);
      assertEquals(got.token, 2, `temperature ${temperature}, position ${pos}`);
      assertAlmostEquals(got.logprob, logSoftmaxAt(logits, 2), 1e-12);
    }
  }
});

Deno.test("sample() at MIN_TEMPERATURE still samples: exact ties split between the tied tokens", () => {
  // With tied top logits only a sampler (not argmax) ever picks the second one.
  const tied = new Float32Array([1, 1, -5]);
  const picks = (temperature: number) =>
    new Set(
      Array.from({ length: 64 }, (_, pos) => sample(tied, params({ temperature }), pos).token),
    );
  assertEquals(picks(MIN_TEMPERATURE), new Set([0, 1]));
  assertEquals(picks(MIN_TEMPERATURE * 0.99), new Set([0]));
  assert(isGreedyTemperature(0) && isGreedyTemperature(-1) && isGreedyTemperature(1e-320));
  assert(!isGreedyTemperature(MIN_TEMPERATURE));
});

Deno.test("sample() walks the candidates by cumulative probability against uniform(seed, position)", () => {
  // After min-p 0.5 the set is [0 (0.625), 2 (0.375)].
  const p = params({ minP: 0.5, seed: 7 });
  let seen = 0;
  for (let pos = 0; pos < 200; pos++) {
    const expected = uniform(7, pos) < 0.625 ? 0 : 2;
    const { token } = sample(P3, p, pos);
    assertEquals(token, expected, `position ${pos}`);
    seen |= 1 << token;
  }
  assertEquals(seen, 0b101);
});

Deno.test("sample() reports the logprob under the raw logits, not the filtered distribution", () => {
  const { token, logprob } = sample(P3, params({ temperature: 0.5, topK: 2 }), 3);
  assertAlmostEquals(logprob, Math.log([0.5, 0.2, 0.3][token]!), 1e-6);
  assertAlmostEquals(sample(P3, GREEDY, 0).logprob, Math.log(0.5), 1e-6);
});

Deno.test("sample() is reproducible for a seed and differs between seeds", () => {
  const logits = new Float32Array(32).map((_, i) => Math.cos(i * 1.7));
  const run = (seed: number) =>
    Array.from(
      { length: 200 },
      (_, pos) => sample(logits, params({ seed, topP: 0.95 }), pos).token,
    );
  const a = run(1234);
  assertEquals(run(1234), a);
  const b = run(1235);
  assertNotEquals(b, a);
  // Not just a shift: the two seeds disagree at many positions.
  assert(a.filter((t, i) => t !== b[i]).length > 100);
});

Deno.test("sample() draw frequencies over many positions match the candidate probabilities", () => {
  const logits = new Float32Array([0.3, 2.0, -1, 1.2, 1.9, 0.8, -3, 1.5]);
  const p = params({ temperature: 0.8, topK: 6, topP: 0.97, minP: 0.05, seed: 99 });
  const { ids, probs } = candidateSet(logits, p);
  assert(ids.length >= 4 && ids.length < 8, `expected a filtered set, received ${ids}`);
  const draws = 40000;
  const counts = new Map<number, number>();
  for (let pos = 0; pos < draws; pos++) {
    const t = sample(logits, p, pos).token;
    counts.set(t, (counts.get(t) ?? 0) + 1);
  }
  for (const t of counts.keys()) assert(ids.includes(t), `drew ${t}, which is not a candidate`);
  let chi2 = 0;
  ids.forEach((id, j) => {
    const expected = probs[j]! * draws;
    chi2 += (((counts.get(id) ?? 0) - expected) ** 2) / expected;
  });
  // 99.9th percentile of chi-square with up to 6 degrees of freedom is 22.5.
  assert(chi2 < 22.5, `chi-square ${chi2.toFixed(2)} over ${ids.length} candidates`);
});
