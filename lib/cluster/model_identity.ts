/**
 * A model's identity for routers: file size, the SHA-256 of its first 64 KiB (GGUF metadata,
 * or a llama2.c header and first weights) and the context it is served with. A stem is not
 * enough: stories260K.bin (context 512) and stories260K.gguf (context 128) share one.
 */
export async function modelIdentity(path: string, contextLength: number): Promise<string> {
  const file = await Deno.open(path);
  try {
    const size = (await file.stat()).size;
    const head = new Uint8Array(Math.min(size, 64 * 1024));
    let got = 0;
    while (got < head.length) {
      const n = await file.read(head.subarray(got));
      if (n === null) break;
      got += n;
    }
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", head.subarray(0, got)));
    const hex = Array.from(digest.subarray(0, 8), (b) => b.toString(16).padStart(2, "0")).join("");
    return `${size}-${hex}-ctx${contextLength}`;
  } finally {
    file.close();
  }
}

/** The log line of a model served without an identity: routers then match it by name alone. */
export function identityWarning(path: string, e: unknown): string {
  return `warning: cannot read ${path} again for its identity (${
    e instanceof Error ? e.message : String(e)
  }); routers will match this model by its name alone`;
}
