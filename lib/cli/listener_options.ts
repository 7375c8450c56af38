import type { ServeOptions } from "../http/serve.ts";
import { defaultMaxConnections } from "../util/fd_limit.ts";
import type { Config } from "./config.ts";

/** The settings the HTTP listener takes from a command's configuration. */
export type ListenerConfig = Pick<
  Config,
  | "host"
  | "port"
  | "drainTimeout"
  | "maxConnections"
  | "headerTimeout"
  | "bodyTimeout"
  | "keepAliveTimeout"
>;

/** What serveService() is given from the configuration (the rest is each command's own). */
export type ListenerOptions = Required<
  Pick<
    ServeOptions,
    | "hostname"
    | "port"
    | "drainTimeoutMs"
    | "maxConnections"
    | "headerTimeoutMs"
    | "bodyTimeoutMs"
    | "keepAliveTimeoutMs"
  >
>;

/**
 * The one mapping of the configuration to the HTTP listener, for `serve`, a server of several
 * models and the router, so that none of them leaves a setting out. Seconds become
 * milliseconds; without `--max-connections`, the open-file limit `fdLimit` sets it.
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const config = {
 *   host: "127.0.0.1",
 *   port: 8080,
 *   drainTimeout: 30,
 *   maxConnections: undefined,
 *   headerTimeout: 2,
 *   bodyTimeout: 60,
 *   keepAliveTimeout: 5,
 * };
 * // 256 descriptors less the reserve (64 and a quarter of the limit).
 * assertEquals(listenerOptions(config, 256).maxConnections, 128);
 * assertEquals(listenerOptions(config, 256).headerTimeoutMs, 2000);
 * ```
 */
export function listenerOptions(
  config: ListenerConfig,
  fdLimit: number | undefined,
): ListenerOptions {
  return {
    hostname: config.host,
    port: config.port,
    drainTimeoutMs: config.drainTimeout * 1000,
    maxConnections: config.maxConnections ?? defaultMaxConnections(fdLimit),
    headerTimeoutMs: config.headerTimeout * 1000,
    bodyTimeoutMs: config.bodyTimeout * 1000,
    keepAliveTimeoutMs: config.keepAliveTimeout * 1000,
  };
}
