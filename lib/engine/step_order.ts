/**
 * The order steps enter an engine's links in (pipeline stages, tensor-parallel ranks), and the
 * token each sequence sampled last: a step enters after the one called before it, so a step
 * may be called before the last one ended, and a decode from the token sampled last waits only
 * for the step that samples it, which is then sent as a plain token.
 */
import type { SeqInput, StepPlan, StepResult } from "./engine.ts";
import type { StageLink } from "./stage_link.ts";

export class StepOrder {
  /** Per sequence, the token it sampled last (settles when the step that samples it ends). */
  readonly #last = new Map<number, Promise<number>>();
  #entry: Promise<unknown> = Promise.resolve();

  constructor(private readonly links: readonly StageLink[]) {}

  /** `send` of the plan with its tokens resolved, once the steps called before it entered. */
  enter<T>(plan: StepPlan, send: (p: StepPlan) => T): Promise<T> {
    // Taken now: the entries sampling() sets next are this step's own tokens, for the steps after it.
    const from = new Map(plan.seqs.map((s) => [s.seqId, this.#last.get(s.seqId)]));
    const entered = this.#entry.then(() => resolveTokens(plan, from)).then(send);
    this.#entry = entered.catch(() => {});
    return entered;
  }

  /** Keeps the tokens `result` samples as its sequences' last ones; returns `result`. */
  sampling(plan: StepPlan, result: Promise<StepResult>): Promise<StepResult> {
    for (const seq of plan.seqs) {
      if (!seq.sample) continue;
      const token = result.then((r) => r.sampled.find((s) => s.seqId === seq.seqId)!.token);
      token.catch(() => {}); // a failed step is reported by `result`; this copy is for the next
      this.#last.set(seq.seqId, token);
    }
    return result;
  }

  /** Releases the sequence on every link once the steps called before and its last one ended. */
  release(seqId: number): void {
    this.#entry = this.#entry.then(() => {
      const last = this.#last.get(seqId) ?? Promise.resolve();
      this.#last.delete(seqId);
      last.finally(() => this.links.forEach((l) => l.release?.(seqId))).catch(() => {});
    });
  }

  dispose(): void {
    for (const l of this.links) l.dispose();
    this.#last.clear();
  }
}

/** The plan with each `useLastSampled` input replaced by the token its sequence sampled. */
export async function resolveTokens(
  plan: StepPlan,
  last: ReadonlyMap<number, Promise<number> | undefined>,
): Promise<StepPlan> {
  if (!plan.seqs.some((s) => s.useLastSampled)) return plan;
  const seqs = await Promise.all(plan.seqs.map(async (s): Promise<SeqInput> => {
    if (!s.useLastSampled) return s;
    const token = last.get(s.seqId);
    if (token === undefined) {
      throw new Error(
        `Invalid step ${plan.stepId}: seq ${s.seqId} decodes from its last sampled token, but it has sampled none`,
      );
    }
    return { ...s, tokens: [await token], useLastSampled: false };
  }));
  return { ...plan, seqs };
}
