import { assert, assertEquals, assertRejects, assertThrows } from "@std/assert";
import { dequantize } from "../lib/model/dequantize.ts";
import { parseGguf } from "../lib/model/gguf.ts";
import { ggufToModel } from "../lib/model/gguf_model.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { ropeFrequencies } from "../lib/model/model_config.ts";
import { neoxToNormOrder } from "../lib/model/rope_layout.ts";
import { T, TINY, tinyLlamaGguf, writeGguf } from "./_gguf_writer.ts";
import { tempFile } from "./harness/model_files.ts";

const rowOf = (m: Float32Array, cols: number, r: number) => m.slice(r * cols, (r + 1) * cols);

Deno.test("neoxToNormOrder() interleaves each head's two RoPE halves and keeps the unrotated tail", () => {
  // Two heads of 6 with 4 rotated dims: pairs (0,2), (1,3) become adjacent; 4 and 5 stay.
  assertEquals(neoxToNormOrder(2, 6, 4), [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11]);
  assertEquals(neoxToNormOrder(1, 4, 4), [0, 2, 1, 3]);
});

const headDim = TINY.dim / TINY.heads; // 4
const kvDim = headDim * TINY.kvHeads;
const qwen2Biases = Array.from({ length: TINY.layers }, (_, l) =>
  [
    [`blk.${l}.attn_q.bias`, [TINY.dim]],
    [`blk.${l}.attn_k.bias`, [kvDim]],
    [`blk.${l}.attn_v.bias`, [kvDim]],
  ] as [string, number[]][]).flat();

Deno.test("a qwen2 file's q/k rows and biases are reordered from NEOX halves to adjacent pairs; v is not", () => {
  const bytes = tinyLlamaGguf({ arch: "qwen2", addTensors: qwen2Biases });
  const g = parseGguf(bytes, "q.gguf");
  const m = ggufToModel(g, "q.gguf");
  assertEquals(m.config.architecture, "qwen2");
  assertEquals(m.config.steps, { qkvBias: true, qkNorm: false });
  const layer = m.weights.layers[1]!;
  const fileQ = dequantize(g.tensors.get("blk.1.attn_q.weight")!);
  const gotQ = dequantize(layer.wq);
  // Head h, pair i: loaded rows 2i and 2i+1 are the file's rows i and i + headDim/2.
  const want = [0, 2, 1, 3, 4, 6, 5, 7];
  want.forEach((from, r) => assertEquals(rowOf(gotQ, TINY.dim, r), rowOf(fileQ, TINY.dim, from)));
  const fileQb = dequantize(g.tensors.get("blk.1.attn_q.bias")!);
  assertEquals(Array.from(dequantize(layer.qBias!)), want.map((i) => fileQb[i]!));
  const fileKb = dequantize(g.tensors.get("blk.1.attn_k.bias")!);
  assertEquals(Array.from(dequantize(layer.kBias!)), [0, 2, 1, 3].map((i) => fileKb[i]!));
  assertEquals(layer.wv, g.tensors.get("blk.1.attn_v.weight"));
  assertEquals(layer.vBias, g.tensors.get("blk.1.attn_v.bias"));
});

Deno.test("a qwen2 file without its biases is refused, naming the first missing one", () => {
  const g = parseGguf(tinyLlamaGguf({ arch: "qwen2" }), "q.gguf");
  assertThrows(() => ggufToModel(g, "q.gguf"), Error, "tensor 'blk.0.attn_q.bias' is missing");
});

Deno.test("a qwen3 file takes its head size from key_length (q wider than the embedding) and its q/k norms", () => {
  const hd = 8; // != dim / heads = 4
  const dims: Record<string, number[]> = {};
  const norms: [string, number[]][] = [];
  for (let l = 0; l < TINY.layers; l++) {
    dims[`blk.${l}.attn_q.weight`] = [TINY.dim, TINY.heads * hd];
    dims[`blk.${l}.attn_k.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_v.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_output.weight`] = [TINY.heads * hd, TINY.dim];
    norms.push([`blk.${l}.attn_q_norm.weight`, [hd]], [`blk.${l}.attn_k_norm.weight`, [hd]]);
  }
  const bytes = tinyLlamaGguf({
    arch: "qwen3",
    omit: ["qwen3.rope.dimension_count"],
    extra: [
      { key: "qwen3.attention.key_length", type: T.U32, value: hd },
      { key: "qwen3.attention.value_length", type: T.U32, value: hd },
    ],
    dims,
    addTensors: norms,
  });
  const g = parseGguf(bytes, "q3.gguf");
  const m = ggufToModel(g, "q3.gguf");
  assertEquals([m.config.headDim, m.config.ropeDim, m.config.dim], [hd, hd, TINY.dim]);
  assertEquals(m.config.steps, { qkvBias: false, qkNorm: true });
  const fileNorm = dequantize(g.tensors.get("blk.0.attn_q_norm.weight")!);
  assertEquals(
    Array.from(dequantize(m.weights.layers[0]!.qNorm!)),
    [0, 4, 1, 5, 2, 6, 3, 7].map((i) => fileNorm[i]!),
  );
});

Deno.test("an unsupported file is refused with every blocker listed at once, before its data is read", async () => {
  const tensor = (name: string, typeId: number) => ({
    name,
    dims: [32, 2],
    typeId,
    data: new Uint8Array(0),
  });
  const bytes = writeGguf({
    metadata: [
      { key: "general.architecture", type: T.STRING, value: "gemma2" },
      { key: "tokenizer.ggml.model", type: T.STRING, value: "rwkv" },
    ],
    // The header claims data the file does not hold: only the header may be read.
    tensors: [
      tensor("a", 16),
      tensor("b", 20),
      tensor("c", 16),
      tensor("d", 0),
      tensor("e", 20),
      tensor("f", 20),
    ],
  });
  const path = await tempFile("blocked.gguf", bytes);
  const err = await assertRejects(() => loadModel(path), Error);
  assertEquals(
    err.message,
    `Cannot load GGUF ${path}: 4 problems:
  - architecture 'gemma2' is not supported (supported: llama, qwen2, qwen3)
  - tokenizer model 'rwkv' (tokenizer.ggml.model) is not supported (supported: ${
      err.message.match(/\(tokenizer\.ggml\.model\) is not supported \(supported: ([^)]*)\)/)![1]
    })
  - tensor type IQ2_XXS (ggml type 16) in 2 tensors (first: a) is not supported (supported: ${
      err.message.match(/IQ2_XXS.*? is not supported \(supported: ([^)]*)\)/)![1]
    })
  - tensor type IQ4_NL (ggml type 20) in 3 tensors (first: b) is not supported (supported: ${
      err.message.match(/IQ4_NL.*? is not supported \(supported: ([^)]*)\)/)![1]
    })`,
  );
  assert(err.message.includes("F32"), err.message);
});

Deno.test("ropeFrequencies() divides each pair's frequency by its Llama 3 factor, as a float64 hand computation does", () => {
  // Llama 3.1 scaling (factor 32, low 1, high 4, original context 8192), the formula of Meta's
  // reference code, in float64; the factors are what a converter stores in rope_freqs.weight.
  const theta = 500000;
  const ropeDim = 64;
  const [factor, low, high, orig] = [32, 1, 4, 8192];
  const base = Array.from({ length: ropeDim / 2 }, (_, i) => Math.pow(theta, -(2 * i) / ropeDim));
  const scaled = base.map((f) => {
    const wavelen = (2 * Math.PI) / f;
    if (wavelen < orig / high) return f;
    if (wavelen > orig / low) return f / factor;
    const smooth = (orig / wavelen - low) / (high - low);
    return (1 - smooth) * (f / factor) + smooth * f;
  });
  const factors = new Float32Array(base.map((f, i) => f / scaled[i]!));
  const got = ropeFrequencies({ ropeTheta: theta, ropeDim, ropeFreqFactors: factors });
  // At position 5000 the angles agree to f32 rounding of the stored factors.
  for (let i = 0; i < ropeDim / 2; i++) {
    const want = 5000 * scaled[i]!;
    assert(Math.abs(5000 * got[i]! - want) <= 1e-6 * Math.max(1, want), `pair ${i}`);
  }
  // The scaling matters: the lowest frequencies are 32 times slower.
  assert(Math.abs(got[ropeDim / 2 - 1]! * 32 - base[ropeDim / 2 - 1]!) < 1e-12);
  assertEquals(got[0], 1);
});
