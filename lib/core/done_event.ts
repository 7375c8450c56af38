import type { CacheHit, FinishReason, GenerationEvent, Timings, Usage } from "./generation.ts";

/** A generation's `done` event. */
export type DoneEvent = Extract<GenerationEvent, { type: "done" }>;

/**
 * When a generation's phases began, in performance.now() milliseconds. A phase that never
 * came (a request cancelled in the queue, one that ended before its first token) collapses
 * onto the next one, so every duration is >= 0 and time to first token = queued + prefill.
 */
export interface GenerationClock {
  /** The request arrived. */
  readonly start: number;
  /** The scheduler admitted it; a side that cannot see the queue passes `start`. */
  readonly scheduled?: number;
  /** The first token was sent. */
  readonly firstToken?: number;
  /** The generation ended (default: now). */
  readonly end?: number;
}

/** The timings of one generation that produced `generated` tokens. */
export function generationTimings(clock: GenerationClock, generated: number): Timings {
  const end = clock.end ?? performance.now();
  const tScheduled = clock.scheduled ?? end;
  const tFirst = clock.firstToken ?? end;
  const decodeMs = end - tFirst;
  return {
    queuedMs: tScheduled - clock.start,
    prefillMs: tFirst - tScheduled,
    timeToFirstTokenMs: tFirst - clock.start,
    decodeMs,
    totalMs: end - clock.start,
    // The first token comes from the prefill; the rest are decode steps.
    decodeTokensPerSecond: generated > 1 && decodeMs > 0 ? ((generated - 1) * 1000) / decodeMs : 0,
  };
}

/**
 * The one way a `done` event is built: the usage as given and, unless `timings` are handed
 * over whole (a router passing on what its replica measured), the clock's timings over the
 * usage's completion tokens.
 */
export function doneEvent(
  finishReason: FinishReason,
  usage: Usage,
  timings: GenerationClock | Timings,
  cached?: CacheHit,
  /** The stop string that ended it, where one did. */
  stopString?: string,
): DoneEvent {
  return {
    type: "done",
    finishReason,
    usage,
    timings: "start" in timings ? generationTimings(timings, usage.completionTokens) : timings,
    ...(stopString === undefined ? {} : { stopString }),
    ...(cached === undefined ? {} : { cached }),
  };
}
