import { LAUNCHER_GONE, whenLauncherGone } from "./parent_watch.ts";

/**
 * Seconds past --drain-timeout that a stopping server gets for what follows its drain (the
 * replica's goodbye, closing NATS, the batch queue and the engine) before it exits anyway.
 */
export const EXIT_GRACE_SECONDS = 10;

/** The start of the line written when a stop runs past its deadline. */
export const STOP_OVERRAN = "stop did not finish in time";

/** The exit code of a stop that ran past its deadline. */
export const DEADLINE_EXIT_CODE = 1;

/** The signals that stop a server: it drains, and a second one cuts the drain short. */
export const STOP_SIGNALS = ["SIGTERM", "SIGINT"] as const;

export interface StopDeadline {
  /** Names what the stop waits on now, for the line written should the deadline pass. */
  waitingOn(what: string): void;
}

/**
 * From the first stop request (SIGTERM, SIGINT or the launcher's end), the process exits within
 * `drainTimeoutSeconds` + `graceSeconds` (EXIT_GRACE_SECONDS), whatever it still waits on. A
 * drain waits on things outside the process (a NATS server that is gone or silent, a client);
 * with the launcher gone nobody is left to send the second signal that cuts it short, and a
 * wait that never ends would leave the server running as an orphan.
 *
 * Call it once the server's own signal listeners are in place: from here on a signal no longer
 * ends the process by Deno's default action.
 */
export function exitDeadline(
  drainTimeoutSeconds: number,
  log: (line: string) => void,
  graceSeconds = EXIT_GRACE_SECONDS,
): StopDeadline {
  let waiting = "the drain";
  let armed = false;
  const arm = (why: string) => {
    if (armed) return;
    armed = true;
    const seconds = drainTimeoutSeconds + graceSeconds;
    const timer = setTimeout(() => {
      log(
        `${STOP_OVERRAN}: ${seconds} s after ${why} (--drain-timeout ${drainTimeoutSeconds} s ` +
          `+ ${graceSeconds} s) it still waits on ${waiting}; exiting`,
      );
      Deno.exit(DEADLINE_EXIT_CODE);
    }, seconds * 1000);
    // Only a stop that hangs runs into it; one that ends exits on its own.
    Deno.unrefTimer(timer);
  };
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, () => arm(s));
  whenLauncherGone(() => arm("the launcher's end"));
  return { waitingOn: (what) => waiting = what };
}

/**
 * What a started server (serve, serve of several models, router) adds to its own signal
 * listeners: its launcher's end drains it as SIGTERM would, and any stop request ends the
 * process within the deadline (`exitDeadline`).
 */
export function stopOnRequest(
  server: { stop(): Promise<unknown> },
  drainTimeoutSeconds: number,
  log: (line: string) => void,
): StopDeadline {
  whenLauncherGone(() => {
    log(`${LAUNCHER_GONE}: draining as on SIGTERM`);
    void server.stop();
  });
  return exitDeadline(drainTimeoutSeconds, log);
}
