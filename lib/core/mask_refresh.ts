import { allowsOnly, tokenMaskProblem } from "../engine/token_mask.ts";
import type { Sequence } from "./sequence.ts";

/** How a constrained sequence's mask refresh ended it, if it did. */
export type MaskOutcome = { readonly stop: true } | { readonly error: string };

/**
 * The constrained sequences whose next token mask is to be computed: every one whose grammar
 * has seen a new token (or none yet). A sequence cannot sample until its mask is known.
 */
export class MaskQueue {
  #need: Sequence[] = [];

  /** Whether constrained sequences wait for their next mask. */
  get pending(): boolean {
    return this.#need.length > 0;
  }

  push(seq: Sequence): void {
    this.#need.push(seq);
  }

  /**
   * Computes the queued masks. A sequence whose grammar allows nothing but its end is handed
   * to `end` with "stop" (the output is complete); one whose grammar fails, with the error.
   * Asynchronous because XGrammar's mask call is; the caller must not let anything else touch
   * the sequences meanwhile, except cancels (a sequence that ended during the await is skipped).
   */
  async refresh(vocabSize: number, end: (seq: Sequence, outcome: MaskOutcome) => void) {
    while (this.#need.length > 0) {
      const seqs = [...new Set(this.#need)].filter((seq) =>
        seq.status !== "finished" && seq.constraint && !seq.mask
      );
      this.#need = [];
      // Asked for all at once: the grammar thread answers them in one round trip.
      const masks = await Promise.allSettled(seqs.map((seq) => seq.constraint!.nextMask()));
      for (let i = 0; i < seqs.length; i++) {
        const seq = seqs[i]!, got = masks[i]!;
        if (!seq.constraint) continue;
        if (got.status === "rejected") {
          const e = got.reason;
          if (!ended(seq)) {
            end(seq, {
              error: `Generation failed: the grammar could not give the next tokens (${
                e instanceof Error ? e.message : e
              })`,
            });
          }
          continue;
        }
        const mask = got.value;
        // Cancelled while its mask was computed (the await let other work run).
        if (ended(seq)) continue;
        if (
          tokenMaskProblem(mask, vocabSize) || allowsOnly(mask, seq.constraint.stopIds, vocabSize)
        ) {
          end(seq, { stop: true });
        } else {
          seq.mask = mask;
          // A step in flight already feeds the token this mask follows: it samples under it.
          seq.late?.resolve(mask);
          seq.late = undefined;
        }
      }
    }
  }
}

/** Read through a call: TypeScript narrows a field as if no await could change it. */
function ended(seq: Sequence): boolean {
  return seq.status === "finished";
}
