import type { CoreStats, GenerationBackend } from "../core/generation.ts";
import { createApp } from "./app.ts";

/** What a model with nothing loaded or running reports: nothing running, nothing held. */
export const IDLE_STATS: CoreStats = {
  running: 0,
  waiting: 0,
  kvBlocksUsed: 0,
  kvBlocksTotal: 0,
  prefixCacheHitRate: 0,
  steps: 0,
  lastBatchSize: 0,
  executorHealthy: true,
};
import type { RegisteredRoute } from "./route_table.ts";

/** Nothing to run: the app built over it is only read for its routes, never served. */
const ROUTES_ONLY: GenerationBackend = {
  modelName: "",
  contextLength: 0,
  generate: () => {
    throw new Error("the routes-only app runs no generations");
  },
  countTokens: () => 0,
  tokenize: () => [],
  detokenize: () => "",
  tokenPiece: () => "",
  bosToken: "",
  eosToken: "",
  specialTokens: [],
  stats: (): CoreStats => IDLE_STATS,
};

let routes: readonly RegisteredRoute[] | undefined;

/**
 * The routes a model's app (createApp) serves, known without a model: the front of a server of
 * several models answers a path no app serves with 404 (or 405) itself, and so never loads,
 * waits for or evicts a model for it. Read from hono's own table of an app built over a
 * backend that never runs, so there is no second list to keep in step.
 */
export function appRoutes(): readonly RegisteredRoute[] {
  routes ??= createApp({ backend: ROUTES_ONLY }).app.routes
    .map(({ method, path }) => ({ method, path }));
  return routes;
}
