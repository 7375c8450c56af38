/**
 * A server's configuration: the settings table's values (settings.ts) as `serve` and the
 * router read them, and the rules that join two settings.
 */
import { formatKeepAlive } from "../util/duration.ts";
import { type Env, resolveSettings } from "./flag_parser.ts";
import { DEFAULT_MAX_KEEP_ALIVE_MS, type SettingName, type Settings } from "./settings.ts";

export type Config = Settings;

/**
 * `serve`'s configuration from flag values by setting (as typed) and the environment. Throws
 * an Error whose message lists every invalid setting with the value received.
 */
export function resolveConfig(
  flags: Partial<Record<SettingName, unknown>>,
  env?: Env,
): Config {
  return resolveSettings("serve", flags, env);
}

/**
 * The longest keep_alive a request may ask (ms, Infinity: no cap). Given, it must be at least
 * --keep-alive: otherwise a request naming no keep_alive would get more than any naming one.
 */
export function maxKeepAlive(c: Pick<Config, "keepAlive" | "maxKeepAlive">): number {
  if (c.maxKeepAlive === undefined) return Math.max(DEFAULT_MAX_KEEP_ALIVE_MS, c.keepAlive);
  if (c.keepAlive > c.maxKeepAlive) {
    throw new Error(
      `Invalid configuration: --keep-alive ${formatKeepAlive(c.keepAlive)} is longer than ` +
        `--max-keep-alive ${formatKeepAlive(c.maxKeepAlive)}; raise --max-keep-alive ` +
        `(-1 lets requests keep models forever) or lower --keep-alive`,
    );
  }
  return c.maxKeepAlive;
}
