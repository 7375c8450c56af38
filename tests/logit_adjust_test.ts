import { assertAlmostEquals, assertEquals, assertThrows } from "@std/assert";
import {
  adjustLogit,
  applyLogitAdjust,
  type LogitAdjust,
  logitAdjustProblem,
  SUPPRESS_BIAS,
} from "../lib/engine/logit_adjust.ts";
import { sample } from "../lib/engine/sampling.ts";
import { sampleRow } from "../lib/engine/sample_row.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { validateStep } from "../lib/engine/step_validation.ts";
import type { ModelConfig } from "../lib/model/model_config.ts";

function adj(entries: [number, number, number, number][]): LogitAdjust {
  return {
    ids: Int32Array.from(entries.map((e) => e[0])),
    bias: Float32Array.from(entries.map((e) => e[1])),
    penalty: Float32Array.from(entries.map((e) => e[2])),
    subtract: Float32Array.from(entries.map((e) => e[3])),
  };
}

Deno.test("adjustLogit() adds the bias, then divides a positive logit or multiplies a negative one by the penalty, then subtracts", () => {
  // Hand-computed: (2 + 0) / 2 - 0.75 = 0.25; (-1) * 2 = -2; (0.5 + 1) / 3 - 0 = 0.5;
  // (3 - 100) * 2 = -194 (the bias makes it negative first: llama.cpp's and vLLM's order).
  assertEquals(adjustLogit(2, 0, 2, 0.75), 0.25);
  assertEquals(adjustLogit(-1, 0, 2, 0), -2);
  assertEquals(adjustLogit(0.5, 1, 3, 0), 0.5);
  assertEquals(adjustLogit(3, -100, 2, 0), -194);
  // Zero is "not positive": multiplied, as both define it (logit <= 0).
  assertEquals(adjustLogit(0, 0, 2, 1), -1);
});

Deno.test("applyLogitAdjust() changes only the listed tokens, on a copy", () => {
  const logits = new Float32Array([2, -1, 0.5, 3]);
  const out = applyLogitAdjust(logits, adj([[3, -100, 1, 0], [0, 0, 2, 0.75]]));
  assertEquals([...out], [0.25, -1, 0.5, -97]);
  assertEquals([...logits], [2, -1, 0.5, 3], "the input is left as it was");
  assertEquals(applyLogitAdjust(logits, undefined), logits);
});

Deno.test("a -100 bias bans the most likely token for greedy and sampled draws, and the logprob is over the adjusted row", () => {
  const logits = new Float32Array([2, -1, 0.5, 3]);
  const a = adj([[3, -100, 1, 0]]);
  const row = applyLogitAdjust(logits, a);
  assertEquals(sample(logits, GREEDY, 0).token, 3);
  assertEquals(sample(row, GREEDY, 0).token, 0);
  // logprob of 0 over [2, -1, 0.5, -97]: 2 - log(e^2 + e^-1 + e^0.5 + e^-97).
  const want = 2 - Math.log(Math.exp(2) + Math.exp(-1) + Math.exp(0.5) + Math.exp(-97));
  assertAlmostEquals(sample(row, GREEDY, 0).logprob, want, 1e-6);
  for (let pos = 0; pos < 200; pos++) {
    const p = { temperature: 1.5, topK: 0, topP: 1, minP: 0, seed: 9 };
    assertEquals(sample(row, p, pos).token !== 3, true, `position ${pos}`);
    assertEquals(sampleRow(row, p, pos), sample(row, p, pos));
  }
});

Deno.test("SUPPRESS_BIAS takes a token out of the draw at any temperature without an infinity", () => {
  const logits = new Float32Array([5, 0, 0]);
  const row = applyLogitAdjust(logits, adj([[0, SUPPRESS_BIAS, 1, 0]]));
  assertEquals(Number.isFinite(row[0]!), true);
  for (const temperature of [1e-5, 0.3, 2]) {
    for (let pos = 0; pos < 50; pos++) {
      const p = { temperature, topK: 0, topP: 1, minP: 0, seed: 3 };
      assertEquals(sample(row, p, pos).token === 0, false);
      assertEquals(Number.isFinite(row[0]! / temperature), true);
    }
  }
});

Deno.test("logitAdjustProblem() names an id outside the vocabulary, a repeated id, a penalty <= 0 and ragged arrays", () => {
  assertEquals(logitAdjustProblem(adj([[1, 1, 1, 0]]), 4), undefined);
  assertEquals(logitAdjustProblem(adj([[4, 1, 1, 0]]), 4), "token id 4 is outside 0..3");
  assertEquals(
    logitAdjustProblem(adj([[1, 1, 1, 0], [1, 0, 1, 0]]), 4),
    "token id 1 is listed twice",
  );
  assertEquals(logitAdjustProblem(adj([[1, 0, 0, 0]]), 4), "the penalty of token 1 is 0, not > 0");
  const ragged = { ...adj([[1, 0, 1, 0]]), bias: new Float32Array(2) };
  assertEquals(
    logitAdjustProblem(ragged, 4),
    "its arrays differ in length (ids 1, bias 2, penalty 1, subtract 1)",
  );
});

Deno.test("validateStep() refuses a plan whose adjustment names a token outside the vocabulary", () => {
  const config = { vocabSize: 8, contextLength: 64 } as ModelConfig;
  assertThrows(
    () =>
      validateStep({
        stepId: 3,
        seqs: [{
          seqId: 1,
          tokens: [1],
          startPos: 0,
          blockTable: [0],
          sample: true,
          sampling: GREEDY,
          adjust: adj([[8, 1, 1, 0]]),
        }],
      }, { config, kv: { numBlocks: 4, blockSize: 16 }, hasLastSampled: () => false }),
    Error,
    "Cannot run step 3: sequence 1 has a bad logit adjustment: token id 8 is outside 0..7",
  );
});
