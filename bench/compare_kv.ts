/**
 * Paged KV against contiguous reservations in the same KV memory. The paged side is measured:
 * a burst of requests through the serving core, every step's block tables inspected (tokens
 * held against the slots of the blocks held). The contiguous sides are what the same
 * sequences would have needed: a max-context reservation per sequence (the classic
 * pre-allocated cache), or prompt + max_tokens per sequence (the best a contiguous allocator
 * can do without paging).
 */
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { type BenchModel, makeCore, promptIds, timedGeneration } from "./compare_common.ts";
import { fmt, pct, ratio, table } from "./stats.ts";
import { drawLength, type LengthDist, seededRandom, storyWords } from "./workload.ts";

export interface KvOptions {
  readonly requests: number;
  /** KV memory, in max-context sequences (contextLength tokens each). */
  readonly memorySequences: number;
  readonly blockSize: number;
  readonly promptTokens: LengthDist;
  readonly outputTokens: LengthDist;
  readonly seed: number;
  readonly backend: BackendChoice;
}

export interface KvResult {
  readonly options: KvOptions;
  readonly kvTokens: number;
  readonly contextLength: number;
  readonly contiguousMaxFit: number;
  readonly contiguousMaxUtilisation: number;
  readonly contiguousExactFit: number;
  readonly contiguousExactUtilisation: number;
  readonly pagedPeakSequences: number;
  readonly pagedMeanSequences: number;
  readonly pagedUtilisation: number;
  readonly preemptions: number;
  readonly outputTokensPerSecond: number;
  readonly markdown: string;
}

export async function compareKv(bm: BenchModel, o: KvOptions): Promise<KvResult> {
  const ctx = bm.model.config.contextLength;
  const kvTokens = o.memorySequences * ctx;
  const numBlocks = kvTokens / o.blockSize;
  if (!Number.isInteger(numBlocks)) {
    throw new Error(
      `Cannot compare KV layouts: ${kvTokens} tokens is not a whole number of ${o.blockSize}-token blocks`,
    );
  }
  const rand = seededRandom(o.seed);
  const reqs = Array.from({ length: o.requests }, (_, i) => {
    const n = drawLength(o.promptTokens, rand);
    const prompt = promptIds(bm.tokenizer, storyWords(n, rand), n);
    return {
      prompt,
      maxTokens: Math.min(drawLength(o.outputTokens, rand), ctx - n),
      sampling: { temperature: 0.8, topK: 0, topP: 0.95, minP: 0, seed: o.seed * 104729 + i },
    };
  });
  const { core, probe } = await makeCore(bm, o.backend, { numBlocks, blockSize: o.blockSize }, {
    maxRunning: 256,
    maxWaiting: o.requests,
    maxBatchTokens: 512,
    prefixCaching: false,
  });
  const t0 = performance.now();
  const recs = await Promise.all(reqs.map((r) => timedGeneration(core, r)));
  const wall = (performance.now() - t0) / 1000;
  const preemptions = core.schedulerStats().preemptions;
  await core.close();
  const c = probe.counters;
  const outputTokens = recs.reduce((s, r) => s + r.tokens.length, 0);

  // The same sequences, step for step, under contiguous reservations.
  const contiguousMaxUtilisation = c.kvTokenSteps / (c.seqSteps * ctx);
  const reserved = reqs.map((r) => r.prompt.length + r.maxTokens);
  const meanReserved = reserved.reduce((s, v) => s + v, 0) / reserved.length;
  // Time-weighted: a sequence holds its reservation for as many steps as it holds tokens.
  const meanHeld =
    reqs.reduce((s, r) => s + (r.prompt.length + r.prompt.length + r.maxTokens) / 2, 0) /
    reqs.length;
  const contiguousExactUtilisation = meanHeld / meanReserved;
  const contiguousMaxFit = Math.floor(kvTokens / ctx);
  const contiguousExactFit = Math.floor(kvTokens / meanReserved);
  const pagedUtilisation = c.kvTokenSteps / c.kvSlotSteps;
  const pagedMeanSequences = c.seqSteps / c.steps;

  const rows = [
    [
      "sequences held at once",
      String(contiguousMaxFit),
      `${contiguousExactFit} (mean fit)`,
      `${c.maxSeqs} peak, ${fmt(pagedMeanSequences, 1)} mean`,
      `${ratio(c.maxSeqs, contiguousMaxFit, 1)} peak, ${
        ratio(pagedMeanSequences, contiguousMaxFit, 1)
      } mean`,
    ],
    [
      "reserved KV holding real tokens",
      pct(contiguousMaxUtilisation),
      pct(contiguousExactUtilisation),
      pct(pagedUtilisation),
      ratio(pagedUtilisation, contiguousMaxUtilisation, 1),
    ],
  ];
  const markdown = [
    "### Paged KV vs contiguous reservation",
    "",
    `The same KV memory: ${kvTokens} token slots (${o.memorySequences} × the ${ctx}-token context; ${numBlocks} blocks of ${o.blockSize}). ` +
    `${o.requests} requests at once, prompts ${o.promptTokens.min}–${o.promptTokens.max} tokens, outputs ${o.outputTokens.min}–${o.outputTokens.max} (EOS ignored), ${o.backend} engine. ` +
    `Paged figures are measured over ${c.steps} steps (${preemptions} preemptions, ${
      fmt(outputTokens / wall, 0)
    } output tokens/s); ` +
    `contiguous figures are for the same sequences with a reservation of the whole context, or of prompt + max_tokens.`,
    "",
    table([
      "",
      "contiguous, max context",
      "contiguous, prompt + max_tokens",
      "paged (measured)",
      "paged / max context",
    ], rows),
  ].join("\n");
  return {
    options: o,
    kvTokens,
    contextLength: ctx,
    contiguousMaxFit,
    contiguousMaxUtilisation,
    contiguousExactFit,
    contiguousExactUtilisation,
    pagedPeakSequences: c.maxSeqs,
    pagedMeanSequences,
    pagedUtilisation,
    preemptions,
    outputTokensPerSecond: outputTokens / wall,
    markdown,
  };
}
