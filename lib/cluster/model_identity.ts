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

/**
 * modelIdentity(), or undefined where the file cannot be read again (moved, deleted): the model
 * is still served, routers match it by its name alone, and the log says so and why.
 */
export async function identityOrWarning(
  path: string,
  contextLength: number,
  log: (line: string) => void,
): Promise<string | undefined> {
  try {
    return await modelIdentity(path, contextLength);
  } catch (e) {
    log(
      `warning: cannot read ${path} again for its identity (${
        e instanceof Error ? e.message : String(e)
      }); routers will match this model by its name alone`,
    );
    return undefined;
  }
}
