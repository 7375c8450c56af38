/**
 * A command started by the launcher (`launch.ts`) gets a pipe from it as stdin. The launcher
 * never writes to it, so end-of-file means the launcher is gone, even when it was killed
 * without a chance to pass a signal on (SIGKILL): the command then stops as on SIGTERM instead
 * of serving on as an orphan.
 */

/** Set by the launcher in the child's environment. */
export const PARENT_PIPE_ENV = "LLMSERVE_PARENT_PIPE";

/** Calls `onGone` once stdin ends, when this process was started by the launcher. */
export function whenLauncherGone(onGone: () => void): void {
  if (Deno.env.get(PARENT_PIPE_ENV) !== "1") return;
  (async () => {
    try {
      for await (const _ of Deno.stdin.readable) {
        // The launcher writes nothing; anything read is ignored.
      }
    } catch {
      // A read error means the same: the other end is gone.
    }
    onGone();
  })();
}
