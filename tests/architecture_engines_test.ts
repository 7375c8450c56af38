/**
 * qwen2 (q/k/v biases, NEOX RoPE), qwen3 (q/k norms, head size from key_length, NEOX) and
 * llama with Llama 3 RoPE factors, on both engines, against an independent float64 forward
 * pass (tests/_hf_forward.ts) that reads the files in their own layout. The compat files in
 * compat_llama_cpp_test.ts check the same steps against llama.cpp on real-shaped models.
 */
import { assert, assertEquals, assertLess } from "@std/assert";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { type Engine, GREEDY } from "../lib/engine/engine.ts";
import { type GgufFile, parseGguf } from "../lib/model/gguf.ts";
import { ggufToModel } from "../lib/model/gguf_model.ts";
import type { Model } from "../lib/model/weights.ts";
import { f32Bytes, T, TINY, tinyLlamaGguf, type TinyLlamaOptions } from "./_gguf_writer.ts";
import { relativeError, testGpu } from "./_gpu.ts";
import { hfForward, type HfShape } from "./_hf_forward.ts";

const CTX = 512;
const KV = { numBlocks: CTX / 16, blockSize: 16 };
const base: HfShape = {
  dim: TINY.dim,
  heads: TINY.heads,
  kvHeads: TINY.kvHeads,
  headDim: TINY.dim / TINY.heads,
  ropeDim: TINY.dim / TINY.heads,
  ff: TINY.ff,
  layers: TINY.layers,
  vocab: TINY.vocab,
  theta: 500000,
  eps: Math.fround(1e-6),
  neox: false,
};
const longCtx = { key: "", type: T.U32, value: CTX };

function file(arch: string, opts: TinyLlamaOptions): GgufFile {
  const extra = [{ ...longCtx, key: `${arch}.context_length` }, ...(opts.extra ?? [])];
  return parseGguf(tinyLlamaGguf({ ...opts, arch, extra }), `${arch}.gguf`);
}

function qwen2(): { g: GgufFile; shape: HfShape } {
  const kvDim = base.headDim * TINY.kvHeads;
  const addTensors = Array.from({ length: TINY.layers }, (_, l) =>
    [
      [`blk.${l}.attn_q.bias`, [TINY.dim]],
      [`blk.${l}.attn_k.bias`, [kvDim]],
      [`blk.${l}.attn_v.bias`, [kvDim]],
    ] as [string, number[]][]).flat();
  return { g: file("qwen2", { addTensors }), shape: { ...base, neox: true } };
}

function qwen3(): { g: GgufFile; shape: HfShape } {
  const hd = 8;
  const dims: Record<string, number[]> = {};
  const addTensors: [string, number[]][] = [];
  for (let l = 0; l < TINY.layers; l++) {
    dims[`blk.${l}.attn_q.weight`] = [TINY.dim, TINY.heads * hd];
    dims[`blk.${l}.attn_k.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_v.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_output.weight`] = [TINY.heads * hd, TINY.dim];
    addTensors.push([`blk.${l}.attn_q_norm.weight`, [hd]], [`blk.${l}.attn_k_norm.weight`, [hd]]);
  }
  const g = file("qwen3", {
    omit: ["qwen3.rope.dimension_count"],
    extra: [
      { key: "qwen3.attention.key_length", type: T.U32, value: hd },
      { key: "qwen3.attention.value_length", type: T.U32, value: hd },
    ],
    dims,
    addTensors,
  });
  return { g, shape: { ...base, headDim: hd, ropeDim: hd, neox: true } };
}

/** llama with a head size from key_length, as Mistral Nemo's files have (128 against 5120 / 32). */
function llamaKeyLength(): { g: GgufFile; shape: HfShape } {
  const hd = 8;
  const dims: Record<string, number[]> = {};
  for (let l = 0; l < TINY.layers; l++) {
    dims[`blk.${l}.attn_q.weight`] = [TINY.dim, TINY.heads * hd];
    dims[`blk.${l}.attn_k.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_v.weight`] = [TINY.dim, TINY.kvHeads * hd];
    dims[`blk.${l}.attn_output.weight`] = [TINY.heads * hd, TINY.dim];
  }
  const g = file("llama", {
    extra: [
      { key: "llama.attention.key_length", type: T.U32, value: hd },
      { key: "llama.attention.value_length", type: T.U32, value: hd },
      { key: "llama.rope.dimension_count", type: T.U32, value: hd },
    ],
    dims,
  });
  return { g, shape: { ...base, headDim: hd, ropeDim: hd } };
}

/** llama with rope_freqs.weight: pair 1 turns 40 times slower (a Llama 3 long-context factor). */
function llama3Rope(factors = [1, 40]): { g: GgufFile; shape: HfShape } {
  const bytes = tinyLlamaGguf({
    extra: [{ ...longCtx, key: "llama.context_length" }],
    addTensors: [["rope_freqs.weight", [2]]],
  });
  const g = parseGguf(bytes, "llama3.gguf");
  // The writer fills tensors with random values; the factors must be the chosen positive ones.
  g.tensors.get("rope_freqs.weight")!.data.set(f32Bytes(factors));
  return { g, shape: base };
}

/** A prompt long enough for RoPE's slow pairs to turn: 300 tokens of the 6-token vocabulary. */
const LONG = Array.from({ length: 300 }, (_, i) => (i * 7 + (i >> 3)) % TINY.vocab);
const SHORT = [1, 4, 5, 3, 4];

async function assertMatchesOracle(
  name: string,
  { g, shape }: { g: GgufFile; shape: HfShape },
  prompt: readonly number[],
) {
  const model: Model = ggufToModel(g, name);
  const want = hfForward(g, shape, prompt);
  const gpu = await WebGpuEngine.create(model.config, model.weights, KV, {
    gpu: await testGpu(),
    kvDtype: "f32",
  });
  const engines: Engine[] = [new CpuEngine(model.config, model.weights, KV), gpu];
  try {
    for (const engine of engines) {
      // The prompt, then 8 greedy tokens: the logits at every step against the oracle's.
      const run = await referenceGenerate(engine, prompt, 8, GREEDY, { returnLogits: true });
      const all = [...prompt, ...run.tokens];
      const oracle = hfForward(g, shape, all.slice(0, -1)).slice(prompt.length - 1);
      assertEquals(oracle[0], want[prompt.length - 1]);
      run.logits.forEach((l, i) => {
        const err = relativeError(l, oracle[i]!);
        assertLess(err, 2e-4, `${name} on ${engine.name}: logits of step ${i} off by ${err}`);
      });
    }
  } finally {
    gpu.dispose();
  }
}

Deno.test("qwen2 (q/k/v biases, NEOX RoPE): both engines equal a float64 Hugging Face-layout forward", async () => {
  await assertMatchesOracle("qwen2", qwen2(), SHORT);
});

Deno.test("qwen3 (q/k norms, head size 8 from key_length with embedding 8 / 2 heads): both engines equal the float64 forward", async () => {
  await assertMatchesOracle("qwen3", qwen3(), SHORT);
});

Deno.test("llama with key_length 8 != embedding 8 / 2 heads (Mistral Nemo-shaped): both engines equal the float64 forward", async () => {
  await assertMatchesOracle("llama-key-length", llamaKeyLength(), SHORT);
});

Deno.test("llama with rope_freqs.weight over a 300-token prompt: both engines equal the float64 forward with scaled frequencies", async () => {
  const f = llama3Rope();
  await assertMatchesOracle("llama3-rope", f, LONG);
  // The check can fail: the same prompt without the factors gives clearly different logits.
  const unscaled = hfForward(f.g, f.shape, LONG).at(-1)!;
  const plain = llama3Rope([1, 1]);
  const without = hfForward(plain.g, plain.shape, LONG).at(-1)!;
  assert(relativeError(without, unscaled) > 1e-2, "the factors must matter at this length");
});
