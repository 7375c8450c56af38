import type { SampleResult } from "../../lib/engine/sampling.ts";
import { checkParams, logSoftmaxAt } from "../../lib/engine/sampling.ts";
import { sampleRow } from "../../lib/engine/sample_row.ts";
import type { SamplingParams } from "../../lib/engine/engine.ts";
import { maskedArgmax, maskLogits } from "../../lib/engine/token_mask.ts";

/**
 * A constrained row: sampleRow over the row with every masked logit at -Infinity (a greedy row
 * is the allowed argmax, one pass), and the token's logprob under the raw row, from the
 * threads' row statistics where they hold (no NaN, a finite largest logit).
 */
export function sampleMaskedRow(
  row: Float32Array,
  p: SamplingParams,
  position: number,
  mask: Uint32Array,
  greedy: boolean,
  stats: Int32Array,
  statsF: Float32Array,
  r: number,
): SampleResult {
  checkParams(p, row.length);
  const token = greedy
    ? maskedArgmax(row, mask)
    : sampleRow(maskLogits(row, mask), p, position).token;
  const logprob = stats[r * 4 + 3] === 0
    ? row[token]! - statsF[r * 4 + 1]! - Math.log(statsF[r * 4 + 2]!)
    : logSoftmaxAt(row, token);
  return { token, logprob };
}
