import type { Engine, StepPlan, StepResult } from "../lib/engine/engine.ts";
import { type Channel, ChannelClosedError } from "./channel.ts";
import type { ExecutorMsg, SchedulerMsg } from "./messages.ts";

/** Makes a fresh engine (weights, device, empty KV cache); used at each restart. */
export type EngineFactory = () => Engine | Promise<Engine>;

/** One executed (or failed) step, for metrics and traces. */
export interface StepReport {
  readonly plan: StepPlan;
  /** performance.now() when the step was handed to the engine. */
  readonly startedAt: number;
  readonly durationMs: number;
  readonly result?: StepResult;
  readonly error?: unknown;
}

export interface ExecutorOptions {
  /** Restarts in a row that may fail before the executor gives up (default 3). */
  readonly maxRestartAttempts?: number;
  /** Wait before retrying a failed restart, doubled each time (default 100 ms). */
  readonly restartBackoffMs?: number;
  readonly onStep?: (report: StepReport) => void;
  /**
   * Called once per engine restart, as soon as the replacement engine is built and before the
   * scheduler hears it is ready, with the restarts so far (1 for the first). Steps that failed
   * on the dead engine are not restarts: every step already handed to it fails too.
   */
  readonly onRestart?: (restarts: number) => void;
  /** Where failures are logged (default console.error). */
  readonly log?: (message: string) => void;
  /**
   * A step whose result has not come this long after the executor started waiting for it
   * counts as failed, and the engine is restarted (default 120 s; 0 turns it off). A step that
   * never resolves (a lost device, a deadlocked worker) otherwise holds every sequence forever,
   * while the process looks healthy. A step that blocks this thread (the CPU engine computes
   * on it) cannot be interrupted; it is seen once it returns.
   */
  readonly stepTimeoutMs?: number;
}

/**
 * Owns the engine: the only code that calls it. Plans are handed to the engine as they arrive,
 * without waiting for the previous step's result (engines run steps in call order), and results
 * go back to the scheduler in step order.
 *
 * Supervision: when a step fails, the engine's KV cache and every step after it are lost. The
 * executor tells the scheduler (executor-failed, so it requeues its sequences for recompute),
 * disposes the engine, builds a new one from the factory and announces it (executor-ready with a
 * new epoch). Plans and results of the old epoch are dropped. If no engine can be built after
 * maxRestartAttempts tries it reports executor-down.
 */
export class ExecutorActor {
  readonly mailbox: Channel<ExecutorMsg>;
  #engine: Engine | undefined;
  #factory: EngineFactory;
  #scheduler: Channel<SchedulerMsg>;
  #opts: ExecutorOptions;
  #epoch = 0;
  /** Settles after the last accepted step's result was handled; keeps results in order. */
  #tail: Promise<void> = Promise.resolve();
  #restarts = 0;

  /**
   * @param mailbox the executor's mailbox: its capacity must cover the scheduler's maximum
   *   number of steps in flight, so that the scheduler never waits to send a plan.
   */
  constructor(
    engine: Engine,
    factory: EngineFactory,
    mailbox: Channel<ExecutorMsg>,
    scheduler: Channel<SchedulerMsg>,
    opts: ExecutorOptions = {},
  ) {
    this.#engine = engine;
    this.#factory = factory;
    this.mailbox = mailbox;
    this.#scheduler = scheduler;
    this.#opts = opts;
  }

  /** Engine restarts so far. */
  get restarts(): number {
    return this.#restarts;
  }

  /** Runs until the mailbox is closed and the last step has been answered. */
  async run(): Promise<void> {
    for await (const msg of this.mailbox) {
      // A message made for a failed engine refers to state that no longer exists.
      if (msg.epoch !== this.#epoch || !this.#engine) continue;
      for (const id of msg.release) this.#engine.release?.(id);
      if (msg.type === "step") this.#step(msg.epoch, msg.plan);
    }
    await this.#tail;
    this.#engine?.dispose();
    this.#engine = undefined;
  }

  #step(epoch: number, plan: StepPlan): void {
    const engine = this.#engine!;
    const startedAt = performance.now();
    let pending: Promise<StepResult>;
    try {
      pending = engine.step(plan);
    } catch (e) {
      pending = Promise.reject(e);
    }
    // Handled in order below; this keeps an early rejection from being reported as unhandled.
    pending.catch(() => {});
    this.#tail = this.#tail.then(async () => {
      let result: StepResult;
      const limit = this.#opts.stepTimeoutMs ?? 120_000;
      let watchdog: ReturnType<typeof setTimeout> | undefined;
      try {
        result = limit > 0
          ? await Promise.race([
            pending,
            new Promise<never>((_, reject) => {
              watchdog = setTimeout(
                () =>
                  reject(
                    new Error(
                      `step ${plan.stepId} gave no result within ${limit} ms (the engine hangs)`,
                    ),
                  ),
                limit,
              );
            }),
          ])
          : await pending;
      } catch (error) {
        this.#report({ plan, startedAt, durationMs: performance.now() - startedAt, error });
        await this.#fail(epoch, error, plan.stepId);
        return;
      } finally {
        clearTimeout(watchdog);
      }
      const durationMs = performance.now() - startedAt;
      if (epoch !== this.#epoch) return;
      this.#report({ plan, startedAt, durationMs, result });
      await this.#post({ type: "step-result", epoch, result, durationMs });
    });
  }

  /**
   * A throwing hook must not break the chain of results: every later step would be lost and
   * the rejection would end the process.
   */
  #report(report: StepReport): void {
    this.#hook(`onStep`, () => this.#opts.onStep?.(report), ` on step ${report.plan.stepId}`);
  }

  #hook(name: string, call: () => void, where = ""): void {
    try {
      call();
    } catch (e) {
      (this.#opts.log ?? console.error)(
        `Executor: the ${name} hook threw${where}: ${e instanceof Error ? e.message : e}`,
      );
    }
  }

  async #fail(epoch: number, error: unknown, stepId: number): Promise<void> {
    if (epoch !== this.#epoch) return; // a later step of the same dead engine
    const log = this.#opts.log ?? console.error;
    const message = error instanceof Error ? error.message : String(error);
    log(
      `Executor: engine ${
        this.#engine?.name ?? "?"
      } failed (epoch ${epoch}): ${message}; restarting it`,
    );
    this.#epoch = epoch + 1;
    const old = this.#engine;
    this.#engine = undefined;
    await this.#post({ type: "executor-failed", epoch, error: message, stepId });
    try {
      old?.dispose();
    } catch (e) {
      log(`Executor: disposing the failed engine threw: ${e}`);
    }
    const attempts = this.#opts.maxRestartAttempts ?? 3;
    let backoff = this.#opts.restartBackoffMs ?? 100;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        this.#engine = await this.#factory();
        this.#restarts++;
        this.#hook("onRestart", () => this.#opts.onRestart?.(this.#restarts));
        await this.#post({ type: "executor-ready", epoch: this.#epoch });
        return;
      } catch (e) {
        log(
          `Executor: restart attempt ${attempt} of ${attempts} failed: ${
            e instanceof Error ? e.message : e
          }`,
        );
        if (attempt < attempts) await new Promise((r) => setTimeout(r, backoff));
        backoff *= 2;
      }
    }
    await this.#post({
      type: "executor-down",
      error: `the engine failed (${message}) and could not be recreated in ${attempts} attempts`,
    });
  }

  async #post(msg: SchedulerMsg): Promise<void> {
    try {
      await this.#scheduler.send(msg);
    } catch (e) {
      // The scheduler has stopped; nobody needs the result any more.
      if (!(e instanceof ChannelClosedError)) throw e;
    }
  }
}
