/**
 * The front of a plain router (`deno task router` without `--by-model`): createApp over its
 * RouterBackend (its own model, the first one a replica told it) answers every request that
 * names that model, one of its aliases, or no model, and everything about the router (/health,
 * /ready, /metrics, the playground). Its model dispatch (lib/http/model_dispatch.ts) sends a
 * request naming another model that replicas advertise (a replica of several models serves
 * more than its first) to that model's app from a {@link ModelRouterDirectory}, which routes it
 * by the router's policy among the replicas serving it; /v1/models lists those models too, and a
 * model no replica serves is a 404 naming every served one.
 */
import { type AppOptions, createApp, type DrainResult, type ServiceApp } from "../http/app.ts";
import { namesOf, unknownModel } from "../http/model_catalog.ts";
import { dispatchedOpenAi, leasedOpenAi, otherModelDispatch } from "../http/model_dispatch.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";
import { ModelRouterDirectory, type ModelRouterOptions } from "./model_router.ts";
import type { BusConnection } from "./nats_connection.ts";
import type { RouterBackend } from "./router_backend.ts";

/**
 * A plain router's service over its started RouterBackend: the app over that backend (its own
 * model), a directory of the other models replicas advertise, and the dispatch between them.
 */
export function createPlainRouter(
  nc: BusConnection,
  backend: RouterBackend,
  opts: ModelRouterOptions & {
    readonly metrics: ServiceMetrics;
    /** Routes mounted beside the API (the Batch API); their completions are routed as requests. */
    readonly extend?: AppOptions["extend"];
  },
): { service: ServiceApp; directory: ModelRouterDirectory } {
  const { metrics, extend, ...routing } = opts;
  const model = backend.modelName;
  /** The names its app accepts (read at each request): the aliases replicas advertise join. */
  const own = [model];
  const directory = new ModelRouterDirectory(nc, {
    ...routing,
    servedElsewhere: (name) => name === model,
  });
  const ownNames = (): string[] => {
    for (const alias of directory.aliasesOf(model)) {
      if (!own.includes(alias) && directory.resolve(alias) === model) own.push(alias);
    }
    return own;
  };
  const others = () => directory.catalog().filter((m) => !ownNames().includes(m.name));
  const other = (asked: string) => {
    const name = directory.resolve(asked);
    return name !== undefined && directory.has(name) ? name : undefined;
  };
  const unknown = (asked: unknown) =>
    unknownModel(asked, [...ownNames(), ...others().flatMap(namesOf)]);
  const primary = createApp({
    backend,
    metrics,
    servedModelNames: own,
    moreModels: others,
    dispatch: (door) => {
      const pick = otherModelDispatch({
        isOwn: (asked) => ownNames().includes(asked),
        resolve: other,
        acquire: (name) => directory.acquire(name),
        unknown,
      })(door);
      // The aliases replicas advertise for its model join its names before a route reads them.
      return (c, next) => {
        ownNames();
        return pick(c, next);
      };
    },
    ...(opts.apiKeys === undefined ? {} : { apiKeys: opts.apiKeys }),
    ...(opts.cacheScope === undefined ? {} : { cacheScope: opts.cacheScope }),
    ...(opts.drainTimeoutMs === undefined ? {} : { drainTimeoutMs: opts.drainTimeoutMs }),
    ...(extend === undefined ? {} : {
      extend: (app, ctx) => {
        // A batch line runs as a request would: on its own model's app, or another's.
        const openAi = dispatchedOpenAi((fields) => {
          const asked = fields?.model;
          if (typeof asked !== "string" || ownNames().includes(asked)) {
            return { run: () => Promise.resolve({ run: ctx.openAi, release() {} }) };
          }
          const name = other(asked);
          if (name === undefined) throw unknown(asked);
          return { run: () => leasedOpenAi(name, () => directory.acquire(name)) };
        });
        extend(app, { ...ctx, openAi });
      },
    }),
  });
  const all = () => [primary, ...directory.loaded().map((m) => m.service)];
  const service: ServiceApp = {
    ...primary,
    fetch: (req, info) => primary.fetch(req, info),
    async drain(d = {}): Promise<DrainResult> {
      const results = await Promise.all(all().map((s) => s.drain(d)));
      return {
        completed: results.every((r) => r.completed),
        aborted: results.reduce((n, r) => n + r.aborted, 0),
      };
    },
    hurry: () => all().forEach((s) => s.hurry()),
    get draining() {
      return primary.draining;
    },
    get inFlight() {
      return all().reduce((n, s) => n + s.inFlight, 0);
    },
    get sockets() {
      return all().reduce((n, s) => n + s.sockets, 0);
    },
    close: () => all().forEach((s) => s.close()),
  };
  return { service, directory };
}
