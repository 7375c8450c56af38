import type { ReplicaAgent } from "../cluster/replica.ts";
import { whenLauncherGone } from "./parent_watch.ts";
import { STOP_SIGNALS } from "./stop_deadline.ts";

/** How a replica's drain ended: every NATS stream finished, or `aborted` were cut. */
export interface ReplicaDrained {
  readonly completed: boolean;
  readonly aborted: number;
}

/**
 * Starts the replica's drain on the first stop request: SIGTERM, SIGINT or the launcher's end,
 * so that it leaves the rotation at once while the HTTP side drains beside it. Returns the
 * drain itself, for whoever closes the server: it starts it when nothing has yet, and every
 * caller gets the one result. A drain started only by a signal left a replica whose launcher
 * was killed waiting for one, its HTTP side closed, for ever.
 */
export function drainOnStop(
  agent: ReplicaAgent,
  drainTimeoutSeconds: number,
): () => Promise<ReplicaDrained> {
  let drained: Promise<ReplicaDrained> | undefined;
  const drain = () => {
    for (const s of STOP_SIGNALS) Deno.removeSignalListener(s, drain);
    return drained ??= agent.drain(drainTimeoutSeconds * 1000);
  };
  for (const s of STOP_SIGNALS) Deno.addSignalListener(s, drain);
  whenLauncherGone(drain);
  return drain;
}
