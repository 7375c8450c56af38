/**
 * Ollama's `keep_alive`: a number of seconds, or a Go-style duration ("30s", "5m", "1h30m",
 * "250ms"); 0 means "unload as soon as it is idle", any negative value "keep it forever".
 * Returns milliseconds (Infinity for forever), or an error message naming what was received.
 */
export function parseKeepAlive(value: unknown): number | string {
  if (typeof value === "number") {
    if (!Number.isFinite(value)) return `expected a number of seconds, received ${value}`;
    return value < 0 ? Infinity : value * 1000;
  }
  if (typeof value !== "string") {
    return `expected a number of seconds or a duration like "5m", received ${
      JSON.stringify(value) ?? String(value)
    }`;
  }
  const text = value.trim();
  if (/^-?\d+(\.\d+)?$/.test(text)) return parseKeepAlive(Number(text));
  const unit: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  const part = /(\d+(?:\.\d+)?)(ms|s|m|h)/y;
  const negative = text.startsWith("-");
  let at = negative ? 1 : 0;
  let ms = 0;
  if (at >= text.length) return badDuration(value);
  while (at < text.length) {
    part.lastIndex = at;
    const m = part.exec(text);
    if (m === null) return badDuration(value);
    ms += Number(m[1]) * unit[m[2]!]!;
    at = part.lastIndex;
  }
  return negative ? (ms === 0 ? 0 : Infinity) : ms;
}

function badDuration(value: string): string {
  return `expected a number of seconds or a duration like "30s", "5m" or "1h" (negative: ` +
    `forever), received ${JSON.stringify(value)}`;
}

/** Milliseconds as the shortest duration text ("5m", "90s", "forever"). */
export function formatKeepAlive(ms: number): string {
  if (ms === Infinity) return "forever";
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`;
  if (ms % 1000 === 0) return `${ms / 1000}s`;
  return `${ms}ms`;
}
