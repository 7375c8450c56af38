/** Test helpers: the shared model files, and corrupted copies of them in a temp dir. */

/**
 * The models mirror the suite was given (env MODEL_MIRROR), for the servers and commands tests
 * start: the checkout need not sit beside the models. Fails loudly when it is unset.
 */
export function modelMirror(): string {
  const dir = Deno.env.get("MODEL_MIRROR");
  if (!dir) {
    throw new Error(
      "MODEL_MIRROR is unset: point it at the test models directory (e.g. MODEL_MIRROR=../shared/models)",
    );
  }
  return dir;
}

/** Path of a file in the models mirror (env MODEL_MIRROR); fails loudly when it is unset. */
export function modelFile(name: string): string {
  return `${modelMirror()}/${name}`;
}

/** Writes `bytes` as `name` into a fresh temp dir and returns the path. */
export async function tempFile(name: string, bytes: Uint8Array): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "gguf_test_" });
  const path = `${dir}/${name}`;
  await Deno.writeFile(path, bytes);
  return path;
}

/** Copies a shared model file into a temp dir after passing its bytes through `corrupt`. */
export async function corruptedCopy(
  name: string,
  corrupt: (bytes: Uint8Array) => Uint8Array,
): Promise<string> {
  const bytes = await Deno.readFile(modelFile(name));
  return tempFile(name, corrupt(bytes));
}

/** A GGUF string as stored: uint64 byte length, then UTF-8 bytes. */
export function ggufString(s: string): Uint8Array {
  const text = new TextEncoder().encode(s);
  const out = new Uint8Array(8 + text.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(text.length), true);
  out.set(text, 8);
  return out;
}

/** Offset of the only occurrence of `needle` in `bytes`; throws when there is none or several. */
export function findUnique(bytes: Uint8Array, needle: Uint8Array): number {
  const hits: number[] = [];
  outer: for (let i = 0; i + needle.length <= bytes.length; i++) {
    for (let j = 0; j < needle.length; j++) if (bytes[i + j] !== needle[j]) continue outer;
    hits.push(i);
  }
  if (hits.length !== 1) {
    throw new Error(`expected one occurrence of the pattern, found ${hits.length}`);
  }
  return hits[0]!;
}

/** Replaces the only occurrence of `from` with `to` (same length) in place and returns `bytes`. */
export function replaceUnique(bytes: Uint8Array, from: Uint8Array, to: Uint8Array): Uint8Array {
  if (from.length !== to.length) throw new Error("replacement must keep the length");
  bytes.set(to, findUnique(bytes, from));
  return bytes;
}

/** Offset of the ggml type field in the tensor info of `name` (after its name, n_dims and dims). */
export function tensorTypeFieldOffset(bytes: Uint8Array, name: string): number {
  const at = findUnique(bytes, ggufString(name)) + 8 + new TextEncoder().encode(name).length;
  const nDims = new DataView(bytes.buffer, bytes.byteOffset).getUint32(at, true);
  return at + 4 + nDims * 8;
}
