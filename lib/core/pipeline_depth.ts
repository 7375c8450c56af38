/**
 * How many steps to keep in flight for an engine whose results come back through a readback
 * with a fixed latency (`Engine.readbackLatencyMs`; Deno's WebGPU `mapAsync` resolves no sooner
 * than 10 ms after it is called): enough to keep the engine busy until a step's result is back,
 * and no more. A step queued beyond that adds no throughput, only its time to the wait of the
 * next new request's prefill: with 8 in flight, 32 streams on llvmpipe (~9 ms steps) had up to
 * 2× the TTFT of 3 in flight for the same tokens/s, while one stream (~2 ms steps) needs 6–8 to
 * decode at twice the rate of 3.
 *
 * Both are measured, not assumed: each result says how long its step kept the engine busy
 * (StepResult.busyMs) and how long its readback then took (StepResult.readbackMs; until one
 * does, the engine's `readbackLatencyMs`). A step's result is back about busy + latency after
 * it started, and the mapping that ends its wait starts only at the next submit, so the steps
 * after it must cover busy + latency: depth = 2 + ⌈latency / busy⌉, both smoothed over recent
 * steps.
 *
 * A measured latency counts at most LATE_READBACK times the engine's own: a readback that
 * takes longer means this process's event loop came to it late, busy with its clients, and
 * steps queued to cover that wait only delay new prefills while the host stays the limit. At
 * 32 streams on llvmpipe readbacks measured 15-60 ms, which kept 5-6 steps in flight; capped,
 * 4, and the server-side TTFT went 53-70 -> 33-35 ms (p50) at the same tokens/s.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { PipelineDepth } from "./pipeline_depth.ts";
 *
 * const depth = new PipelineDepth({ min: 3, max: 8, latencyMs: 10 });
 * assertEquals(depth.current, 8); // before any measurement: the deepest
 * depth.onResult(9); // a 9 ms step: 2 + ceil(10 / 9) = 4
 * assertEquals(depth.current, 4);
 * depth.onResult(9, 12); // its readback took 12 ms, measured, not assumed: 2 + ceil(12 / 9)
 * assertEquals(depth.current, 4);
 * const late = new PipelineDepth({ min: 3, max: 16, latencyMs: 10 });
 * late.onResult(2, 40); // a 40 ms readback counts as 12.5 (the host was late): 2 + ceil(12.5 / 2)
 * assertEquals(late.current, 9);
 * ```
 */
export class PipelineDepth {
  readonly min: number;
  readonly max: number;
  /** The readback latency assumed until a result measures one. */
  readonly latencyMs: number;
  /** Steps the scheduler may have in flight now. */
  current: number;
  /** Smoothed busy ms per step. */
  #busy: number | undefined;
  /** Smoothed measured readback latency. */
  #latency: number | undefined;

  constructor(opts: { min: number; max: number; latencyMs: number }) {
    const { min, max, latencyMs } = opts;
    if (!Number.isInteger(min) || !Number.isInteger(max) || min < 1 || max < min) {
      throw new RangeError(
        `Cannot adapt the pipeline depth: need integers 1 <= min <= max, received min ${min}, max ${max}`,
      );
    }
    if (!(latencyMs >= 0)) {
      throw new RangeError(
        `Cannot adapt the pipeline depth: latencyMs must be >= 0, received ${latencyMs}`,
      );
    }
    this.min = min;
    this.max = max;
    this.latencyMs = latencyMs;
    this.current = max;
  }

  /** Smoothed ms a step keeps the engine busy, once measured. */
  get busyMs(): number | undefined {
    return this.#busy;
  }

  /** Smoothed measured readback latency, once measured. */
  get readbackMs(): number | undefined {
    return this.#latency;
  }

  /**
   * A step's result arrived, saying how long it kept the engine busy and how long its readback
   * took (where the engine says).
   */
  onResult(busyMs: number | undefined, readbackMs?: number): void {
    if (!measured(busyMs)) return;
    this.#busy = smooth(this.#busy, busyMs);
    if (measured(readbackMs)) this.#latency = smooth(this.#latency, readbackMs);
    const latency = Math.min(this.#latency ?? this.latencyMs, LATE_READBACK * this.latencyMs);
    this.current = depthFor(latency, this.#busy, this.min, this.max);
  }

  /** After an engine restart the old measurements say nothing of the new engine. */
  reset(): void {
    this.#busy = undefined;
    this.#latency = undefined;
    this.current = this.max;
  }
}

/** The most a measured readback latency counts for, as a multiple of the engine's own. */
export const LATE_READBACK = 1.25;

function measured(ms: number | undefined): ms is number {
  return ms !== undefined && Number.isFinite(ms) && ms >= 0;
}

/** A quarter of each new step: a burst of prefill steps moves it, one outlier does not. */
function smooth(old: number | undefined, v: number): number {
  return old === undefined ? v : old + 0.25 * (v - old);
}

/** Steps in flight that keep an engine busy `busyMs` per step through a `latencyMs` readback. */
export function depthFor(latencyMs: number, busyMs: number, min: number, max: number): number {
  const need = busyMs <= 0 ? max : 2 + Math.ceil(latencyMs / busyMs);
  return Math.min(max, Math.max(min, need));
}
