/**
 * Shared pieces of the side-by-side comparisons: the model, an engine wrapper that counts what
 * the engine computed and how full the KV blocks it was handed were, and a timed generation
 * through the real serving core.
 */
import { setImmediate } from "node:timers";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import type { ServingCore } from "../actors/core.ts";
import type { TextCodec } from "../actors/request.ts";
import {
  type Engine,
  inputLength,
  type KvGeometry,
  type SamplingParams,
  type StepPlan,
  type StepResult,
} from "../lib/engine/engine.ts";
import type { BackendChoice } from "../lib/compose/engine_factory.ts";
import { openServing } from "../lib/compose/open_serving.ts";
import type { Priority } from "../lib/core/generation.ts";
import { loadModel } from "../lib/model/load_model.ts";
import type { SchedulerConfig } from "../lib/core/scheduler.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { Model } from "../lib/model/weights.ts";

export interface BenchModel {
  readonly path: string;
  readonly model: Model;
  readonly tokenizer: Tokenizer;
}

export async function loadBenchModel(path: string): Promise<BenchModel> {
  const model = await loadModel(path);
  if (!model.tokenizer) throw new Error(`Cannot benchmark ${path}: it has no vocabulary`);
  return { path, model, tokenizer: new Tokenizer(model.tokenizer) };
}

/**
 * The tokenizer with every end-of-generation token switched off, so each generation runs to its max_tokens (like the
 * ignore_eos option of other servers' benchmarks): output lengths are then set by the
 * workload, not by where the model happens to end its story.
 */
export function ignoreEos(codec: TextCodec): TextCodec {
  return {
    bosId: codec.bosId,
    endIds: new Set(),
    createDecoder: (opts) => codec.createDecoder(opts),
  };
}

/** What a ProbeEngine saw. */
export interface ProbeCounters {
  steps: number;
  /** Token rows of prefill chunks (prompt tokens computed, recomputation included). */
  prefillRows: number;
  /** Single-token decode rows. */
  decodeRows: number;
  /** Most sequences in one step. */
  maxSeqs: number;
  /** Sum over steps of the sequences in it. */
  seqSteps: number;
  /** Sum over steps of the tokens held in KV by the step's sequences after it. */
  kvTokenSteps: number;
  /** Sum over steps of the distinct KV blocks those sequences hold, times the block size. */
  kvSlotSteps: number;
}

/**
 * Delegates to an engine and counts its work: prefill and decode rows, batch sizes, and the
 * KV occupancy of each step (tokens held against slots of the blocks in the block tables).
 *
 * It also lets the event loop turn before each step (as the CPU engine does itself), so that
 * an engine computing synchronously cannot hold off the timers that release a trace's arrivals.
 */
export class ProbeEngine implements Engine {
  readonly counters: ProbeCounters = {
    steps: 0,
    prefillRows: 0,
    decodeRows: 0,
    maxSeqs: 0,
    seqSteps: 0,
    kvTokenSteps: 0,
    kvSlotSteps: 0,
  };

  /** Per sequence: the position after its last sampling entry. */
  #sampledEnd = new Map<number, number>();

  constructor(readonly inner: Engine) {}

  get name(): string {
    return this.inner.name;
  }
  get config() {
    return this.inner.config;
  }
  get kv(): KvGeometry {
    return this.inner.kv;
  }

  step(plan: StepPlan): Promise<StepResult> {
    this.#count(plan);
    // Chained on the previous step's hand-over (not its result), so steps reach the engine in
    // call order and an engine that pipelines still gets step t+1 before step t is done.
    const handOver = this.#handOver.then(() => new Promise<void>((r) => setImmediate(r)));
    this.#handOver = handOver;
    return handOver.then(() => this.inner.step(plan));
  }

  #handOver: Promise<void> = Promise.resolve();

  #count(plan: StepPlan): void {
    const c = this.counters;
    c.steps++;
    c.seqSteps += plan.seqs.length;
    c.maxSeqs = Math.max(c.maxSeqs, plan.seqs.length);
    const blocks = new Set<number>();
    const bs = this.inner.kv.blockSize;
    for (const s of plan.seqs) {
      const n = inputLength(s);
      // A decode feeds the token sampled at the end of the sequence's previous sampling entry;
      // anything else (a prompt chunk, a recomputation after preemption) is prefill.
      const decode = s.useLastSampled || (n === 1 && this.#sampledEnd.get(s.seqId) === s.startPos);
      if (decode) c.decodeRows += n;
      else c.prefillRows += n;
      if (s.sample) this.#sampledEnd.set(s.seqId, s.startPos + n);
      const held = s.startPos + n;
      c.kvTokenSteps += held;
      const used = Math.ceil(held / bs);
      for (let i = 0; i < used && i < s.blockTable.length; i++) blocks.add(s.blockTable[i]!);
    }
    c.kvSlotSteps += blocks.size * bs;
  }

  /**
   * Queued behind the hand-over of every step called before it, like a step: a release reaching
   * the engine ahead of an earlier step that decodes the sequence's last sampled token would
   * make that step fail (and the executor restart the engine).
   */
  release(seqId: number): void {
    this.#sampledEnd.delete(seqId);
    this.#handOver = this.#handOver.then(() => this.inner.release?.(seqId));
  }

  dispose(): void {
    this.inner.dispose();
  }
}

export interface CoreUnderTest {
  readonly core: ServingCore;
  readonly probe: ProbeEngine;
  readonly description: string;
}

/** A serving core over a fresh engine of `backend`, its work counted by a ProbeEngine. */
export async function makeCore(
  bm: BenchModel,
  backend: BackendChoice,
  kv: KvGeometry,
  scheduler: Partial<SchedulerConfig>,
  codec: TextCodec = ignoreEos(bm.tokenizer),
): Promise<CoreUnderTest> {
  // The scheduler must stay within the step limits the engine sized its buffers for.
  const limits = {
    maxBatchTokens: scheduler.maxBatchTokens ?? DEFAULT_LIMITS.maxBatchTokens,
    maxSeqs: scheduler.maxRunning ?? DEFAULT_LIMITS.maxRunning,
  };
  let probe: ProbeEngine | undefined;
  const { core, description } = await openServing({
    model: bm.model,
    tokenizer: bm.tokenizer,
    backend,
    kv,
    limits,
    // The first engine's probe is the one reported; a restart's engine is counted apart.
    wrapEngine: (e) => {
      const p = new ProbeEngine(e);
      probe ??= p;
      return p;
    },
    codec,
    scheduler,
  });
  made.push(core);
  return { core, probe: probe!, description };
}

const made: ServingCore[] = [];

/**
 * Engine restarts over every core makeCore() has built. A healthy run has none: a restart
 * without injected faults means the scheduler and the engine disagreed about a plan.
 */
export function engineRestarts(): number {
  return made.reduce((n, core) => n + core.executor.restarts, 0);
}

/** One generation as the core reported it, timed from its arrival. */
export interface GenRecord {
  readonly arrival: number;
  firstToken?: number;
  end?: number;
  readonly tokens: number[];
  cachedTokens: number;
  error?: string;
}

export interface GenSpec {
  readonly prompt: readonly number[];
  readonly maxTokens: number;
  readonly sampling: SamplingParams;
  readonly priority?: Priority;
}

/**
 * Runs one generation through the core, recording its token ids and times (performance.now).
 * `arrival` defaults to now; a trace passes its scheduled time, so a late timer counts against
 * the server.
 */
export async function timedGeneration(
  core: ServingCore,
  spec: GenSpec,
  signal?: AbortSignal,
  arrival = performance.now(),
): Promise<GenRecord> {
  const r: GenRecord = { arrival, tokens: [], cachedTokens: 0 };
  for await (
    const ev of core.generate({
      prompt: spec.prompt,
      maxTokens: spec.maxTokens,
      sampling: spec.sampling,
      stop: [],
      priority: spec.priority ?? "interactive",
      requestId: "bench",
    }, signal)
  ) {
    if (ev.type === "token") {
      r.firstToken ??= performance.now();
      r.tokens.push(...ev.ids);
    } else if (ev.type === "done") {
      r.end = performance.now();
      r.cachedTokens = ev.usage.cachedTokens;
      if (ev.finishReason === "cancelled") r.error = "cancelled";
    } else if (ev.type === "error") {
      r.end = performance.now();
      r.error = ev.code;
    }
  }
  return r;
}

/** Prompt token ids: BOS, then the text's tokens, cut or kept at exactly `n` ids. */
export function promptIds(tok: Tokenizer, text: string, n: number): number[] {
  const ids = tok.encode(text, { bos: true });
  if (ids.length < n) {
    throw new Error(`Cannot build a ${n}-token prompt: the text has only ${ids.length} tokens`);
  }
  return ids.slice(0, n);
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, Math.max(0, ms)));
