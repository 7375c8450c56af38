/**
 * The process's open-file limit (`ulimit -n`), from which the connection limit is derived:
 * every client connection holds a descriptor, and running out of them makes accept() fail.
 */

/** The soft "Max open files" limit, from /proc/self/limits (Linux); undefined elsewhere. */
export function openFileLimit(
  read: () => string = () => Deno.readTextFileSync("/proc/self/limits"),
): number | undefined {
  let text: string;
  try {
    text = read();
  } catch {
    return undefined;
  }
  const m = /^Max open files\s+(\d+|unlimited)\s/m.exec(text);
  if (m === null) return undefined;
  return m[1] === "unlimited" ? Number.MAX_SAFE_INTEGER : Number(m[1]);
}

/**
 * Descriptors kept for everything but client connections: model files, GPU, listener, logs,
 * and the connections past the limit that are accepted only to be closed. Their descriptors
 * are released a little after the close, so a burst of them needs room: with a 5 % reserve a
 * 400-connection burst under `ulimit -n 256` took the server to 242 of 256 descriptors and
 * its accepts stalled (1 run in 2 in CI); 25 % absorbs it.
 */
export function reservedDescriptors(limit: number): number {
  return 64 + Math.ceil(limit * 0.25);
}

/**
 * The default `--max-connections`: what the open-file limit leaves after the reserve, one
 * descriptor per connection; 1024 - (64 + 256) = 704 under the common `ulimit -n 1024`. Without
 * a known limit, that same 704, and at most 65,536 whatever the limit.
 */
export function defaultMaxConnections(limit: number | undefined): number {
  const l = limit ?? 1024;
  return Math.max(16, Math.min(65_536, l - reservedDescriptors(l)));
}
