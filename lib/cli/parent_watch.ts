/**
 * A command started by the launcher (`launch.ts`) gets a pipe from it as stdin. The launcher
 * never writes to it, so end-of-file means the launcher is gone, even when it was killed
 * without a chance to pass a signal on (SIGKILL): the command then stops as on SIGTERM instead
 * of serving on as an orphan.
 *
 * End-of-file stays: a launcher that died before the command got here (while it started, or
 * loaded its model) is seen as soon as the watch is armed, so arming late misses nothing.
 */

/** Set by the launcher in the child's environment. */
export const PARENT_PIPE_ENV = "LLMSERVE_PARENT_PIPE";

/** The start of the line a command writes when it stops because its launcher is gone. */
export const LAUNCHER_GONE = "launcher gone (it ended without passing a signal on)";

/** Resolves once stdin has ended; stdin has one reader, shared by every watcher. */
let gone: Promise<void> | undefined;

function launcherGone(): Promise<void> {
  gone ??= (async () => {
    try {
      for await (const _ of Deno.stdin.readable) {
        // The launcher writes nothing; anything read is ignored.
      }
    } catch {
      // A read error means the same: the other end is gone.
    }
  })();
  return gone;
}

/**
 * Calls `onGone` once stdin ends, when this process was started by the launcher. Each part of
 * a command that must stop (the HTTP side, a replica's NATS side, the exit deadline) watches
 * for itself, however late it is set up.
 */
export function whenLauncherGone(onGone: () => void): void {
  if (Deno.env.get(PARENT_PIPE_ENV) !== "1") return;
  void launcherGone().then(onGone);
}
