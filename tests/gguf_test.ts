import {
  assert,
  assertEquals,
  assertInstanceOf,
  assertRejects,
  assertStrictEquals,
  assertThrows,
} from "@std/assert";
import {
  GgufValueType,
  parseGguf,
  parseGgufHeader,
  readGguf,
  unsupportedTensorTypes,
} from "../lib/model/gguf.ts";
import { f32Bytes, T, writeGguf } from "./_gguf_writer.ts";
import {
  corruptedCopy,
  ggufString,
  modelFile,
  replaceUnique,
  tempFile,
  tensorTypeFieldOffset,
} from "./harness/model_files.ts";

const MAX_U64 = 2n ** 64n - 1n;
const MIN_I64 = -(2n ** 63n);

/** One entry per scalar type, with values at or near the type's limits. */
const SCALARS = [
  { key: "t.u8", type: T.U8, value: 255 },
  { key: "t.i8", type: T.I8, value: -128 },
  { key: "t.u16", type: T.U16, value: 65535 },
  { key: "t.i16", type: T.I16, value: -32768 },
  { key: "t.u32", type: T.U32, value: 4294967295 },
  { key: "t.i32", type: T.I32, value: -2147483648 },
  { key: "t.f32", type: T.F32, value: 1.5 },
  { key: "t.f64", type: T.F64, value: Math.PI },
  { key: "t.bool_true", type: T.BOOL, value: true },
  { key: "t.bool_false", type: T.BOOL, value: false },
  { key: "t.string", type: T.STRING, value: "héllo wörld 🦙 日本語" },
  { key: "t.empty_string", type: T.STRING, value: "" },
  { key: "t.u64_safe", type: T.U64, value: 2 ** 53 - 1 },
  { key: "t.u64_big", type: T.U64, value: MAX_U64 },
  { key: "t.i64_safe", type: T.I64, value: -(2 ** 53 - 1) },
  { key: "t.i64_big", type: T.I64, value: MIN_I64 },
];

const ARRAYS = [
  { key: "a.u8", elementType: T.U8, items: [0, 1, 255], expected: new Uint8Array([0, 1, 255]) },
  {
    key: "a.i8",
    elementType: T.I8,
    items: [-128, 0, 127],
    expected: new Int8Array([-128, 0, 127]),
  },
  { key: "a.u16", elementType: T.U16, items: [65535, 7], expected: new Uint16Array([65535, 7]) },
  {
    key: "a.i16",
    elementType: T.I16,
    items: [-32768, 32767],
    expected: new Int16Array([-32768, 32767]),
  },
  {
    key: "a.u32",
    elementType: T.U32,
    items: [4294967295, 1],
    expected: new Uint32Array([4294967295, 1]),
  },
  { key: "a.i32", elementType: T.I32, items: [-5, 6, -7], expected: new Int32Array([-5, 6, -7]) },
  {
    key: "a.f32",
    elementType: T.F32,
    items: [0.25, -1e-3],
    expected: new Float32Array([0.25, -1e-3]),
  },
  {
    key: "a.f64",
    elementType: T.F64,
    items: [1e-300, -2.5],
    expected: new Float64Array([1e-300, -2.5]),
  },
  {
    key: "a.u64",
    elementType: T.U64,
    items: [MAX_U64, 3n],
    expected: new BigUint64Array([MAX_U64, 3n]),
  },
  {
    key: "a.i64",
    elementType: T.I64,
    items: [MIN_I64, -1n],
    expected: new BigInt64Array([MIN_I64, -1n]),
  },
  { key: "a.bool", elementType: T.BOOL, items: [true, false, true], expected: [true, false, true] },
  {
    key: "a.string",
    elementType: T.STRING,
    items: ["▁the", "<0x0A>", "", "🦙"],
    expected: ["▁the", "<0x0A>", "", "🦙"],
  },
  { key: "a.empty", elementType: T.I32, items: [], expected: new Int32Array([]) },
  {
    key: "a.nested_strings",
    elementType: T.ARRAY,
    items: [{ elementType: T.STRING, items: ["a", "bc"] }, { elementType: T.STRING, items: [] }, {
      elementType: T.STRING,
      items: ["ü"],
    }],
    expected: [["a", "bc"], [], ["ü"]],
  },
  {
    key: "a.nested_numbers",
    elementType: T.ARRAY,
    items: [{ elementType: T.U16, items: [1, 2] }, { elementType: T.F32, items: [0.5] }],
    expected: [new Uint16Array([1, 2]), new Float32Array([0.5])],
  },
];

function everyTypeFile(version: number): Uint8Array {
  return writeGguf({
    version,
    metadata: [
      ...SCALARS,
      ...ARRAYS.map((a) => ({
        key: a.key,
        type: T.ARRAY,
        value: { elementType: a.elementType, items: a.items },
      })),
    ],
  });
}

for (const version of [2, 3]) {
  Deno.test(`parseGguf() reads every metadata type (v${version})`, () => {
    const g = parseGguf(everyTypeFile(version), "every_type.gguf");
    assertEquals(g.version, version);
    assertEquals(g.metadata.size, SCALARS.length + ARRAYS.length);
    for (const s of SCALARS) {
      const entry = g.metadata.get(s.key);
      assertEquals(entry?.type, s.type, s.key);
      assertStrictEquals(entry?.value, s.value, s.key);
    }
    for (const a of ARRAYS) {
      const entry = g.metadata.get(a.key);
      assertEquals(entry?.type, GgufValueType.ARRAY, a.key);
      assertEquals(entry?.elementType, a.elementType, a.key);
      assertEquals(entry?.value, a.expected, a.key);
      if (!Array.isArray(a.expected)) {
        assertEquals(entry?.value.constructor, a.expected.constructor, a.key);
      }
    }
  });
}

Deno.test("parseGguf() returns 64-bit integers as number when safe and bigint otherwise", () => {
  const g = parseGguf(everyTypeFile(3), "every_type.gguf");
  assertEquals(typeof g.metadata.get("t.u64_safe")?.value, "number");
  assertEquals(typeof g.metadata.get("t.i64_safe")?.value, "number");
  assertEquals(typeof g.metadata.get("t.u64_big")?.value, "bigint");
  assertEquals(typeof g.metadata.get("t.i64_big")?.value, "bigint");
});

/** Four tensors, one per supported type, with recognisable bytes and a 64-byte alignment. */
function fourTypesFile(alignment: number | undefined) {
  const f32 = f32Bytes([1, 2, 3, 4, 5, 6]); // 3 columns x 2 rows
  const f16 = new Uint8Array([0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38]); // 1, -2, 0.5
  const q8 = Uint8Array.from({ length: 2 * 34 }, (_, i) => i); // two blocks
  const q4 = Uint8Array.from({ length: 18 }, (_, i) => 200 - i); // one block
  const tensors = [
    { name: "a.f32", dims: [3, 2], typeId: 0, data: f32 },
    { name: "b.f16", dims: [3], typeId: 1, data: f16 },
    { name: "c.q8_0", dims: [32, 2], typeId: 8, data: q8 },
    { name: "d.q4_0", dims: [32, 1], typeId: 2, data: q4 },
  ];
  const metadata = alignment === undefined
    ? []
    : [{ key: "general.alignment", type: T.U32, value: alignment }];
  return { bytes: writeGguf({ metadata, tensors, ...(alignment ? { alignment } : {}) }), tensors };
}

for (const alignment of [undefined, 64]) {
  Deno.test(`parseGguf() places tensors by offset and alignment (${alignment ?? "default 32"})`, () => {
    const { bytes, tensors } = fourTypesFile(alignment);
    const g = parseGguf(bytes, "four.gguf");
    const align = alignment ?? 32;
    assertEquals(g.alignment, align);
    assertEquals(g.dataOffset % align, 0);
    assertEquals(
      g.tensorInfos.map((i) => [i.name, i.dims, i.typeId]),
      tensors.map((t) => [t.name, t.dims, t.typeId]),
    );
    assertEquals([...g.tensors.values()].map((t) => [t.name, t.type, t.shape]), [
      ["a.f32", "f32", [2, 3]],
      ["b.f16", "f16", [3]],
      ["c.q8_0", "q8_0", [2, 32]],
      ["d.q4_0", "q4_0", [1, 32]],
    ]);
    for (const t of tensors) {
      const got = g.tensors.get(t.name)!;
      assertEquals(got.data, t.data, t.name);
      // A view, not a copy: the tensor lives in the caller's buffer.
      assertStrictEquals(got.data.buffer, bytes.buffer, t.name);
    }
    for (const info of g.tensorInfos) assertEquals(info.offset % align, 0);
  });
}

Deno.test("readGguf() matches parseGguf() and keeps all tensor data in one buffer smaller than the file", async () => {
  const path = modelFile("stories260K.gguf");
  const fromDisk = await readGguf(path);
  const fileBytes = await Deno.readFile(path);
  const inMemory = parseGguf(fileBytes, path);
  assertEquals([...fromDisk.metadata], [...inMemory.metadata]);
  assertEquals(fromDisk.tensorInfos, inMemory.tensorInfos);
  const buffers = new Set([...fromDisk.tensors.values()].map((t) => t.data.buffer));
  assertEquals(buffers.size, 1);
  const [buffer] = buffers;
  // The header region is not kept: the one buffer holds only the data section.
  assertEquals(buffer!.byteLength, fileBytes.byteLength - fromDisk.dataOffset);
  for (const [name, t] of inMemory.tensors) {
    assertEquals(fromDisk.tensors.get(name)!.data, t.data, name);
  }
});

Deno.test("readGguf() reads a header larger than its first read", async () => {
  const big = "x".repeat(3 << 20); // 3 MiB of metadata, beyond the 1 MiB first read
  const bytes = writeGguf({
    metadata: [{ key: "big", type: T.STRING, value: big }, { key: "after", type: T.U8, value: 7 }],
    tensors: [{ name: "w", dims: [2], typeId: 0, data: f32Bytes([0.5, -0.5]) }],
  });
  const g = await readGguf(await tempFile("big_header.gguf", bytes));
  assertEquals(g.metadata.get("big")?.value, big);
  assertEquals(g.metadata.get("after")?.value, 7);
  assertEquals(g.tensors.get("w")?.data, f32Bytes([0.5, -0.5]));
});

Deno.test("parseGguf() reads the real stories260K.gguf header written by llama.cpp", async () => {
  const g = await readGguf(modelFile("stories260K.gguf"));
  assertEquals(g.version, 3);
  assertEquals(g.alignment, 32);
  const meta = (k: string) => g.metadata.get(k)?.value;
  assertEquals(meta("general.architecture"), "llama");
  assertEquals(meta("llama.embedding_length"), 64);
  assertEquals(meta("llama.block_count"), 5);
  assertEquals(meta("llama.attention.head_count"), 8);
  assertEquals(meta("llama.attention.head_count_kv"), 4);
  assertEquals(meta("llama.feed_forward_length"), 172);
  assertEquals(meta("llama.context_length"), 128);
  assertEquals((meta("tokenizer.ggml.tokens") as string[]).length, 512);
  // 3 global tensors + 9 per layer.
  assertEquals(g.tensors.size, 3 + 9 * 5);
  assertEquals(g.tensors.get("blk.0.attn_k.weight")?.shape, [32, 64]);
  assertEquals(g.tensors.get("token_embd.weight")?.shape, [512, 64]);
});

// --- errors, each from a corrupted copy of a real file ---

Deno.test("readGguf() rejects a bad magic", async () => {
  const path = await corruptedCopy("stories260K.gguf", (b) => (b.set([0x47, 0x47, 0x4d, 0x4c]), b));
  const err = await assertRejects(() => readGguf(path), Error);
  assert(
    err.message.includes('bad magic, expected "GGUF", received 47 47 4d 4c ("GGML")'),
    err.message,
  );
});

for (const version of [1, 4]) {
  Deno.test(`readGguf() rejects GGUF version ${version}`, async () => {
    const path = await corruptedCopy(
      "stories260K.gguf",
      (b) => (new DataView(b.buffer).setUint32(4, version, true), b),
    );
    await assertRejects(
      () => readGguf(path),
      Error,
      `unsupported GGUF version ${version}; supported: 2, 3`,
    );
  });
}

Deno.test("readGguf() rejects a file truncated inside the header", async () => {
  const path = await corruptedCopy("stories260K.gguf", (b) => b.slice(0, 5000));
  const err = await assertRejects(() => readGguf(path), Error);
  assert(
    /file is truncated while reading .+: needs \d+ bytes, received 5000$/.test(err.message),
    err.message,
  );
  assert(err.message.includes(path), err.message);
});

Deno.test("readGguf() rejects a file truncated inside the tensor data, naming the tensor", async () => {
  const full = await Deno.readFile(modelFile("stories260K.gguf"));
  const g = parseGguf(full, "x");
  const last = g.tensorInfos.reduce((a, b) => (b.offset > a.offset ? b : a));
  const cut = full.byteLength - 10;
  const path = await corruptedCopy("stories260K.gguf", (b) => b.slice(0, cut));
  await assertRejects(
    () => readGguf(path),
    Error,
    `file is truncated while reading the data of tensor '${last.name}': needs ${full.byteLength} bytes, received ${cut}`,
  );
});

Deno.test("readGguf() rejects an unsupported tensor type, naming the type and tensor", async () => {
  const path = await corruptedCopy("stories260K.gguf", (b) => {
    new DataView(b.buffer).setUint32(tensorTypeFieldOffset(b, "blk.0.ffn_down.weight"), 17, true);
    return b;
  });
  await assertRejects(
    () => readGguf(path),
    Error,
    `Cannot load GGUF ${path}: unsupported tensor type 17 (IQ2_XS) for tensor 'blk.0.ffn_down.weight'; supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16`,
  );
});

Deno.test("readGguf() refuses a K-quant tensor whose rows are not whole 256-element blocks", async () => {
  // stories260K's attention matrices are 64 wide: fine for Q8_0's 32-element blocks, not for
  // Q4_K's 256 (llama-quantize falls back to Q5_0/Q8_0 for such rows).
  const path = await corruptedCopy("stories260K.gguf", (b) => {
    new DataView(b.buffer).setUint32(tensorTypeFieldOffset(b, "blk.0.attn_q.weight"), 12, true);
    return b;
  });
  await assertRejects(
    () => readGguf(path),
    Error,
    "tensor 'blk.0.attn_q.weight': Cannot size q4_k tensor: innermost dimension must be a multiple of 256, received shape [64, 64]",
  );
});

Deno.test("unsupportedTensorTypes() lists every unsupported type of a header with its count, in order of first use", async () => {
  const bytes = await Deno.readFile(modelFile("stories260K.gguf"));
  assertEquals(unsupportedTensorTypes(parseGgufHeader(bytes, "ok.gguf")), []);
  const view = new DataView(bytes.buffer);
  const retype = (name: string, id: number) =>
    view.setUint32(tensorTypeFieldOffset(bytes, name), id, true);
  retype("blk.3.ffn_up.weight", 23);
  retype("blk.1.ffn_up.weight", 23);
  retype("blk.2.attn_q.weight", 99);
  retype("blk.4.ffn_up.weight", 23);
  const header = parseGgufHeader(bytes, "bad.gguf");
  const first = (id: number) => header.tensorInfos.find((t) => t.typeId === id)!.name;
  const listed = unsupportedTensorTypes(header);
  assertEquals(
    listed.map((u) => [u.typeId, u.name, u.count, u.example]),
    [
      [23, "IQ4_XS", 3, first(23)],
      [99, "unknown", 1, "blk.2.attn_q.weight"],
    ].sort((a, b) =>
      header.tensorInfos.findIndex((t) => t.name === a[3]) -
      header.tensorInfos.findIndex((t) => t.name === b[3])
    ),
  );
});

Deno.test("parseGguf() rejects an unknown metadata value type", async () => {
  const bytes = await Deno.readFile(modelFile("stories260K.gguf"));
  const key = ggufString("general.name");
  // The type field follows the key; 8 (STRING) becomes 13, which no spec version defines.
  const from = new Uint8Array([...key, 8, 0, 0, 0]);
  const to = new Uint8Array([...key, 13, 0, 0, 0]);
  const err = assertThrows(() => parseGguf(replaceUnique(bytes, from, to), "x.gguf"), Error);
  assert(
    err.message.includes("unknown metadata value type 13 for metadata 'general.name'"),
    err.message,
  );
});

Deno.test("parseGguf() rejects a tensor offset that breaks the alignment", () => {
  const bytes = writeGguf({
    metadata: [],
    tensors: [{ name: "w", dims: [4], typeId: 0, data: f32Bytes([1, 2, 3, 4]) }],
  });
  const g = parseGguf(bytes, "ok.gguf");
  assertInstanceOf(g.tensors.get("w")?.data, Uint8Array);
  // The offset field is the last 8 bytes of the (only) tensor info, right before the padding.
  const infoEnd = 4 + 4 + 8 + 8 + (8 + 1) + 4 + 8 + 4 + 8;
  new DataView(bytes.buffer).setBigUint64(infoEnd - 8, 4n, true);
  assertThrows(
    () => parseGguf(bytes, "bad.gguf"),
    Error,
    "tensor 'w' data offset 4 is not a multiple of the alignment 32",
  );
});

Deno.test("parseGguf() refuses tensors whose data overlap, naming both", () => {
  const data = f32Bytes([1, 2, 3, 4, 5, 6, 7, 8]);
  const file = (second: number) =>
    writeGguf({
      metadata: [],
      tensors: [
        // Tensor type 0 is F32.
        { name: "a.weight", dims: [8], typeId: 0, data },
        { name: "b.weight", dims: [8], typeId: 0, data, offset: second },
      ],
    });
  assertEquals(parseGguf(file(32), "ok.gguf").tensors.size, 2);
  assertThrows(
    () => parseGguf(file(0), "overlap.gguf"),
    Error,
    "overlap.gguf: the data of tensor 'b.weight' (bytes 0..32) overlaps tensor 'a.weight' (bytes 0..32)",
  );
});

Deno.test("a FIFO given as the model is named as one, not 'no such file'", async () => {
  const { resolveModelSource } = await import("../lib/source/model_source.ts");
  const dir = await Deno.makeTempDir();
  try {
    const fifo = `${dir}/pipe.gguf`;
    const made = await new Deno.Command("mkfifo", { args: [fifo] }).output();
    assertEquals(made.code, 0);
    await assertRejects(
      () => resolveModelSource(fifo),
      Error,
      `Cannot use "${fifo}" as a model: it is a FIFO (named pipe), not a regular file`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** A GGUF header built byte by byte: counts a writer would never produce. */
function rawGguf(parts: (number | bigint | string)[][]): Uint8Array {
  const out: number[] = [];
  const u32 = (v: number) => out.push(v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, v >>> 24);
  const u64 = (v: bigint) => {
    for (let i = 0n; i < 8n; i++) out.push(Number((v >> (8n * i)) & 0xffn));
  };
  u32(0x46554747);
  u32(3);
  for (const part of parts) {
    for (const f of part) {
      if (typeof f === "bigint") u64(f);
      else if (typeof f === "number") u32(f);
      else {
        const b = new TextEncoder().encode(f);
        u64(BigInt(b.length));
        out.push(...b);
      }
    }
  }
  return new Uint8Array([...out, ...new Uint8Array(256)]);
}

async function rejectionOf(bytes: Uint8Array): Promise<string> {
  const path = await Deno.makeTempFile({ suffix: ".gguf" });
  try {
    await Deno.writeFile(path, bytes);
    const err = await assertRejects(() => readGguf(path), Error);
    assert(err.message.startsWith(`Cannot load GGUF ${path}: `), err.message);
    return err.message.slice(`Cannot load GGUF ${path}: `.length);
  } finally {
    await Deno.remove(path);
  }
}

Deno.test("readGguf() refuses a string array whose count the file cannot hold, before allocating it, naming the key", async () => {
  const msg = await rejectionOf(rawGguf([[0n, 1n], ["tokenizer.ggml.tokens", 9, 8, 1n << 40n]]));
  // The count ends at byte 69: magic, version, two counts (24), the key (8 + 21), its type, the
  // element type and the count (16); then 2^40 lengths of 8 bytes; the file is 69 + 256 bytes.
  assertEquals(
    msg,
    `file is truncated while reading the ${
      2 ** 40
    } elements of metadata 'tokenizer.ggml.tokens': needs ${2 ** 43 + 69} bytes, received ${
      69 + 256
    }`,
  );
  const plain = await rejectionOf(rawGguf([[0n, 1n], ["general.tags", 9, 8, 1n << 33n]]));
  assert(plain.includes(`the ${2 ** 33} elements of metadata 'general.tags'`), plain);
});

Deno.test("readGguf() refuses arrays nested past 8 levels instead of overflowing the stack", async () => {
  const levels = Array.from({ length: 100_000 }, () => [9, 1n] as (number | bigint)[]);
  const msg = await rejectionOf(rawGguf([[0n, 1n], ["general.nested", 9], ...levels]));
  assertEquals(
    msg,
    "metadata 'general.nested'[0][0][0][0][0][0][0][0] nests arrays more than 8 deep (is the file corrupt?)",
  );
});

Deno.test("readGguf() refuses a tensor that would end past the file before asking for its buffer", async () => {
  // One f32 tensor of 2^20 × 2^20 elements (4 TiB) in a file of a few hundred bytes.
  const msg = await rejectionOf(rawGguf([[1n, 0n], ["huge", 2, 1n << 20n, 1n << 20n, 0, 0n]]));
  assert(
    /^file is truncated while reading the data of tensor 'huge': needs \d+ bytes, received \d+$/
      .test(msg),
    msg,
  );
});
