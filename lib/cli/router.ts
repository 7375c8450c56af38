import type { Config } from "./config.ts";
import { type Env, parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";
import { cappedLog, connectNats } from "../cluster/nats_connection.ts";
import { RouterBackend } from "../cluster/router_backend.ts";
import { ModelRouterDirectory } from "../cluster/model_router.ts";
import { createPlainRouter } from "../cluster/router_front.ts";
import { createModelsFront } from "../http/models_front.ts";
import { serveService } from "../http/serve.ts";
import { ServiceMetrics } from "../http/service_metrics.ts";
import { stopOnRequest } from "./stop_deadline.ts";
import { LAUNCHER_GONE, whenLauncherGone } from "./parent_watch.ts";
import { listenerOptions } from "./listener_options.ts";
import { drainedLine } from "./serve_lines.ts";
import { openFileLimit } from "../util/fd_limit.ts";
import type { RunNeeds } from "./permissions.ts";
import { batchQueueFor } from "./batch_queue_config.ts";

/** Parses `router` flags into the validated configuration. Exported for tests. */
export function parseRouterArgs(argv: readonly string[], env?: Env): Config & { nats: string } {
  const config = parseSettings("router", argv, env);
  if (config.nats === undefined) {
    throw new Error(
      "The router needs a NATS server: pass --nats nats://host:port (or set LLMSERVE_NATS); " +
        "`deno task router --help` lists every flag",
    );
  }
  return config as Config & { nats: string };
}

/** What a router touches, for the launcher: its listen address, the NATS servers, the creds. */
export function routerNeeds(c: Config): RunNeeds {
  return {
    model: "",
    mayDownload: false,
    host: c.host,
    nats: c.nats,
    natsCreds: c.natsCreds,
    batchQueue: { dataDir: c.dataDir },
  };
}

/**
 * `router` command: the public API of a single server, with every generation sent to a replica
 * over NATS. Waits for one replica to learn the model, then listens; drains on SIGTERM.
 */
export async function routerCommand(argv: string[]): Promise<number> {
  if (printInfo("router", argv)) return 0;
  const config = parseRouterArgs(argv);
  const log = (line: string) => console.error(line);
  const nc = await connectNats({
    url: config.nats,
    credsFile: config.natsCreds,
    name: "llmserve-router",
    log,
  });
  const metrics = new ServiceMetrics();
  if (config.byModel) return await routeByModel(config, nc, metrics, log);
  log(`router: connected to NATS ${nc.getServer()}; waiting for a replica`);
  // Waiting for a replica (up to a minute) it holds no request: a launcher gone meanwhile ends
  // it at once, with SIGTERM's exit code; once it listens, stopOnRequest drains it instead.
  let listening = false;
  whenLauncherGone(() => {
    if (listening) return;
    log(`${LAUNCHER_GONE}: stopping before it listens`);
    Deno.exit(143);
  });
  // One capped log for what peers cause, however many subscriptions hear it.
  const peerLog = cappedLog(log);
  const backend = await RouterBackend.start(nc, { policy: config.routing, metrics, log, peerLog });
  const { batches, dataDir } = batchQueueFor(config, log);
  const { service, directory } = createPlainRouter(nc, backend, {
    metrics,
    policy: config.routing,
    apiKeys: config.apiKey,
    cacheScope: config.cacheScope,
    drainTimeoutMs: config.drainTimeout * 1000,
    log,
    peerLog,
    extend: batches.attach,
  });
  const server = await serveService(service, {
    ...listenerOptions(config, openFileLimit()),
    onListen: (addr) => {
      log([
        `llmserve router ready`,
        `  model     ${backend.modelName} (context ${backend.contextLength}), served by ` +
        `replicas; a request naming another model its replicas serve goes to one serving it`,
        `  nats      ${nc.getServer()} (router ${backend.id})`,
        `  routing   ${config.routing}`,
        `  replicas  ${backend.registry.inRotation().map((v) => v.id).join(", ")}`,
        `  auth      ${config.apiKey.length > 0 ? `${config.apiKey.length} API key(s)` : "off"}`,
        `  batches   ${dataDir} (${config.batchConcurrency} lines at once, each routed as a request)`,
        `  url       http://${addr.hostname}:${addr.port}/  (playground; API under /v1)`,
      ].join("\n"));
    },
  });
  listening = true;
  // Started by the launcher, which is gone (killed without passing a signal on): drain.
  stopOnRequest(server, config.drainTimeout, log);
  const result = await server.closed;
  await batches.close();
  backend.close();
  await directory.close();
  await nc.close();
  log(`${drainedLine(result)}; ${backend.failovers} failover(s) served`);
  return 0;
}

/** `router --by-model`: every model the replicas serve, each request routed by its `model`. */
async function routeByModel(
  config: Config & { nats: string },
  nc: Awaited<ReturnType<typeof connectNats>>,
  metrics: ServiceMetrics,
  log: (line: string) => void,
): Promise<number> {
  const directory = new ModelRouterDirectory(nc, {
    policy: config.routing,
    apiKeys: config.apiKey,
    cacheScope: config.cacheScope,
    drainTimeoutMs: config.drainTimeout * 1000,
    log,
  });
  const { batches, dataDir } = batchQueueFor(config, log);
  const service = createModelsFront({
    pool: directory,
    catalog: () => directory.catalog(),
    metrics,
    modelMetrics: directory.modelMetrics,
    apiKeys: config.apiKey,
    drainTimeoutMs: config.drainTimeout * 1000,
    extend: batches.attach,
  });
  const server = await serveService(service, {
    ...listenerOptions(config, openFileLimit()),
    onListen: (addr) => {
      log([
        `llmserve router ready (by model)`,
        `  models    what the replicas' heartbeats name, each routed among its own replicas`,
        `  nats      ${nc.getServer()}`,
        `  routing   ${config.routing}`,
        `  auth      ${config.apiKey.length > 0 ? `${config.apiKey.length} API key(s)` : "off"}`,
        `  batches   ${dataDir} (${config.batchConcurrency} lines at once; each line's "model" picks)`,
        `  url       http://${addr.hostname}:${addr.port}/  (API under /v1; "model" picks)`,
      ].join("\n"));
    },
  });
  stopOnRequest(server, config.drainTimeout, log);
  const result = await server.closed;
  await batches.close();
  await nc.close();
  log(drainedLine(result));
  return 0;
}
