/**
 * Why the router gave up one attempt at a generation on one replica. Every loss fails over to
 * another replica exactly (prompt + the tokens delivered); the kind is what the metrics and
 * the log report, and what decides whether the replica is avoided for the next attempt.
 */
export type StreamLoss =
  /** The replica said goodbye (it stopped) while the stream was open. */
  | { readonly kind: "replica_gone"; readonly replica: string }
  /** No frame and no heartbeat listing the stream for `silentMs`: the replica died or hangs. */
  | { readonly kind: "timed_out"; readonly replica: string; readonly silentMs: number }
  /** Frame `seq` arrived where `expected` was due: frames were lost mid-way (a reconnect). */
  | {
    readonly kind: "frames_lost";
    readonly replica: string;
    readonly seq: number;
    readonly expected: number;
  }
  /** The replica lists the stream in its heartbeats but sent no frame for `quietMs`. */
  | { readonly kind: "no_progress"; readonly replica: string; readonly quietMs: number }
  /** The replica refused it before it began (overloaded or draining). */
  | { readonly kind: "refused"; readonly replica: string; readonly code: string };

export type StreamLossKind = StreamLoss["kind"];

/** The label of each kind in llm_router_lost_streams_total{why}. */
export const LOSS_LABEL: Record<StreamLossKind, string> = {
  replica_gone: "goodbye",
  timed_out: "silent",
  frames_lost: "gap",
  no_progress: "no_progress",
  refused: "refused",
};

/** Whether the next attempt should avoid the replica (one that looks alive but is not). */
export function avoidsReplica(loss: StreamLoss): boolean {
  return loss.kind === "no_progress" || loss.kind === "refused";
}

/** The loss in words, for the log. */
export function describeLoss(loss: StreamLoss): string {
  switch (loss.kind) {
    case "replica_gone":
      return `replica ${loss.replica} said goodbye`;
    case "timed_out":
      return `no frame and no heartbeat from replica ${loss.replica} for ${
        Math.round(loss.silentMs)
      } ms`;
    case "frames_lost":
      return `frame ${loss.seq} arrived where ${loss.expected} was due (messages were lost)`;
    case "no_progress":
      return `no progress: replica ${loss.replica} lists the stream but sent no frame for ${
        Math.round(loss.quietMs)
      } ms`;
    case "refused":
      return `replica ${loss.replica} refused it (${loss.code}) before it began`;
  }
}
