/**
 * The clock a trace is replayed on. On the wall clock, arrivals wait for real time and steps
 * take what the machine takes. On a logical clock, every engine step advances time by a fixed
 * amount and waiting for an arrival only moves time forward: arrivals and steps are counted,
 * not timed, so which requests overlap (and so a batch's make-up) is the same on any machine.
 */
export interface ReplayClock {
  /** Milliseconds since the replay started. */
  now(): number;
  /** Resolves once now() has reached `at`. */
  until(at: number): Promise<void>;
  /** One engine step has finished. */
  stepped(): void;
  /** "wall" or the logical clock's step cost, for the report. */
  readonly label: string;
}

/** Real time from the moment it is made. */
export function wallClock(): ReplayClock {
  const t0 = performance.now();
  const now = () => performance.now() - t0;
  return {
    now,
    until: (at) => new Promise<void>((r) => setTimeout(r, Math.max(0, at - now()))),
    stepped: () => {},
    label: "wall clock",
  };
}

/** A logical clock on which every engine step takes `stepMs`. */
export function logicalClock(stepMs: number): ReplayClock {
  if (!(stepMs > 0)) {
    throw new Error(`Cannot make a logical clock: stepMs must be positive, received ${stepMs}`);
  }
  let t = 0;
  return {
    now: () => t,
    until: (at) => {
      t = Math.max(t, at);
      return Promise.resolve();
    },
    stepped: () => {
      t += stepMs;
    },
    label: `logical clock, ${stepMs} ms a step`,
  };
}
