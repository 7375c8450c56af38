/**
 * What the serving commands (`serve`, several models, `router`) write about their own streams
 * and their end, written once so the three servers' lines cannot drift apart.
 */
import type { RequestLog } from "../http/request_log.ts";
import { statusOfCode } from "../http/errors.ts";
import type { ServedLog } from "../cluster/replica.ts";

/** The request log's record of a stream served over NATS: method NATS, its request id. */
export function natsServedLog(
  requestLog: RequestLog,
): (requestId: string, route: "generate" | "embed") => ServedLog {
  return (requestId, route) => {
    const r = requestLog.record(requestId, "NATS", route);
    return {
      firstToken: () => r.firstToken(),
      finished: (e) => {
        r.code = e.code;
        r.promptTokens = e.promptTokens;
        r.completionTokens = e.completionTokens;
        r.cached = e.cached;
        // 499: the router went away mid-stream (nginx's "client closed request").
        r.responded(e.code === undefined ? 200 : statusOfCode(e.code) ?? 499);
      },
    };
  };
}

/**
 * The line a server prints once it has drained.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * assertEquals(
 *   drainedLine({ completed: false, aborted: 2 }),
 *   "drained: 2 aborted at the deadline",
 * );
 * ```
 */
export function drainedLine(result: { completed: boolean; aborted: number }): string {
  return `drained: ${
    result.completed
      ? "all in-flight generations finished"
      : `${result.aborted} aborted at the deadline`
  }`;
}
