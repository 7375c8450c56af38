/**
 * When a step's readback buffers start mapping. Deno's `mapAsync` waits on the device inside
 * the call (wgpu's `Maintain::Wait`: every submission so far), then resolves no sooner than its
 * next 10 ms poll tick. Mapped right after its own submit, a step blocks the JS thread for the
 * whole of its GPU time, and the next step is encoded only once the device is idle: encoding
 * and GPU time add up. Mapped just before the next submit instead, the wait covers only what is
 * left of the step already running, and the next step was encoded beside it. A zero-delay timer
 * starts the mappings that no submit follows (the last step of a burst), so none waits forever.
 *
 * Because the call waits for the device, the moment it returns is when every step submitted
 * before it had finished: `map` resolves with that moment, from which the engine tells how long
 * a step kept it busy (StepResult.busyMs), all the scheduler needs to size its pipeline.
 */

/** The part of a GPUBuffer this needs (a recording stand-in in tests). */
export interface Mappable {
  mapAsync(mode: number): Promise<void>;
}

interface Pending {
  readonly buffers: readonly Mappable[];
  resolve(idleAt: number): void;
  reject(e: unknown): void;
}

export class DeferredMaps {
  #pending: Pending[] = [];
  #timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly mode: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /**
   * Resolves once every buffer is mapped, with the clock's time when their mapping calls had
   * returned (the device idle then); none starts mapping before `flush` or the timer.
   */
  map(buffers: readonly (Mappable | undefined)[]): Promise<number> {
    const { promise, resolve, reject } = Promise.withResolvers<number>();
    this.#pending.push({ buffers: buffers.filter((b) => b !== undefined), resolve, reject });
    this.#timer ??= setTimeout(() => {
      this.#timer = undefined;
      this.flush();
    }, 0);
    return promise;
  }

  /** Starts every deferred mapping now: call it just before a submit, and on dispose. */
  flush(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    const pending = this.#pending;
    this.#pending = [];
    for (const p of pending) {
      let started: Promise<void>[];
      try {
        started = p.buffers.map((b) => b.mapAsync(this.mode));
      } catch (e) {
        p.reject(e);
        continue;
      }
      const idleAt = this.now();
      Promise.all(started).then(() => p.resolve(idleAt), p.reject);
    }
  }
}
