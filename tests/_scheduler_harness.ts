import type { LogitControls } from "../lib/core/logit_controls.ts";
/**
 * Drives a Scheduler by hand against a FakeEngine, the way the actors do but synchronously, so
 * tests control exactly when steps are planned and when their results arrive. A planned step
 * runs on the engine at once (engines execute in call order); its result is delivered later,
 * which reproduces the pipelined executor's late tokens.
 */
import {
  GREEDY,
  type SamplingParams,
  type StepPlan,
  type StepResult,
} from "../lib/engine/engine.ts";
import { FakeEngine, type FakeEngineOptions } from "./harness/fake_engine.ts";
import type { Priority } from "../lib/core/generation.ts";
import { Scheduler, type SchedulerConfig, schedulerConfig } from "../lib/core/scheduler.ts";
import type { SeqEvent } from "../actors/messages.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";
import type { Pooling } from "../lib/engine/pooling.ts";

export interface HarnessSeq {
  prompt: number[];
  maxTokens: number;
  priority?: Priority;
  sampling?: SamplingParams;
  stopTokenIds?: number[];
  controls?: LogitControls;
  generated?: number;
  embed?: Pooling;
}

type Pending = { kind: "result"; result: StepResult } | {
  kind: "fail";
  stepId: number;
  error: string;
};

export class Harness {
  readonly sched: Scheduler;
  engine: FakeEngine;
  readonly engineOpts: FakeEngineOptions;
  readonly events = new Map<number, SeqEvent[]>();
  readonly plans: StepPlan[] = [];
  readonly queue: Pending[] = [];
  /** Set to make the engine's next step throw mid-step. */
  failNext = false;
  /** Engine errors containing this count as device faults; any other error fails the test. */
  faultMarker = "injected fault";
  faults = 0;
  /** Sequences whose owner left: their events go nowhere (the actor drops their route). */
  readonly #gone = new Set<number>();
  #failurePending = false;
  #nextId = 1;

  constructor(engineOpts: FakeEngineOptions, overrides: Partial<SchedulerConfig> = {}) {
    this.engineOpts = engineOpts;
    this.engine = this.#newEngine();
    this.sched = new Scheduler(
      schedulerConfig({
        numBlocks: this.engine.kv.numBlocks,
        blockSize: this.engine.kv.blockSize,
        contextLength: this.engine.config.contextLength,
      }, overrides),
      (e) => {
        if (!this.#gone.has(e.seqId)) this.events.get(e.seqId)?.push(e);
      },
    );
  }

  #newEngine(): FakeEngine {
    return new FakeEngine({
      ...this.engineOpts,
      failWhen: (plan, call) => {
        if (!this.failNext) return this.engineOpts.failWhen?.(plan, call) ?? false;
        this.failNext = false;
        return true;
      },
    });
  }

  submit(s: HarnessSeq): number {
    const seqId = this.#nextId++;
    this.events.set(seqId, []);
    this.sched.submit({
      seqId,
      prompt: s.prompt,
      maxTokens: s.maxTokens,
      sampling: s.sampling ?? GREEDY,
      stopTokenIds: s.stopTokenIds ?? [],
      priority: s.priority ?? "interactive",
      ...(s.controls ? { controls: s.controls } : {}),
      ...(s.generated ? { generated: s.generated } : {}),
      ...(s.embed ? { embed: s.embed } : {}),
    });
    return seqId;
  }

  /** Its client left: cancelled, and nobody hears about it (as the actor's "client-gone"). */
  clientGone(seqId: number): void {
    this.#gone.add(seqId);
    this.sched.cancel(seqId);
  }

  /** Plans one step and runs it on the engine; false when there was nothing to plan. */
  plan(): boolean {
    const plan = this.sched.schedule();
    if (!plan) return false;
    this.plans.push(plan);
    // After a fault the executor drops plans until the scheduler has heard of it.
    if (this.#failurePending) return true;
    try {
      for (const id of this.sched.takeReleased()) this.engine.release(id);
      this.queue.push({ kind: "result", result: this.engine.run(plan) });
    } catch (e) {
      if (!String(e).includes(this.faultMarker)) throw e;
      this.queue.push({ kind: "fail", stepId: plan.stepId, error: String(e) });
      this.#failurePending = true;
    }
    return true;
  }

  /** Delivers the oldest pending result (or fault); false when none is pending. */
  deliver(): boolean {
    const next = this.queue.shift();
    if (!next) return false;
    if (next.kind === "result") {
      this.sched.onResult(next.result);
    } else {
      this.faults++;
      this.queue.length = 0;
      this.#failurePending = false;
      this.engine.dispose();
      this.engine = this.#newEngine();
      this.sched.onExecutorFailure(next.stepId, next.error);
    }
    return true;
  }

  /** Runs until nothing is live: keeps `depth` steps in flight, delivering the oldest when full. */
  runToEnd(depth = 2, maxSteps = 100_000): void {
    for (let i = 0; i < maxSteps; i++) {
      if (this.queue.length < depth && this.plan()) continue;
      if (this.deliver()) continue;
      if (this.sched.numLive === 0) return;
      throw new Error(
        `Harness: ${this.sched.numLive} sequences live but nothing to plan or deliver`,
      );
    }
    throw new Error(`Harness: not done after ${maxSteps} iterations`);
  }

  /** Token ids a sequence produced: token events plus the stop token that ended it. */
  tokens(seqId: number): number[] {
    const out: number[] = [];
    for (const e of this.events.get(seqId) ?? []) {
      if (e.type === "token") out.push(e.token);
      if (e.type === "finished" && e.stopToken !== undefined) out.push(e.stopToken);
    }
    return out;
  }

  /** The sequence's terminal event, if it has one. */
  end(seqId: number): SeqEvent | undefined {
    return this.events.get(seqId)?.find((e) =>
      e.type === "finished" || e.type === "failed" || e.type === "rejected"
    );
  }

  /** The sequence's finished event; throws if it ended otherwise or not at all. */
  finished(seqId: number): Extract<SeqEvent, { type: "finished" }> {
    const e = this.end(seqId);
    if (e?.type !== "finished") {
      throw new Error(`seq ${seqId}: expected finished, got ${JSON.stringify(e)}`);
    }
    return e;
  }

  /** The sequence's rejection; throws if it was not rejected. */
  rejected(seqId: number): Extract<SeqEvent, { type: "rejected" }> {
    const e = this.end(seqId);
    if (e?.type !== "rejected") {
      throw new Error(`seq ${seqId}: expected rejected, got ${JSON.stringify(e)}`);
    }
    return e;
  }

  /** The steps (ids) that sampled each of the sequence's streamed tokens. */
  tokenSteps(seqId: number): number[] {
    return (this.events.get(seqId) ?? []).flatMap((e) => (e.type === "token" ? [e.stepId] : []));
  }
}

/** Deterministic integers in [0, n). */
export function prng(seed: number): (n: number) => number {
  const r = seededRandom(seed);
  return (n: number) => (r() * n) | 0;
}
