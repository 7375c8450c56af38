import type { Scheduler } from "../lib/core/scheduler.ts";
import { Channel } from "./channel.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import type { ExecutorMsg, SchedulerMsg, SchedulerStats } from "./messages.ts";

export interface SchedulerActorOptions {
  /**
   * Steps planned ahead of their results: 2 plans step t+1 while step t runs, so the CPU work
   * hides behind the device's. 1 waits for every result. Default DEFAULT_LIMITS.pipelineDepth.
   */
  readonly maxInFlight?: number;
  /** Scheduler mailbox capacity (default 1024): submitters wait beyond it. */
  readonly mailboxCapacity?: number;
}

/**
 * The scheduler as an actor: an async loop over its mailbox that alone drives the
 * {@link Scheduler} state machine. After every message it plans steps until `maxInFlight` are
 * outstanding or nothing can progress, and hands them to the executor.
 *
 * The executor's mailbox must hold 2 × maxInFlight plans (see {@link createExecutorMailbox}):
 * maxInFlight current ones plus as many stale ones from before an executor restart that the
 * executor has yet to drop. Then a plan is never refused and the two actors never wait on each
 * other (the executor waits on the scheduler's mailbox, never the reverse).
 */
export class SchedulerActor {
  readonly mailbox: Channel<SchedulerMsg>;
  readonly maxInFlight: number;
  #core: Scheduler;
  #executor: Channel<ExecutorMsg>;
  #epoch = 0;
  /** Between executor-failed and executor-ready: nothing can run. */
  #paused = false;
  #nextSeqId = 1;
  #unsentRelease: number[] = [];

  constructor(core: Scheduler, executor: Channel<ExecutorMsg>, opts: SchedulerActorOptions = {}) {
    this.#core = core;
    this.#executor = executor;
    this.maxInFlight = opts.maxInFlight ?? DEFAULT_LIMITS.pipelineDepth;
    if (!Number.isInteger(this.maxInFlight) || this.maxInFlight < 1) {
      throw new RangeError(
        `Cannot create scheduler actor: maxInFlight must be a positive integer, received ${this.maxInFlight}`,
      );
    }
    if (executor.capacity < 2 * this.maxInFlight) {
      throw new RangeError(
        `Cannot create scheduler actor: the executor mailbox holds ${executor.capacity} plans, fewer than 2 × maxInFlight (${
          2 * this.maxInFlight
        })`,
      );
    }
    this.mailbox = new Channel(opts.mailboxCapacity ?? 1024);
  }

  /** A fresh sequence id (ids are never reused, so late events cannot be misattributed). */
  nextSeqId(): number {
    return this.#nextSeqId++;
  }

  /** A read-only snapshot of the scheduler's state (safe to call from anywhere, e.g. /metrics). */
  stats(): SchedulerStats {
    return this.#core.stats();
  }

  /** The prefix cache's block hashes (see BlockAllocator.cachedBlockHashes). */
  cachedBlockHashes(limit: number): number[] {
    return this.#core.kv.cachedBlockHashes(limit);
  }

  /**
   * Runs until the mailbox is closed; then fails what is still live and closes the executor's
   * mailbox so it ends too.
   */
  async run(): Promise<void> {
    let reason = "The scheduler stopped";
    try {
      for await (const msg of this.mailbox) {
        this.#handle(msg);
        // Constrained sequences sample only under a mask of what their grammar allows next.
        if (this.#core.masksPending) await this.#core.refreshMasks();
        this.#pump();
      }
    } catch (e) {
      // A bug here must not leave requests hanging: end them all with an error.
      reason = `The scheduler failed: ${e instanceof Error ? e.message : e}`;
      console.error(reason, e);
    } finally {
      this.mailbox.close();
      this.#core.failAll("internal", reason);
      this.#executor.close();
    }
  }

  #handle(msg: SchedulerMsg): void {
    const core = this.#core;
    switch (msg.type) {
      case "submit":
        core.submit(msg.seq, msg.reply);
        break;
      case "cancel":
        core.cancel(msg.seqId, true);
        break;
      case "client-gone":
        core.cancel(msg.seqId, false);
        break;
      case "hold":
      case "resume":
        core.hold(msg.seqId, msg.type === "hold");
        break;
      case "step-result":
        if (msg.epoch === this.#epoch) core.onResult(msg.result);
        break;
      case "executor-failed":
        if (msg.epoch === this.#epoch) {
          core.onExecutorFailure(msg.stepId, msg.error);
          this.#unsentRelease = [];
          this.#paused = true;
        }
        break;
      case "executor-ready":
        this.#epoch = msg.epoch;
        this.#paused = false;
        break;
      case "executor-down":
        core.failAll("internal", `The model executor is down: ${msg.error}`);
        this.#paused = true;
        break;
      case "stats":
        msg.reply(core.stats());
        break;
      case "drain":
        core.drain();
        break;
    }
  }

  #pump(): void {
    if (this.#paused) return;
    while (this.#core.stepsInFlight < this.maxInFlight) {
      const plan = this.#core.schedule();
      if (!plan) break;
      const msg: ExecutorMsg = {
        type: "step",
        epoch: this.#epoch,
        plan,
        release: this.#takeReleased(),
      };
      if (!this.#executor.trySend(msg)) {
        throw new Error(
          `SchedulerActor: the executor mailbox refused step ${plan.stepId}; its capacity is below 2 × maxInFlight`,
        );
      }
    }
    // Nothing more to run now: hand over releases on their own, or keep them if there is no room.
    const release = this.#takeReleased();
    if (
      release.length > 0 &&
      !this.#executor.trySend({ type: "release", epoch: this.#epoch, release })
    ) {
      this.#unsentRelease = release;
    }
  }

  #takeReleased(): number[] {
    const ids = this.#unsentRelease.concat(this.#core.takeReleased());
    this.#unsentRelease = [];
    return ids;
  }
}

/** The executor's mailbox, sized for the scheduler's steps in flight (see SchedulerActor). */
export function createExecutorMailbox(
  maxInFlight: number = DEFAULT_LIMITS.pipelineDepth,
): Channel<ExecutorMsg> {
  return new Channel<ExecutorMsg>(2 * maxInFlight);
}
