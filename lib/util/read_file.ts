/** Called as bytes arrive: bytes read so far and the total expected. */
export type ReadProgress = (bytesRead: number, total: number) => void;

const READ_CHUNK = 16 * 2 ** 20;

/**
 * Reads `into.byteLength` bytes from `position` (fewer at end of file) in chunks, reporting
 * progress after each, so multi-gigabyte weights show a moving bar. Returns the bytes read.
 */
export async function readFully(
  file: Deno.FsFile,
  position: number,
  into: Uint8Array,
  onProgress?: ReadProgress,
): Promise<number> {
  await file.seek(position, Deno.SeekMode.Start);
  let filled = 0;
  while (filled < into.byteLength) {
    const n = await file.read(
      into.subarray(filled, Math.min(into.byteLength, filled + READ_CHUNK)),
    );
    if (n === null) break;
    filled += n;
    onProgress?.(filled, into.byteLength);
  }
  return filled;
}

/** The first `n` bytes of an open file (fewer where it is shorter). */
export async function readHead(file: Deno.FsFile, n: number): Promise<Uint8Array> {
  const bytes = new Uint8Array(n);
  return bytes.subarray(0, await readFully(file, 0, bytes));
}

/** Reads a whole file into one buffer with progress (Deno.readFile has no progress hook). */
export async function readFileWithProgress(
  path: string,
  onProgress?: ReadProgress,
  allocate: (bytes: number) => Uint8Array = (n) => new Uint8Array(n),
): Promise<Uint8Array> {
  using file = await Deno.open(path, { read: true });
  const size = (await file.stat()).size;
  const bytes = allocate(size);
  const got = await readFully(file, 0, bytes, onProgress);
  return got === size ? bytes : bytes.subarray(0, got);
}
