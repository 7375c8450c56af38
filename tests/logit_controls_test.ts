import { assertEquals } from "@std/assert";
import {
  historyDependent,
  type LogitControls,
  logitControlsProblem,
  PenaltyState,
} from "../lib/core/logit_controls.ts";
import { SUPPRESS_BIAS } from "../lib/engine/logit_adjust.ts";

/** An adjustment as [id, bias, penalty, subtract] rows, for comparing with hand-made ones. */
function rows(s: PenaltyState, position: number): number[][] {
  const a = s.adjust(position);
  if (a === undefined) return [];
  return [...a.ids].map((id, i) => [id, a.bias[i]!, a.penalty[i]!, a.subtract[i]!]);
}

const ALL: LogitControls = {
  logitBias: [[3, -100]],
  presencePenalty: 0.25,
  frequencyPenalty: 0.5,
  repetitionPenalty: 2,
};

Deno.test("PenaltyState: repetition over prompt and output, presence and frequency over the output only, bias as given", () => {
  // Prompt [0, 1], output [2, 2, 0]. Hand-counted: the window (all five) holds 0, 1 and 2;
  // the output holds 2 twice and 0 once, so 0 loses 0.5 + 0.25, 2 loses 2 * 0.5 + 0.25, and
  // prompt-only token 1 loses nothing (OpenAI's penalties count generated tokens).
  const s = new PenaltyState(ALL, [0, 1, 2, 2, 0], 2, []);
  assertEquals(rows(s, 5), [
    [0, 0, 2, 0.75],
    [1, 0, 2, 0],
    [2, 0, 2, 1.25],
    [3, -100, 1, 0],
  ]);
});

Deno.test("PenaltyState: repeatLastN keeps only the last n tokens in the repetition window", () => {
  const s = new PenaltyState({ repetitionPenalty: 1.5, repeatLastN: 2 }, [0, 1, 2, 2, 0], 2, []);
  assertEquals(rows(s, 5), [[0, 0, 1.5, 0], [2, 0, 1.5, 0]]);
  s.push(4); // window [0, 4]
  assertEquals(rows(s, 6), [[0, 0, 1.5, 0], [4, 0, 1.5, 0]]);
});

Deno.test("PenaltyState pushed token by token equals one rebuilt from the tokens (what preemption and failover rely on)", () => {
  const tokens = [5, 1, 5, 9, 9, 9, 2, 5, 1, 0, 7, 7];
  const live = new PenaltyState({ ...ALL, repeatLastN: 4 }, tokens.slice(0, 3), 3, [7]);
  for (const t of tokens.slice(3)) live.push(t);
  const rebuilt = new PenaltyState({ ...ALL, repeatLastN: 4 }, tokens, 3, [7]);
  assertEquals(rows(live, tokens.length), rows(rebuilt, tokens.length));
});

Deno.test("PenaltyState: min_tokens suppresses the stop ids until that many tokens were generated", () => {
  const s = new PenaltyState({ minTokens: 2 }, [4, 4], 2, [1, 6]);
  assertEquals(
    rows(s, 2),
    [[1, SUPPRESS_BIAS, 1, 0], [6, SUPPRESS_BIAS, 1, 0]].map((r) => r.map(Math.fround)),
  );
  assertEquals(rows(s, 3).length, 2);
  assertEquals(rows(s, 4), [], "the third generated token may stop");
  // Output counted from `outputStart`: a resubmitted prompt whose last id was generated.
  const resumed = new PenaltyState({ minTokens: 2 }, [4, 4, 8], 2, [1]);
  assertEquals(rows(resumed, 3).length, 1);
  assertEquals(rows(resumed, 4), []);
});

Deno.test("historyDependent() is true exactly for the penalties that count tokens", () => {
  assertEquals(historyDependent({ logitBias: [[1, 5]], minTokens: 3 }), false);
  assertEquals(historyDependent({ repetitionPenalty: 1 }), false);
  assertEquals(historyDependent({ repetitionPenalty: 1.2, repeatLastN: 0 }), false);
  assertEquals(historyDependent({ repetitionPenalty: 1.2 }), true);
  assertEquals(historyDependent({ presencePenalty: -0.5 }), true);
  assertEquals(historyDependent({ frequencyPenalty: 0.1 }), true);
});

Deno.test("logitControlsProblem() names what would fail a shared step", () => {
  assertEquals(logitControlsProblem(ALL, 8), undefined);
  assertEquals(
    logitControlsProblem({ logitBias: [[8, 1]] }, 8),
    "logit bias token id 8 is outside the vocabulary of 8 ids",
  );
  assertEquals(
    logitControlsProblem({ logitBias: [[1, 1], [1, 2]] }, 8),
    "logit bias lists token id 1 twice",
  );
  assertEquals(
    logitControlsProblem({ repetitionPenalty: 0 }, 8),
    "the repetition penalty is 0: expected a number >= 0.000001",
  );
  assertEquals(
    logitControlsProblem({ presencePenalty: NaN }, 8),
    "the presence penalty is NaN: expected a finite number",
  );
  // What the engine would see: an f32, where 1e-300 is 0 and 1e39 infinite.
  assertEquals(
    logitControlsProblem({ repetitionPenalty: 1e-300 }, 8),
    "the repetition penalty is 1e-300: expected a number >= 0.000001 as a 32-bit float, the " +
      "precision the engine computes in (1e-300 rounds to 0)",
  );
  // Above 0 as an f32, but a logit divided by it overflows.
  assertEquals(
    logitControlsProblem({ repetitionPenalty: 1e-40 }, 8)?.startsWith(
      "the repetition penalty is 1e-40: expected a number >= 0.000001",
    ),
    true,
  );
  assertEquals(
    logitControlsProblem({ logitBias: [[1, 1e39]] }, 8),
    "logit bias of token 1 is 1e+39: expected a finite number as a 32-bit float, the precision " +
      "the engine computes in (1e+39 rounds to Infinity)",
  );
});
