/**
 * `--log-level`: how much the server says on stderr beside its start-up and drain lines (always
 * written). Lines have a level and are written when it is at or above the chosen one: `error`
 * (failures), `warn` (a request answered 5xx, a failed accept), `info` (one line per request:
 * the default), `debug` (also the health, readiness and metrics probes that succeeded).
 */
export const LOG_LEVELS = ["error", "warn", "info", "debug"] as const;
export type LogLevel = typeof LOG_LEVELS[number];

/** True when a line of level `line` is written under the threshold `level`. */
export function logs(level: LogLevel, line: LogLevel): boolean {
  return LOG_LEVELS.indexOf(line) <= LOG_LEVELS.indexOf(level);
}

/** Writers for each level under `level`; a level below it writes nothing. */
export function leveledLog(
  level: LogLevel,
  sink: (line: string) => void = (line) => console.error(line),
): Record<LogLevel, (line: string) => void> {
  const at = (l: LogLevel) => logs(level, l) ? sink : () => {};
  return { error: at("error"), warn: at("warn"), info: at("info"), debug: at("debug") };
}
