/**
 * The grammar engine started in the background once a model is served (issue 40, finding 12):
 * a first response_format request would otherwise wait for XGrammar to take in a 150k
 * vocabulary (1-3 s), and the process grows by it then, unannounced. What it took is measured
 * and said on a `memory` line. A start that fails is only logged: the request path starts it
 * again on the next constrained request (a 503 meanwhile), as without the preload.
 */
import type { GrammarService } from "../grammar/grammar_service.ts";
import { formatBytes } from "../util/byte_size.ts";

/** What starting the grammar engine took. */
export interface GrammarStart {
  /** Growth of the process's resident memory across the start (other work included). */
  readonly rssBytes: number;
  /** XGrammar's WebAssembly heap in each worker started. */
  readonly heapBytes: readonly number[];
  readonly ms: number;
}

/** Starts the engine (`start`: the lazy service's own getter) and measures it. */
export async function preloadGrammar(
  start: () => Promise<GrammarService>,
): Promise<GrammarStart> {
  const rss0 = Deno.memoryUsage().rss;
  const t0 = performance.now();
  const service = await start();
  return {
    rssBytes: Math.max(0, Deno.memoryUsage().rss - rss0),
    heapBytes: service.heapBytes(),
    ms: performance.now() - t0,
  };
}

/**
 * The ready summary's memory note while the engine starts, or why it does not; `flag`: with how
 * to change it (the several-models load line leaves that to the ready summary).
 */
export function grammarPendingNote(preload: boolean, flag = true): string {
  const note = preload
    ? "grammar engine starting in the background"
    : "grammar engine on the first constrained request";
  return flag
    ? `${note} (${
      preload ? "--grammar-preload=false: on the first one" : "--grammar-preload=false"
    })`
    : note;
}

/** "grammar engine +104.6 MiB resident (1 worker, XGrammar heap 16.2 MiB), ready in 1.6 s". */
export function grammarStartNote(s: GrammarStart): string {
  const workers = s.heapBytes.length;
  return `grammar engine +${formatBytes(s.rssBytes)} resident (${workers} worker${
    workers === 1 ? "" : "s"
  }, XGrammar heap ${s.heapBytes.map(formatBytes).join(" + ")}), ready in ${
    (s.ms / 1000).toFixed(1)
  } s; a second worker starts only while two compiles overlap`;
}

/**
 * Starts the engine in the background and logs the outcome: `memory    grammar engine …`, or
 * why it could not start (the next constrained request tries again).
 */
export function startGrammarInBackground(
  start: () => Promise<GrammarService>,
  log: (line: string) => void,
  prefix = "  memory    ",
): void {
  preloadGrammar(start).then(
    (s) => log(`${prefix}${grammarStartNote(s)}`),
    (e) =>
      log(
        `${prefix}grammar engine could not start in the background (${
          e instanceof Error ? e.message : e
        }); the next constrained request tries again`,
      ),
  );
}
