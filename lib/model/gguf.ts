import { ByteStrings } from "../util/byte_strings.ts";
import { readFully, type ReadProgress } from "../util/read_file.ts";
import { byteSize, type Tensor, type TensorType } from "./tensor.ts";
import { FORMATS } from "../formats/mod.ts";

/**
 * GGUF (v2 and v3) reader: header, metadata, tensor infos and tensor data as views of the raw
 * bytes. Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
 *
 * Integer metadata of 64 bits (uint64, int64) comes back as a `number` when it fits in a
 * double exactly (|v| <= 2^53 - 1) and as a `bigint` otherwise; arrays of 64-bit integers come
 * back as BigUint64Array / BigInt64Array, so their element type never depends on the values.
 */

/** Metadata value types, numbered as in the file. */
export const GgufValueType = {
  UINT8: 0,
  INT8: 1,
  UINT16: 2,
  INT16: 3,
  UINT32: 4,
  INT32: 5,
  FLOAT32: 6,
  BOOL: 7,
  STRING: 8,
  ARRAY: 9,
  UINT64: 10,
  INT64: 11,
  FLOAT64: 12,
} as const;
export type GgufValueType = (typeof GgufValueType)[keyof typeof GgufValueType];

/** A metadata array: a typed array for numeric elements, plain arrays for bools, strings and nested arrays. */
export type GgufArray =
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array
  | Float32Array
  | Float64Array
  | BigUint64Array
  | BigInt64Array
  | boolean[]
  | string[]
  | ByteStrings
  | GgufArray[];

/** A metadata value. 64-bit integers are `number` when safe, `bigint` otherwise. */
export type GgufValue = number | bigint | boolean | string | GgufArray;

/**
 * String arrays kept as bytes (ByteStrings) rather than decoded: BPE merges are only looked up,
 * and decoding 280k of them into strings was most of loading a Llama 3 vocabulary.
 */
export const BYTE_STRING_KEYS: ReadonlySet<string> = new Set(["tokenizer.ggml.merges"]);

/** A metadata entry with the type it was stored as (for arrays, also the element type). */
export interface GgufMetadataEntry {
  readonly type: GgufValueType;
  /** Element type when `type` is ARRAY. */
  readonly elementType?: GgufValueType;
  readonly value: GgufValue;
}

/** One tensor's description from the header. `offset` is relative to the data section. */
export interface GgufTensorInfo {
  readonly name: string;
  /** Dimensions as GGUF lists them: ne0 (innermost) first. */
  readonly dims: readonly number[];
  /** ggml type number (0 F32, 1 F16, 2 Q4_0, 8 Q8_0, ...). */
  readonly typeId: number;
  readonly offset: number;
}

/** Everything before the tensor data. */
export interface GgufHeader {
  readonly version: number;
  readonly metadata: ReadonlyMap<string, GgufMetadataEntry>;
  readonly tensorInfos: readonly GgufTensorInfo[];
  /** `general.alignment`, or 32 when absent. */
  readonly alignment: number;
  /** Absolute file offset where the data section starts (header end rounded up to alignment). */
  readonly dataOffset: number;
}

/** A parsed GGUF file: header plus tensors whose `data` are views of the file's bytes. */
export interface GgufFile extends GgufHeader {
  /** Tensors by name, in file order; shapes are outermost first (GGUF dims reversed). */
  readonly tensors: ReadonlyMap<string, Tensor>;
}

const MAGIC = 0x46554747; // "GGUF" read as a little-endian uint32
const DEFAULT_ALIGNMENT = 32;
const SUPPORTED_VERSIONS = [2, 3];

/** ggml type numbers of the tensor types both engines read (lib/formats), in number order. */
const SUPPORTED_TENSOR_TYPES: ReadonlyMap<number, TensorType> = new Map(
  [...FORMATS].sort((a, b) => a.ggmlType - b.ggmlType).map((f) => [f.ggmlType, f.type]),
);

/** ggml's names for its type numbers, so errors can say what a file holds (ggml.h). */
const GGML_TYPE_NAMES: Record<number, string> = {
  ...Object.fromEntries(FORMATS.map((f) => [f.ggmlType, f.ggmlName])),
  9: "Q8_1",
  15: "Q8_K",
  16: "IQ2_XXS",
  17: "IQ2_XS",
  18: "IQ3_XXS",
  19: "IQ1_S",
  20: "IQ4_NL",
  21: "IQ3_S",
  22: "IQ2_S",
  23: "IQ4_XS",
  24: "I8",
  25: "I16",
  26: "I32",
  27: "I64",
  28: "F64",
  29: "IQ1_M",
  34: "TQ1_0",
  35: "TQ2_0",
  39: "MXFP4",
};

/** The ggml name of a tensor type number, e.g. 14 -> "Q6_K". */
export function ggmlTypeName(typeId: number): string {
  return GGML_TYPE_NAMES[typeId] ?? "unknown";
}

/** The ggml names of the supported types, for error messages: "F32, F16, Q4_0, ...". */
export const SUPPORTED_TENSOR_TYPE_NAMES: readonly string[] = [...SUPPORTED_TENSOR_TYPES.keys()]
  .map((id) => ggmlTypeName(id));

/** Thrown when the bytes end before the header does; `needed` is a lower bound on the bytes required. */
export class GgufTruncatedError extends Error {
  constructor(
    readonly source: string,
    readonly what: string,
    readonly needed: number,
    readonly available: number,
  ) {
    super(
      `Cannot load GGUF ${source}: file is truncated while reading ${what}: needs ${needed} bytes, received ${available}`,
    );
    this.name = "GgufTruncatedError";
  }
}

const utf8 = new TextDecoder("utf-8");

const units = new Uint16Array(256);

/**
 * A short string of one- to three-byte UTF-8 characters, decoded without TextDecoder, whose
 * per-call cost dominates reading a vocabulary of 128k tokens and 280k merges; undefined for
 * anything else (long, four-byte or malformed), which TextDecoder then handles.
 */
function decodeShort(b: Uint8Array, start: number, len: number): string | undefined {
  if (len > units.length) return undefined;
  const end = start + len;
  let k = 0;
  for (let i = start; i < end;) {
    const c = b[i]!;
    if (c < 0x80) {
      units[k++] = c;
      i++;
    } else if (c >= 0xc2 && c < 0xe0 && i + 1 < end && (b[i + 1]! & 0xc0) === 0x80) {
      units[k++] = ((c & 0x1f) << 6) | (b[i + 1]! & 0x3f);
      i += 2;
    } else if (
      c >= 0xe0 && c < 0xf0 && i + 2 < end && (b[i + 1]! & 0xc0) === 0x80 &&
      (b[i + 2]! & 0xc0) === 0x80
    ) {
      const u = ((c & 0x0f) << 12) | ((b[i + 1]! & 0x3f) << 6) | (b[i + 2]! & 0x3f);
      // Overlong forms and UTF-16 surrogates are malformed: leave them to TextDecoder.
      if (u < 0x800 || (u >= 0xd800 && u < 0xe000)) return undefined;
      units[k++] = u;
      i += 3;
    } else {
      return undefined;
    }
  }
  return String.fromCharCode.apply(null, units.subarray(0, k) as unknown as number[]);
}

/** Sequential little-endian reader over the header bytes. */
class Cursor {
  offset = 0;
  private readonly view: DataView;
  constructor(private readonly bytes: Uint8Array, private readonly source: string) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  /** `what` may be a function, so a vocabulary's 400k strings do not each build a message no one reads. */
  need(n: number, what: string | (() => string)): void {
    if (this.offset + n > this.bytes.byteLength) {
      const name = typeof what === "string" ? what : what();
      throw new GgufTruncatedError(this.source, name, this.offset + n, this.bytes.byteLength);
    }
  }
  u8(what: string): number {
    this.need(1, what);
    return this.view.getUint8(this.offset++);
  }
  u32(what: string): number {
    this.need(4, what);
    const v = this.view.getUint32(this.offset, true);
    this.offset += 4;
    return v;
  }
  /** A uint64 used as a count or offset: must be a safe integer. */
  count(what: string | (() => string)): number {
    this.need(8, what);
    // Two 32-bit halves: a BigInt per string length is a measurable share of reading a vocabulary.
    const low = this.view.getUint32(this.offset, true);
    const high = this.view.getUint32(this.offset + 4, true);
    this.offset += 8;
    if (high === 0) return low;
    const v = (BigInt(high) << 32n) | BigInt(low);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new Error(
        `Cannot load GGUF ${this.source}: ${
          typeof what === "string" ? what : what()
        } is ${v}, too large to be valid (is the file corrupt?)`,
      );
    }
    return Number(v);
  }
  string(what: string | (() => string)): string {
    const len = this.count(() => `the length of ${typeof what === "string" ? what : what()}`);
    this.need(len, what);
    const s = decodeShort(this.bytes, this.offset, len) ??
      utf8.decode(this.bytes.subarray(this.offset, this.offset + len));
    this.offset += len;
    return s;
  }
  /** Copies `n` elements of `size` bytes out of the buffer, so the header bytes can be dropped. */
  copy(n: number, size: number, what: string): ArrayBuffer {
    this.need(n * size, what);
    const out = this.bytes.slice(this.offset, this.offset + n * size).buffer;
    this.offset += n * size;
    return out;
  }
  /**
   * Copies the strings of an array starting at `at` (each an 8-byte length, then its bytes;
   * already checked by need()) end to end into `out`, string i at offsets[i]. A plain loop: a
   * view per string would be 280k allocations for a vocabulary's merges.
   */
  gather(at: number, offsets: Uint32Array, out: Uint8Array): void {
    const b = this.bytes;
    for (let i = 0; i + 1 < offsets.length; i++) {
      at += 8;
      for (let k = offsets[i]!, end = offsets[i + 1]!; k < end; k++) out[k] = b[at++]!;
    }
  }
  get dataView(): DataView {
    return this.view;
  }
}

const FIXED_SIZES: Partial<Record<GgufValueType, number>> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8,
};

function safeOrBig(v: bigint): number | bigint {
  return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER)
    ? Number(v)
    : v;
}

function readScalar(c: Cursor, type: GgufValueType, what: string): number | bigint | boolean {
  const size = FIXED_SIZES[type]!;
  c.need(size, what);
  const v = c.dataView;
  const o = c.offset;
  c.offset += size;
  switch (type) {
    case GgufValueType.UINT8:
      return v.getUint8(o);
    case GgufValueType.INT8:
      return v.getInt8(o);
    case GgufValueType.UINT16:
      return v.getUint16(o, true);
    case GgufValueType.INT16:
      return v.getInt16(o, true);
    case GgufValueType.UINT32:
      return v.getUint32(o, true);
    case GgufValueType.INT32:
      return v.getInt32(o, true);
    case GgufValueType.FLOAT32:
      return v.getFloat32(o, true);
    case GgufValueType.BOOL:
      return v.getUint8(o) !== 0;
    case GgufValueType.UINT64:
      return safeOrBig(v.getBigUint64(o, true));
    case GgufValueType.INT64:
      return safeOrBig(v.getBigInt64(o, true));
    case GgufValueType.FLOAT64:
      return v.getFloat64(o, true);
    default:
      throw new Error(`unreachable scalar type ${type}`);
  }
}

function checkType(c: Cursor, type: number, what: string, source: string): GgufValueType {
  if (!Number.isInteger(type) || type < 0 || type > 12) {
    throw new Error(
      `Cannot load GGUF ${source}: unknown metadata value type ${type} for ${what} at byte ${
        c.offset - 4
      }; known types are 0..12`,
    );
  }
  return type as GgufValueType;
}

/** Arrays of arrays nest at most this deep (GGUF files use one level; the recursion is bounded). */
const MAX_ARRAY_DEPTH = 8;

function readArray(
  c: Cursor,
  what: string,
  source: string,
  depth = 0,
): { elementType: GgufValueType; value: GgufArray } {
  if (depth >= MAX_ARRAY_DEPTH) {
    throw new Error(
      `Cannot load GGUF ${source}: ${what} nests arrays more than ${MAX_ARRAY_DEPTH} deep (is the file corrupt?)`,
    );
  }
  const elementType = checkType(c, c.u32(`the element type of ${what}`), what, source);
  const n = c.count(`the length of ${what}`);
  // Each element takes at least its length's 8 bytes (a nested array's header 12): a count the
  // rest of the header cannot hold is refused before anything that size is allocated.
  if (elementType === GgufValueType.STRING || elementType === GgufValueType.ARRAY) {
    c.need(
      n * (elementType === GgufValueType.STRING ? 8 : 12),
      () => `the ${n} elements of ${what}`,
    );
  }
  const copy = (size: number) => c.copy(n, size, what);
  switch (elementType) {
    // Copies, not views: the data may be unaligned in the file, and the header buffer is dropped after parsing.
    case GgufValueType.UINT8:
      return { elementType, value: new Uint8Array(copy(1)) };
    case GgufValueType.INT8:
      return { elementType, value: new Int8Array(copy(1)) };
    case GgufValueType.UINT16:
      return { elementType, value: new Uint16Array(copy(2)) };
    case GgufValueType.INT16:
      return { elementType, value: new Int16Array(copy(2)) };
    case GgufValueType.UINT32:
      return { elementType, value: new Uint32Array(copy(4)) };
    case GgufValueType.INT32:
      return { elementType, value: new Int32Array(copy(4)) };
    case GgufValueType.FLOAT32:
      return { elementType, value: new Float32Array(copy(4)) };
    case GgufValueType.FLOAT64:
      return { elementType, value: new Float64Array(copy(8)) };
    case GgufValueType.UINT64:
      return { elementType, value: new BigUint64Array(copy(8)) };
    case GgufValueType.INT64:
      return { elementType, value: new BigInt64Array(copy(8)) };
    case GgufValueType.BOOL:
      return { elementType, value: Array.from(new Uint8Array(copy(1)), (b) => b !== 0) };
    case GgufValueType.STRING: {
      const out: string[] = [];
      for (let i = 0; i < n; i++) out.push(c.string(() => `${what}[${i}]`));
      return { elementType, value: out };
    }
    case GgufValueType.ARRAY: {
      const out: GgufArray[] = [];
      for (let i = 0; i < n; i++) out.push(readArray(c, `${what}[${i}]`, source, depth + 1).value);
      return { elementType, value: out };
    }
  }
}

/** A string array as ByteStrings (other element types as readArray reads them). */
function readArrayAsBytes(
  c: Cursor,
  what: string,
  source: string,
): { elementType: GgufValueType; value: GgufArray } {
  const start = c.offset;
  const elementType = checkType(c, c.u32(`the element type of ${what}`), what, source);
  if (elementType !== GgufValueType.STRING) {
    c.offset = start;
    return readArray(c, what, source);
  }
  const n = c.count(`the length of ${what}`);
  c.need(n * 8, () => `the ${n} elements of ${what}`);
  const first = c.offset;
  const offsets = new Uint32Array(n + 1);
  let total = 0;
  for (let i = 0; i < n; i++) {
    const len = c.count(() => `the length of ${what}[${i}]`);
    c.need(len, () => `${what}[${i}]`);
    c.offset += len;
    total += len;
    offsets[i + 1] = total;
  }
  const bytes = new Uint8Array(total);
  c.gather(first, offsets, bytes);
  return { elementType, value: new ByteStrings(bytes, offsets) };
}

/**
 * Parses everything up to the tensor data. Throws GgufTruncatedError when `bytes` end before the
 * header does, so a caller reading a file in pieces can retry with a longer prefix.
 */
export function parseGgufHeader(bytes: Uint8Array, source: string): GgufHeader {
  const c = new Cursor(bytes, source);
  c.need(4, "the magic number");
  const magic = c.u32("the magic number");
  if (magic !== MAGIC) {
    throw new Error(
      `Cannot load GGUF ${source}: bad magic, expected "GGUF", received ${
        describeBytes(bytes.subarray(0, 4))
      }`,
    );
  }
  const version = c.u32("the version");
  if (!SUPPORTED_VERSIONS.includes(version)) {
    const hint = version > 0xffff && (version >>> 24) <= 3
      ? " (a big-endian GGUF file; only little-endian is supported)"
      : "";
    throw new Error(
      `Cannot load GGUF ${source}: unsupported GGUF version ${version}${hint}; supported: ${
        SUPPORTED_VERSIONS.join(", ")
      }`,
    );
  }
  const tensorCount = c.count("the tensor count");
  const kvCount = c.count("the metadata count");

  const metadata = new Map<string, GgufMetadataEntry>();
  for (let i = 0; i < kvCount; i++) {
    const key = c.string(`metadata key #${i}`);
    const what = `metadata '${key}'`;
    const type = checkType(c, c.u32(`the type of ${what}`), what, source);
    if (type === GgufValueType.ARRAY) {
      const { elementType, value } = BYTE_STRING_KEYS.has(key)
        ? readArrayAsBytes(c, what, source)
        : readArray(c, what, source);
      metadata.set(key, { type, elementType, value });
    } else if (type === GgufValueType.STRING) {
      metadata.set(key, { type, value: c.string(what) });
    } else {
      metadata.set(key, { type, value: readScalar(c, type, what) });
    }
  }

  let alignment = DEFAULT_ALIGNMENT;
  const alignEntry = metadata.get("general.alignment");
  if (alignEntry !== undefined) {
    const a = alignEntry.value;
    if (typeof a !== "number" || !Number.isInteger(a) || a <= 0 || (a & (a - 1)) !== 0) {
      throw new Error(
        `Cannot load GGUF ${source}: general.alignment must be a positive power of two, received ${
          String(a)
        }`,
      );
    }
    alignment = a;
  }

  const tensorInfos: GgufTensorInfo[] = [];
  for (let i = 0; i < tensorCount; i++) {
    const name = c.string(`the name of tensor #${i}`);
    const what = `tensor info '${name}'`;
    const nDims = c.u32(`the dimension count of ${what}`);
    if (nDims > 8) {
      throw new Error(
        `Cannot load GGUF ${source}: tensor '${name}' has ${nDims} dimensions; at most 4 are valid`,
      );
    }
    const dims: number[] = [];
    for (let d = 0; d < nDims; d++) dims.push(c.count(`dimension ${d} of ${what}`));
    const typeId = c.u32(`the type of ${what}`);
    const offset = c.count(`the data offset of ${what}`);
    if (offset % alignment !== 0) {
      throw new Error(
        `Cannot load GGUF ${source}: tensor '${name}' data offset ${offset} is not a multiple of the alignment ${alignment}`,
      );
    }
    tensorInfos.push({ name, dims, typeId, offset });
  }
  const dataOffset = Math.ceil(c.offset / alignment) * alignment;
  return { version, metadata, tensorInfos, alignment, dataOffset };
}

/** A tensor type a file uses that this project cannot run, with how many tensors use it. */
export interface UnsupportedTensorType {
  readonly typeId: number;
  /** ggml's name, e.g. "IQ2_XS" ("unknown" for a number ggml does not define). */
  readonly name: string;
  readonly count: number;
  /** The first tensor of that type, in file order. */
  readonly example: string;
}

/**
 * Every tensor type of a header that no engine reads, with its tensor count, in order of first
 * use; empty when all are supported. Lets a loader list all of a file's blockers at once.
 */
export function unsupportedTensorTypes(header: GgufHeader): UnsupportedTensorType[] {
  const found = new Map<number, { count: number; example: string }>();
  for (const info of header.tensorInfos) {
    if (SUPPORTED_TENSOR_TYPES.has(info.typeId)) continue;
    const seen = found.get(info.typeId);
    if (seen) seen.count++;
    else found.set(info.typeId, { count: 1, example: info.name });
  }
  return [...found].map(([typeId, { count, example }]) => ({
    typeId,
    name: ggmlTypeName(typeId),
    count,
    example,
  }));
}

/** The type and shape (outermost first) of a tensor; throws for types this project cannot run. */
export function tensorLayout(
  info: GgufTensorInfo,
  source: string,
): { type: TensorType; shape: number[]; bytes: number } {
  const type = SUPPORTED_TENSOR_TYPES.get(info.typeId);
  if (type === undefined) {
    throw new Error(
      `Cannot load GGUF ${source}: unsupported tensor type ${info.typeId} (${
        ggmlTypeName(info.typeId)
      }) for tensor '${info.name}'; supported: ${SUPPORTED_TENSOR_TYPE_NAMES.join(", ")}`,
    );
  }
  const shape = [...info.dims].reverse();
  try {
    return { type, shape, bytes: byteSize(type, shape) };
  } catch (e) {
    throw new Error(`Cannot load GGUF ${source}: tensor '${info.name}': ${(e as Error).message}`);
  }
}

/**
 * Makes the tensors of a header from the data section. `data` holds the file's bytes from
 * `dataStart` (an absolute file offset at or before header.dataOffset) on; tensors are views of it.
 */
export function ggufTensors(
  header: GgufHeader,
  data: Uint8Array,
  dataStart: number,
  fileSize: number,
  source: string,
): Map<string, Tensor> {
  const tensors = new Map<string, Tensor>();
  for (const info of header.tensorInfos) {
    const { type, shape, bytes } = tensorLayout(info, source);
    const start = header.dataOffset + info.offset - dataStart;
    const end = start + bytes;
    if (end > data.byteLength) {
      throw new Error(
        `Cannot load GGUF ${source}: file is truncated while reading the data of tensor '${info.name}': needs ${
          end + dataStart
        } bytes, received ${fileSize}`,
      );
    }
    if (tensors.has(info.name)) {
      throw new Error(`Cannot load GGUF ${source}: tensor '${info.name}' appears twice`);
    }
    tensors.set(info.name, { name: info.name, type, shape, data: data.subarray(start, end) });
  }
  checkOverlaps(header, tensors, source);
  return tensors;
}

/** Refuses a header whose tensors share bytes of the file. */
function checkOverlaps(header: GgufHeader, tensors: Map<string, Tensor>, source: string): void {
  // Two tensors sharing bytes load "fine" and compute garbage: each must have its own.
  const spans = header.tensorInfos
    .map((info) => ({
      name: info.name,
      from: info.offset,
      to: info.offset + tensors.get(info.name)!.data.byteLength,
    }))
    .sort((a, b) => a.from - b.from);
  for (let i = 1; i < spans.length; i++) {
    const prev = spans[i - 1]!, cur = spans[i]!;
    if (cur.from < prev.to && cur.to > cur.from) {
      throw new Error(
        `Cannot load GGUF ${source}: the data of tensor '${cur.name}' (bytes ${cur.from}..${cur.to}) ` +
          `overlaps tensor '${prev.name}' (bytes ${prev.from}..${prev.to})`,
      );
    }
  }
}

/**
 * Where each tensor's bytes go, given every tensor's name and size in header order: one view
 * per tensor (the CPU engine splits a model too big for one WebAssembly memory over several),
 * or undefined for one buffer holding the whole data section. A null leaves that tensor unread
 * (its data empty): a pipeline stage reads only its own layers' tensors.
 */
export type PlaceTensors = (
  tensors: readonly {
    readonly name: string;
    readonly bytes: number;
    readonly type: TensorType;
    /** Outermost first: [rows, columns] for a matrix. */
    readonly shape: readonly number[];
  }[],
  header: GgufHeader,
) => (Uint8Array | PartialRead | null)[] | undefined;

/**
 * A tensor read only in part: `view` has its whole size, and only the byte ranges `reads` of it
 * are read (a tensor-parallel rank's rows); the rest stays as the view was (zeros, never touched,
 * so not resident).
 */
export interface PartialRead {
  readonly view: Uint8Array;
  readonly reads: readonly (readonly [number, number])[];
}

/** Reads each tensor into the view `views` has for it, in file order; returns the tensors. */
async function readPlaced(
  file: Deno.FsFile,
  header: GgufHeader,
  views: (Uint8Array | PartialRead | null)[],
  source: string,
  onProgress?: ReadProgress,
): Promise<Map<string, Tensor>> {
  const tensors = new Map<string, Tensor>();
  const order = header.tensorInfos.map((info, i) => ({ info, i })).sort((a, b) =>
    a.info.offset - b.info.offset
  );
  const readsOf = (v: Uint8Array | PartialRead, bytes: number) =>
    v instanceof Uint8Array ? [[0, bytes] as const] : v.reads;
  const total = views.reduce(
    (n, v) =>
      v
        ? readsOf(v, v instanceof Uint8Array ? v.byteLength : 0).reduce((m, [a, b]) => m + b - a, n)
        : n,
    0,
  );
  let done = 0;
  for (const { info, i } of order) {
    const { type, shape, bytes } = tensorLayout(info, source);
    const placed = views[i];
    const view = placed instanceof Uint8Array || !placed ? placed : placed.view;
    if (tensors.has(info.name)) {
      throw new Error(`Cannot load GGUF ${source}: tensor '${info.name}' appears twice`);
    }
    if (view === null) {
      tensors.set(info.name, { name: info.name, type, shape, data: new Uint8Array(0) });
      continue;
    }
    if (view === undefined || view.byteLength !== bytes) {
      throw new Error(
        `Cannot load GGUF ${source}: tensor '${info.name}' needs ${bytes} bytes, was given ${view?.byteLength}`,
      );
    }
    for (const [from, to] of readsOf(placed!, bytes)) {
      if (!(0 <= from && from <= to && to <= bytes)) {
        throw new Error(
          `Cannot load GGUF ${source}: bytes ${from}..${to} of tensor '${info.name}' are not within its ${bytes}`,
        );
      }
      await readFully(
        file,
        header.dataOffset + info.offset + from,
        view.subarray(from, to),
        (n) => onProgress?.(done + n, total),
      );
      done += to - from;
    }
    tensors.set(info.name, { name: info.name, type, shape, data: view });
  }
  checkOverlaps(header, tensors, source);
  return tensors;
}

/**
 * Bytes of the data section the tensors actually use (from header.dataOffset); a tensor that
 * would end past the file is refused here, before a buffer that size is asked for.
 */
function dataSectionBytes(header: GgufHeader, source: string, fileSize: number): number {
  let end = 0;
  for (const info of header.tensorInfos) {
    const tensorEnd = info.offset + tensorLayout(info, source).bytes;
    if (header.dataOffset + tensorEnd > fileSize) {
      throw new Error(
        `Cannot load GGUF ${source}: file is truncated while reading the data of tensor '${info.name}': needs ${
          header.dataOffset + tensorEnd
        } bytes, received ${fileSize}`,
      );
    }
    end = Math.max(end, tensorEnd);
  }
  return end;
}

/**
 * Parses a GGUF file held in memory. Tensor data are views of `bytes` (nothing is copied).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const gguf = parseGguf(await Deno.readFile("stories260K.gguf"), "stories260K.gguf");
 * assertEquals(gguf.metadata.get("general.architecture")?.value, "llama");
 * assertEquals(gguf.tensors.get("token_embd.weight")?.shape, [512, 64]); // outermost first
 * ```
 */
export function parseGguf(bytes: Uint8Array, source: string): GgufFile {
  const header = parseGgufHeader(bytes, source);
  return { ...header, tensors: ggufTensors(header, bytes, 0, bytes.byteLength, source) };
}

const FIRST_HEADER_READ = 1 << 20;

/**
 * Reads a GGUF file from disk holding its bytes only once: the header is parsed from a prefix
 * (grown until it fits, then dropped), and the data section is read into one buffer whose views
 * become the tensors. `checkHeader` runs before the data is read, so a file the caller cannot
 * use is refused without reading gigabytes first.
 */
export async function readGguf(
  path: string,
  onProgress?: ReadProgress,
  checkHeader?: (header: GgufHeader) => void,
  allocate: (bytes: number) => Uint8Array = (n) => new Uint8Array(n),
  place?: PlaceTensors,
): Promise<GgufFile> {
  using file = await Deno.open(path, { read: true });
  const fileSize = (await file.stat()).size;
  const header = await readGgufHeaderOf(file, fileSize, path);
  checkHeader?.(header);
  const dataBytes = dataSectionBytes(header, path, fileSize);
  const views = place?.(
    header.tensorInfos.map((info) => {
      const { type, shape, bytes } = tensorLayout(info, path);
      return { name: info.name, bytes, type, shape };
    }),
    header,
  );
  if (views) return { ...header, tensors: await readPlaced(file, header, views, path, onProgress) };
  const data = allocate(dataBytes);
  const got = await readFully(file, header.dataOffset, data, onProgress);
  return {
    ...header,
    tensors: ggufTensors(header, data.subarray(0, got), header.dataOffset, fileSize, path),
  };
}

/** Reads and parses only a GGUF's header (metadata and tensor infos), not its tensor data. */
export async function readGgufHeader(path: string): Promise<GgufHeader> {
  using file = await Deno.open(path, { read: true });
  return await readGgufHeaderOf(file, (await file.stat()).size, path);
}

/**
 * Parses the header of an open GGUF file of `fileSize` bytes from a prefix of it, grown until
 * the header fits (each retry parses from the start, so it grows fast: big vocabularies make
 * headers of several MiB). The prefix is dropped; the file's position is left anywhere.
 */
export async function readGgufHeaderOf(
  file: Deno.FsFile,
  fileSize: number,
  path: string,
): Promise<GgufHeader> {
  let size = Math.min(fileSize, FIRST_HEADER_READ);
  for (;;) {
    const prefix = new Uint8Array(size);
    const got = await readFully(file, 0, prefix);
    try {
      return parseGgufHeader(prefix.subarray(0, got), path);
    } catch (e) {
      if (!(e instanceof GgufTruncatedError) || got >= fileSize) throw e;
      size = Math.min(fileSize, Math.max(size * 8, e.needed * 2));
    }
  }
}

/** A metadata value in a few words, for "must be ..., received ..." errors. */
export function describeGgufValue(v: GgufValue | undefined): string {
  if (v === undefined) return "nothing";
  if (typeof v === "string") return `'${v}'`;
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (ArrayBuffer.isView(v)) return `a ${v.constructor.name} of ${v.length}`;
  return `${typeof v} ${String(v)}`;
}

/** First bytes of a file as hex and printable text, for "not the format I expected" errors. */
export function describeBytes(bytes: Uint8Array): string {
  const hex = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
  const text = Array.from(bytes, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : "."))
    .join("");
  return `${hex} ("${text}")`;
}
