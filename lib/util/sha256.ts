import { createHash } from "node:crypto";

/** SHA-256 (lowercase hex) of an open file's whole content, read from its start in 1 MiB chunks. */
export async function sha256OfFile(file: Deno.FsFile): Promise<string> {
  const hash = createHash("sha256");
  await file.seek(0, Deno.SeekMode.Start);
  const buffer = new Uint8Array(1 << 20);
  for (;;) {
    const n = await file.read(buffer);
    if (n === null) break;
    hash.update(buffer.subarray(0, n));
  }
  return hash.digest("hex");
}

/** SHA-256 (lowercase hex) of the file at `path`. */
export async function sha256OfPath(path: string): Promise<string> {
  using file = await Deno.open(path, { read: true });
  return await sha256OfFile(file);
}

/**
 * SHA-256 (lowercase hex) of a text's UTF-8, computed synchronously: a caller that must decide in
 * the same turn (the grammar pool choosing a worker) cannot wait for WebCrypto's promise.
 */
export function sha256OfText(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}
