/**
 * A value as one frame: JSON for its shape, with its typed arrays (activation rows, logits,
 * token masks) after it as raw bytes rather than as JSON numbers, and its non-finite numbers
 * (a logprob of -Infinity) kept as such. Layout: u32 JSON byte count, the JSON, then each
 * array's bytes at a 4-byte boundary.
 */

const KINDS = {
  f32: Float32Array,
  f64: Float64Array,
  i32: Int32Array,
  u32: Uint32Array,
} as const;
type Kind = keyof typeof KINDS;

function kindOf(v: ArrayBufferView): Kind | undefined {
  for (const [k, C] of Object.entries(KINDS)) if (v instanceof C) return k as Kind;
  return undefined;
}

const pad4 = (n: number) => (n + 3) & ~3;

/** Encodes `value`; throws for a typed array of a kind it does not carry. */
export function encodeFrame(value: unknown): Uint8Array {
  const blobs: { kind: Kind; bytes: Uint8Array }[] = [];
  const json = JSON.stringify(value, (_key, v) => {
    if (typeof v === "number" && !Number.isFinite(v)) return { $n: String(v) };
    if (!ArrayBuffer.isView(v)) return v;
    const kind = kindOf(v);
    if (kind === undefined) throw new Error(`Cannot encode a ${v.constructor.name} in a frame`);
    blobs.push({ kind, bytes: new Uint8Array(v.buffer, v.byteOffset, v.byteLength) });
    return { $b: blobs.length - 1 };
  });
  const head = new TextEncoder().encode(
    JSON.stringify({ v: json, b: blobs.map((b) => [b.kind, b.bytes.byteLength]) }),
  );
  let size = pad4(4 + head.byteLength);
  for (const b of blobs) size += pad4(b.bytes.byteLength);
  const out = new Uint8Array(size);
  new DataView(out.buffer).setUint32(0, head.byteLength, true);
  out.set(head, 4);
  let at = pad4(4 + head.byteLength);
  for (const b of blobs) {
    out.set(b.bytes, at);
    at += pad4(b.bytes.byteLength);
  }
  return out;
}

/** Decodes a frame encodeFrame made; throws naming what is malformed. */
export function decodeFrame(bytes: Uint8Array): unknown {
  const fail = (what: string): never => {
    throw new Error(`Malformed frame of ${bytes.byteLength} bytes: ${what}`);
  };
  if (bytes.byteLength < 4) fail("no header length");
  const n = new DataView(bytes.buffer, bytes.byteOffset, 4).getUint32(0, true);
  if (4 + n > bytes.byteLength) fail(`a header of ${n} bytes does not fit`);
  let head: { v?: unknown; b?: unknown };
  try {
    head = JSON.parse(new TextDecoder().decode(bytes.subarray(4, 4 + n)));
  } catch (e) {
    return fail(`its header is not JSON (${(e as Error).message})`);
  }
  if (typeof head.v !== "string" || !Array.isArray(head.b)) fail("its header lacks v or b");
  let at = pad4(4 + n);
  const blobs = (head.b as unknown[]).map((entry, i) => {
    const [kind, len] = Array.isArray(entry) ? entry : [];
    const C = KINDS[kind as Kind];
    if (!C || !Number.isInteger(len) || len < 0 || len % C.BYTES_PER_ELEMENT !== 0) {
      return fail(`array ${i} is described as ${JSON.stringify(entry)}`);
    }
    if (at + len > bytes.byteLength) fail(`array ${i} of ${len} bytes runs past the end`);
    const copy = bytes.slice(at, at + len);
    at += pad4(len);
    return new C(copy.buffer, 0, len / C.BYTES_PER_ELEMENT);
  });
  try {
    return JSON.parse(head.v as string, (_key, v) => {
      if (v === null || typeof v !== "object" || Array.isArray(v)) return v;
      if ("$b" in v) return blobs[v.$b] ?? fail(`it names array ${v.$b} of ${blobs.length}`);
      if ("$n" in v) return Number(v.$n);
      return v;
    });
  } catch (e) {
    if ((e as Error).message.startsWith("Malformed")) throw e;
    return fail(`its value is not JSON (${(e as Error).message})`);
  }
}
