import { Scheduler, type SchedulerConfig } from "../lib/core/scheduler.ts";
import { Channel } from "./channel.ts";
import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { PipelineDepth } from "../lib/core/pipeline_depth.ts";
import { SCHEDULER_DEFAULTS } from "../lib/core/scheduler_config.ts";
import type {
  ExecutorMsg,
  SchedulerMsg,
  SchedulerStats,
  SeqEvent,
  SeqEventSink,
} from "./messages.ts";

export interface SchedulerActorOptions {
  /**
   * Steps planned ahead of their results: 2 plans step t+1 while step t runs, so the CPU work
   * hides behind the device's. 1 waits for every result. Default DEFAULT_LIMITS.pipelineDepth.
   */
  readonly maxInFlight?: number;
  /**
   * Adapt the steps in flight between `min` and maxInFlight to cover a readback of
   * `latencyMs` at the steps' measured cost (StepResult.busyMs, lib/core/pipeline_depth.ts);
   * unset: always maxInFlight.
   */
  readonly adaptiveDepth?: { readonly min: number; readonly latencyMs: number };
  /** Scheduler mailbox capacity (default 1024): submitters wait beyond it. */
  readonly mailboxCapacity?: number;
  /** See SCHEDULER_DEFAULTS.backgroundShare (1: no pacing). */
  readonly backgroundShare?: number;
  /** See SCHEDULER_DEFAULTS.backgroundQuietMs. */
  readonly backgroundQuietMs?: number;
  /** Clock in milliseconds (default performance.now). */
  readonly now?: () => number;
}

/**
 * The scheduler as an actor: an async loop over its mailbox that alone drives the
 * {@link Scheduler} state machine it owns. After every message it plans steps until
 * `maxInFlight` are outstanding or nothing can progress, and hands them to the executor. It
 * routes the policy's events to each sequence's submitter, and publishes a snapshot of the
 * policy's state at the end of every turn: the only view others get of it.
 *
 * The executor's mailbox must hold 2 × maxInFlight plans (see {@link createExecutorMailbox}):
 * maxInFlight current ones plus as many stale ones from before an executor restart that the
 * executor has yet to drop. Then a plan is never refused and the two actors never wait on each
 * other (the executor waits on the scheduler's mailbox, never the reverse).
 */
export class SchedulerActor {
  readonly mailbox: Channel<SchedulerMsg>;
  readonly maxInFlight: number;
  readonly #depth: PipelineDepth | undefined;
  #core: Scheduler;
  #executor: Channel<ExecutorMsg>;
  /** Where each live sequence's events go (its submitter's reply), until its last event. */
  #routes = new Map<number, SeqEventSink>();
  #stats: SchedulerStats;
  /** Prefix-cache hashes as of the turn that last answered a "publish-hashes". */
  #hashes: number[] = [];
  #epoch = 0;
  /** Between executor-failed and executor-ready: nothing can run. */
  #paused = false;
  #nextSeqId = 1;
  #unsentRelease: number[] = [];
  readonly #share: number;
  readonly #quietMs: number;
  readonly #now: () => number;
  /** Steps planned while only batch work was live (paced). */
  #backgroundSteps = new Set<number>();
  /** When interactive work was last live, and when the next paced background step may start. */
  #lastForeground = -Infinity;
  #backgroundAt = -Infinity;
  #wakeTimer: ReturnType<typeof setTimeout> | undefined;
  /** When the previous step result arrived (the actor's clock). */
  #lastResultAt = -Infinity;

  constructor(
    config: SchedulerConfig,
    executor: Channel<ExecutorMsg>,
    opts: SchedulerActorOptions = {},
  ) {
    this.#core = new Scheduler(config, (e) => this.#route(e));
    this.#stats = this.#core.stats();
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
    const adapt = opts.adaptiveDepth;
    this.#depth = adapt && new PipelineDepth({
      min: Math.min(adapt.min, this.maxInFlight),
      max: this.maxInFlight,
      latencyMs: adapt.latencyMs,
    });
    this.mailbox = new Channel(opts.mailboxCapacity ?? 1024);
    this.#share = opts.backgroundShare ?? SCHEDULER_DEFAULTS.backgroundShare;
    if (!(this.#share > 0 && this.#share <= 1)) {
      throw new RangeError(
        `Cannot create scheduler actor: backgroundShare must be in (0, 1], received ${this.#share}`,
      );
    }
    this.#quietMs = opts.backgroundQuietMs ?? SCHEDULER_DEFAULTS.backgroundQuietMs;
    this.#now = opts.now ?? (() => performance.now());
  }

  /** A fresh sequence id (ids are never reused, so late events cannot be misattributed). */
  nextSeqId(): number {
    return this.#nextSeqId++;
  }

  /** The fewest steps it keeps in flight when the depth adapts; else maxInFlight. */
  get minPipelineDepth(): number {
    return this.#depth?.min ?? this.maxInFlight;
  }

  /** Steps it keeps in flight now: maxInFlight, or less where the depth adapts. */
  get pipelineDepth(): number {
    return this.#depth?.current ?? this.maxInFlight;
  }

  /** The scheduler's state as of the end of the actor's latest turn (e.g. for /metrics). */
  stats(): SchedulerStats {
    return this.#stats;
  }

  /**
   * The prefix cache's block hashes (newest last, at most `limit`) as the actor last published
   * them, and a request to publish them afresh: a caller that polls (a replica's heartbeat)
   * sees what the cache held at its previous poll, or later. Computing them in every turn
   * would cost the step loop a copy of the whole cache's hashes.
   */
  cachedBlockHashes(limit: number): number[] {
    if (!this.mailbox.closed) this.mailbox.trySend({ type: "publish-hashes", limit });
    return this.#hashes.length <= limit ? this.#hashes : this.#hashes.slice(-limit);
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
        if (this.#core.masksPending) {
          this.#stats = this.#core.stats();
          await this.#core.refreshMasks();
        }
        this.#pump();
        this.#stats = this.#core.stats();
      }
    } catch (e) {
      // A bug here must not leave requests hanging: end them all with an error.
      reason = `The scheduler failed: ${e instanceof Error ? e.message : e}`;
      console.error(reason, e);
    } finally {
      clearTimeout(this.#wakeTimer);
      this.mailbox.close();
      this.#core.failAll("internal", reason);
      this.#stats = this.#core.stats();
      this.#executor.close();
    }
  }

  #handle(msg: SchedulerMsg): void {
    const core = this.#core;
    switch (msg.type) {
      case "submit": {
        const { seqId } = msg.seq;
        if (this.#routes.has(seqId)) {
          // The policy would refuse it too, but its answer would go to the live one's owner.
          msg.seq.constraint?.dispose();
          safeReply(msg.reply, {
            type: "rejected",
            seqId,
            code: "internal",
            message: `Cannot submit sequence ${seqId}: the id is already live`,
          });
          break;
        }
        this.#routes.set(seqId, msg.reply);
        core.submit(msg.seq);
        break;
      }
      case "cancel":
        core.cancel(msg.seqId);
        break;
      case "client-gone":
        // Nobody listens: its finished("cancelled") goes nowhere.
        this.#routes.delete(msg.seqId);
        core.cancel(msg.seqId);
        break;
      case "hold":
      case "resume":
        core.hold(msg.seqId, msg.type === "hold");
        break;
      case "step-result":
        if (this.#backgroundSteps.delete(msg.result.stepId) && this.#share < 1) {
          this.#backgroundAt = this.#now() + msg.durationMs * (1 / this.#share - 1);
        }
        if (msg.epoch === this.#epoch) {
          core.onResult(msg.result, this.#busyMs(msg.result.busyMs, msg.durationMs));
          this.#depth?.onResult(msg.result.busyMs, msg.result.readbackMs);
        }
        break;
      case "wake":
        this.#wakeTimer = undefined;
        break;
      case "executor-failed":
        if (msg.epoch === this.#epoch) {
          core.onExecutorFailure(msg.stepId, msg.error);
          this.#backgroundSteps.clear();
          this.#unsentRelease = [];
          this.#paused = true;
        }
        break;
      case "executor-ready":
        this.#epoch = msg.epoch;
        this.#paused = false;
        this.#depth?.reset();
        break;
      case "executor-down":
        core.failAll("internal", `The model executor is down: ${msg.error}`);
        this.#paused = true;
        break;
      case "publish-hashes":
        this.#hashes = core.cachedBlockHashes(msg.limit);
        break;
      case "drain":
        core.drain();
        break;
    }
  }

  /**
   * How long a step alone kept the engine busy: what the engine says, else its time from being
   * handed over to its result, less the part spent behind the step before it (engines run steps
   * in order, so a pipelined step waits for its predecessor's result first).
   */
  #busyMs(reported: number | undefined, durationMs: number): number {
    const now = this.#now();
    const sincePrevious = now - this.#lastResultAt;
    this.#lastResultAt = now;
    return reported ?? Math.min(durationMs, sincePrevious);
  }

  /** Hands a policy event to its sequence's submitter; the last one ends the route. */
  #route(event: SeqEvent): void {
    const reply = this.#routes.get(event.seqId);
    if (event.type === "rejected" || event.type === "finished" || event.type === "failed") {
      this.#routes.delete(event.seqId);
    }
    if (reply) safeReply(reply, event);
  }

  #pump(): void {
    if (this.#paused) return;
    while (this.#core.stepsInFlight < this.pipelineDepth) {
      const now = this.#now();
      const background = this.#core.backgroundOnly;
      if (!background) this.#lastForeground = now;
      const paced = now - this.#lastForeground < this.#quietMs && now < this.#backgroundAt;
      const plan = this.#core.schedule(!paced);
      if (!plan) {
        if (paced && background && this.#wakeTimer === undefined) this.#wakeAt(this.#backgroundAt);
        break;
      }
      if (background) this.#backgroundSteps.add(plan.stepId);
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

  /** Posts "wake" at `at` (the actor's clock), so a paced background step is planned then. */
  #wakeAt(at: number): void {
    this.#wakeTimer = setTimeout(() => {
      this.mailbox.send({ type: "wake" }).catch(() => {
        // Closed: nothing is planned any more.
      });
    }, Math.max(0, at - this.#now()));
  }

  #takeReleased(): number[] {
    const ids = this.#unsentRelease.concat(this.#core.takeReleased());
    this.#unsentRelease = [];
    return ids;
  }
}

/** A listener that throws must not corrupt the scheduler's state. */
function safeReply(reply: SeqEventSink, event: SeqEvent): void {
  try {
    reply(event);
  } catch (e) {
    console.error(
      `Scheduler: the reply handler of seq ${event.seqId} threw on "${event.type}":`,
      e,
    );
  }
}

/** The executor's mailbox, sized for the scheduler's steps in flight (see SchedulerActor). */
export function createExecutorMailbox(
  maxInFlight: number = DEFAULT_LIMITS.pipelineDepth,
): Channel<ExecutorMsg> {
  return new Channel<ExecutorMsg>(2 * maxInFlight);
}
