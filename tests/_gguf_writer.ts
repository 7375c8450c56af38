/**
 * A minimal GGUF writer for tests, written from the spec independently of lib/gguf.ts, so files
 * it makes (with hand-chosen values) are an oracle for the reader.
 */

/** Value type numbers of the GGUF spec. */
export const T = {
  U8: 0,
  I8: 1,
  U16: 2,
  I16: 3,
  U32: 4,
  I32: 5,
  F32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  U64: 10,
  I64: 11,
  F64: 12,
} as const;

/** An array value: its element type and items (nested arrays are WArray items). */
export interface WArray {
  elementType: number;
  items: unknown[];
}

export interface WEntry {
  key: string;
  type: number;
  /** number | bigint | boolean | string, or a WArray when type is ARRAY. */
  value: unknown;
}

export interface WTensor {
  name: string;
  /** GGUF order: ne0 (innermost) first. */
  dims: number[];
  typeId: number;
  data: Uint8Array;
  /** Its offset in the data section (default: after the previous one, aligned). */
  offset?: number;
}

export interface WFile {
  version?: number;
  metadata: WEntry[];
  tensors?: WTensor[];
  /** Alignment used for padding; write a `general.alignment` entry yourself to declare a non-default one. */
  alignment?: number;
}

class Bytes {
  private buf = new Uint8Array(1024);
  private view = new DataView(this.buf.buffer);
  length = 0;
  private grow(n: number) {
    if (this.length + n <= this.buf.length) return;
    const next = new Uint8Array(Math.max(this.buf.length * 2, this.length + n));
    next.set(this.buf);
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  put(n: number, f: (v: DataView, o: number) => void) {
    this.grow(n);
    f(this.view, this.length);
    this.length += n;
  }
  bytes(b: Uint8Array) {
    this.put(b.length, (_, o) => this.buf.set(b, o));
  }
  pad(alignment: number) {
    const target = Math.ceil(this.length / alignment) * alignment;
    this.bytes(new Uint8Array(target - this.length));
  }
  result(): Uint8Array {
    return this.buf.slice(0, this.length);
  }
}

const enc = new TextEncoder();

function u32(b: Bytes, v: number) {
  b.put(4, (d, o) => d.setUint32(o, v, true));
}
function u64(b: Bytes, v: number | bigint) {
  b.put(8, (d, o) => d.setBigUint64(o, BigInt(v), true));
}
function str(b: Bytes, s: string) {
  const e = enc.encode(s);
  u64(b, e.length);
  b.bytes(e);
}

function value(b: Bytes, type: number, v: unknown) {
  switch (type) {
    case T.U8:
      return b.put(1, (d, o) => d.setUint8(o, v as number));
    case T.I8:
      return b.put(1, (d, o) => d.setInt8(o, v as number));
    case T.U16:
      return b.put(2, (d, o) => d.setUint16(o, v as number, true));
    case T.I16:
      return b.put(2, (d, o) => d.setInt16(o, v as number, true));
    case T.U32:
      return b.put(4, (d, o) => d.setUint32(o, v as number, true));
    case T.I32:
      return b.put(4, (d, o) => d.setInt32(o, v as number, true));
    case T.F32:
      return b.put(4, (d, o) => d.setFloat32(o, v as number, true));
    case T.BOOL:
      return b.put(1, (d, o) => d.setUint8(o, v ? 1 : 0));
    case T.STRING:
      return str(b, v as string);
    case T.U64:
      return b.put(8, (d, o) => d.setBigUint64(o, BigInt(v as number), true));
    case T.I64:
      return b.put(8, (d, o) => d.setBigInt64(o, BigInt(v as number), true));
    case T.F64:
      return b.put(8, (d, o) => d.setFloat64(o, v as number, true));
    case T.ARRAY: {
      const a = v as WArray;
      u32(b, a.elementType);
      u64(b, a.items.length);
      for (const item of a.items) value(b, a.elementType, item);
      return;
    }
    default:
      throw new Error(`writer: unknown type ${type}`);
  }
}

/** Encodes a GGUF file; tensor offsets are assigned in order, each aligned. */
export function writeGguf(f: WFile): Uint8Array {
  const alignment = f.alignment ?? 32;
  const tensors = f.tensors ?? [];
  const b = new Bytes();
  b.bytes(enc.encode("GGUF"));
  u32(b, f.version ?? 3);
  u64(b, tensors.length);
  u64(b, f.metadata.length);
  for (const e of f.metadata) {
    str(b, e.key);
    u32(b, e.type);
    value(b, e.type, e.value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    offset = t.offset ?? Math.ceil(offset / alignment) * alignment;
    offsets.push(offset);
    str(b, t.name);
    u32(b, t.dims.length);
    for (const d of t.dims) u64(b, d);
    u32(b, t.typeId);
    u64(b, offset);
    offset += t.data.length;
  }
  b.pad(alignment);
  // Laid out by offset, so a test can make tensors overlap.
  const end = Math.max(0, ...tensors.map((t, i) => offsets[i]! + t.data.length));
  const data = new Uint8Array(end);
  tensors.forEach((t, i) => data.set(t.data, offsets[i]!));
  b.bytes(data);
  return b.result();
}

/**
 * A copy of a GGUF file with `entries` added to its metadata, read no further than its fixed
 * header: they go first, with a padding entry that makes them a multiple of 4096 bytes long, so
 * that every later byte (the other entries, the tensor infos, the data at its alignment, which
 * divides 4096) keeps its place relative to them.
 */
export function withMetadata(file: Uint8Array, entries: WEntry[]): Uint8Array {
  const head = new DataView(file.buffer, file.byteOffset, 24);
  const encode = (list: WEntry[]) => {
    const b = new Bytes();
    for (const e of list) {
      str(b, e.key);
      u32(b, e.type);
      value(b, e.type, e.value);
    }
    return b.result();
  };
  const key = "llmserve.test.padding";
  const bare = encode([...entries, { key, type: T.STRING, value: "" }]).length;
  const added = encode([
    ...entries,
    { key, type: T.STRING, value: " ".repeat((4096 - (bare % 4096)) % 4096) },
  ]);
  const out = new Uint8Array(file.length + added.length);
  out.set(file.subarray(0, 24));
  new DataView(out.buffer).setBigUint64(
    16,
    head.getBigUint64(16, true) + BigInt(entries.length + 1),
    true,
  );
  out.set(added, 24);
  out.set(file.subarray(24), 24 + added.length);
  return out;
}

/** Little-endian f32 bytes of the given values. */
export function f32Bytes(values: number[]): Uint8Array {
  const out = new Uint8Array(values.length * 4);
  const v = new DataView(out.buffer);
  values.forEach((x, i) => v.setFloat32(i * 4, x, true));
  return out;
}

/** A deterministic pseudo-random f32 tensor of n elements (a linear congruential sequence in [-1, 1)). */
export function pseudoRandomF32(n: number, seed: number): number[] {
  let s = seed >>> 0;
  return Array.from({ length: n }, () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return Math.fround(s / 2 ** 31 - 1);
  });
}

export interface TinyLlamaOptions {
  /** Metadata keys to leave out. */
  omit?: string[];
  /** Metadata entries to add or replace. */
  extra?: WEntry[];
  /** Tensor names to leave out. */
  omitTensors?: string[];
  /** Shape overrides (GGUF order) by tensor name. */
  dims?: Record<string, number[]>;
  /** `general.architecture` and the prefix of the hyper-parameter keys (default "llama"). */
  arch?: string;
  /** More F32 tensors (GGUF-order dims), e.g. a qwen2 file's biases. */
  addTensors?: [string, number[]][];
}

/** Hyper-parameters of the tiny model {@link tinyLlamaGguf} writes. */
export const TINY = { dim: 8, heads: 2, kvHeads: 1, ff: 12, layers: 2, vocab: 6, ctx: 16 } as const;

/** A small but complete llama GGUF with F32 weights and a 6-token SentencePiece vocabulary. */
export function tinyLlamaGguf(opts: TinyLlamaOptions = {}): Uint8Array {
  const { dim, heads, kvHeads, ff, layers, vocab, ctx } = TINY;
  const kvDim = (dim / heads) * kvHeads;
  const a = opts.arch ?? "llama";
  let meta: WEntry[] = [
    { key: "general.architecture", type: T.STRING, value: a },
    { key: "general.name", type: T.STRING, value: "tiny" },
    { key: `${a}.context_length`, type: T.U32, value: ctx },
    { key: `${a}.embedding_length`, type: T.U32, value: dim },
    { key: `${a}.block_count`, type: T.U32, value: layers },
    { key: `${a}.feed_forward_length`, type: T.U32, value: ff },
    { key: `${a}.attention.head_count`, type: T.U32, value: heads },
    { key: `${a}.attention.head_count_kv`, type: T.U32, value: kvHeads },
    { key: `${a}.rope.freq_base`, type: T.F32, value: 500000 },
    { key: `${a}.rope.dimension_count`, type: T.U32, value: dim / heads },
    { key: `${a}.attention.layer_norm_rms_epsilon`, type: T.F32, value: 1e-6 },
    { key: "tokenizer.ggml.model", type: T.STRING, value: "llama" },
    {
      key: "tokenizer.ggml.tokens",
      type: T.ARRAY,
      value: { elementType: T.STRING, items: ["<unk>", "<s>", "</s>", "<0x0A>", "▁a", "▁b"] },
    },
    {
      key: "tokenizer.ggml.scores",
      type: T.ARRAY,
      value: { elementType: T.F32, items: [0, 0, 0, 0, -1, -2] },
    },
    {
      key: "tokenizer.ggml.token_type",
      type: T.ARRAY,
      value: { elementType: T.I32, items: [2, 3, 3, 6, 1, 1] },
    },
    { key: "tokenizer.ggml.bos_token_id", type: T.U32, value: 1 },
    { key: "tokenizer.ggml.eos_token_id", type: T.U32, value: 2 },
  ];
  meta = meta.filter((e) => !opts.omit?.includes(e.key));
  for (const e of opts.extra ?? []) meta = [...meta.filter((m) => m.key !== e.key), e];

  const shapes: [string, number[]][] = [["token_embd.weight", [dim, vocab]], [
    "output_norm.weight",
    [dim],
  ], [
    "output.weight",
    [dim, vocab],
  ]];
  for (let l = 0; l < layers; l++) {
    shapes.push(
      [`blk.${l}.attn_norm.weight`, [dim]],
      [`blk.${l}.attn_q.weight`, [dim, dim]],
      [`blk.${l}.attn_k.weight`, [dim, kvDim]],
      [`blk.${l}.attn_v.weight`, [dim, kvDim]],
      [`blk.${l}.attn_output.weight`, [dim, dim]],
      [`blk.${l}.ffn_norm.weight`, [dim]],
      [`blk.${l}.ffn_gate.weight`, [dim, ff]],
      [`blk.${l}.ffn_down.weight`, [ff, dim]],
      [`blk.${l}.ffn_up.weight`, [dim, ff]],
    );
  }
  shapes.push(...(opts.addTensors ?? []));
  const tensors: WTensor[] = shapes
    .filter(([name]) => !opts.omitTensors?.includes(name))
    .map(([name, d], i) => {
      const dims = opts.dims?.[name] ?? d;
      return {
        name,
        dims,
        typeId: 0,
        data: f32Bytes(pseudoRandomF32(dims.reduce((a, b) => a * b, 1), i + 1)),
      };
    });
  return writeGguf({ metadata: meta, tensors });
}
