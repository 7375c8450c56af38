import {
  assert,
  assertEquals,
  assertNotEquals,
  assertStrictEquals,
  assertThrows,
} from "@std/assert";
import { dequantize } from "../lib/model/dequantize.ts";
import { parseGguf, readGguf } from "../lib/model/gguf.ts";
import { ggufToModel } from "../lib/model/gguf_model.ts";
import { parseLlama2cCheckpoint } from "../lib/model/llama2c_checkpoint.ts";
import type { Tensor } from "../lib/model/tensor.ts";
import { T, TINY, tinyLlamaGguf } from "./_gguf_writer.ts";
import { corruptedCopy, ggufString, modelFile, replaceUnique } from "./harness/model_files.ts";

const enc = new TextEncoder();

async function stories() {
  const path = modelFile("stories260K.gguf");
  return ggufToModel(await readGguf(path), path);
}

Deno.test("ggufToModel() reads the stories260K config from llama.* metadata", async () => {
  const m = await stories();
  // Values from the models README; context 128 is what the converter wrote.
  assertEquals(m.config, {
    architecture: "llama",
    dim: 64,
    hiddenDim: 172,
    nLayers: 5,
    nHeads: 8,
    nKvHeads: 4,
    headDim: 8,
    vocabSize: 512,
    contextLength: 128,
    ropeTheta: 10000,
    ropeDim: 8,
    rmsEps: Math.fround(1e-5),
  });
  assertEquals(m.weights.layers.length, 5);
  assertEquals(m.chatTemplate, undefined);
});

/** llama.cpp's HF-converter permutation: rows reshaped (nHead, 2, headDim/2) -> (nHead, headDim/2, 2). */
function permuteRows(
  w: Float32Array,
  nHead: number,
  headDim: number,
  cols: number,
  inverse: boolean,
): Float32Array {
  const out = new Float32Array(w.length);
  for (let h = 0; h < nHead; h++) {
    for (let i = 0; i < headDim / 2; i++) {
      for (let j = 0; j < 2; j++) {
        const halves = h * headDim + j * (headDim / 2) + i;
        const pairs = h * headDim + i * 2 + j;
        const [from, to] = inverse ? [pairs, halves] : [halves, pairs];
        out.set(w.subarray(from * cols, (from + 1) * cols), to * cols);
      }
    }
  }
  return out;
}

Deno.test("ggufToModel() gives the same weights as the llama2.c checkpoint, Q and K included (no un-permuting needed)", async () => {
  const g = await stories();
  const binPath = modelFile("stories260K.bin");
  const b = parseLlama2cCheckpoint(await Deno.readFile(binPath), binPath);
  const same = (x: Tensor, y: Tensor, what: string) => {
    assertEquals(x.shape, y.shape, what);
    assertEquals(dequantize(x), dequantize(y), what);
  };
  same(g.weights.tokenEmbedding, b.weights.tokenEmbedding, "token embedding");
  same(g.weights.outputNorm, b.weights.outputNorm, "output norm");
  same(g.weights.output, b.weights.output, "output");
  const { nHeads, nKvHeads, headDim, dim } = g.config;
  for (let l = 0; l < g.config.nLayers; l++) {
    const gl = g.weights.layers[l]!;
    const bl = b.weights.layers[l]!;
    for (
      const k of ["attnNorm", "wq", "wk", "wv", "wo", "ffnNorm", "wGate", "wDown", "wUp"] as const
    ) {
      same(gl[k], bl[k], `layer ${l} ${k}`);
    }
    // The comparison can tell layouts apart: either permutation would have changed Q and K.
    for (const [k, heads] of [["wq", nHeads], ["wk", nKvHeads]] as const) {
      for (const inverse of [false, true]) {
        assertNotEquals(
          permuteRows(dequantize(bl[k]), heads, headDim, dim, inverse),
          dequantize(gl[k]),
          `layer ${l} ${k}`,
        );
      }
    }
  }
});

Deno.test("ggufToModel() reads the SentencePiece vocabulary from tokenizer.ggml.*", async () => {
  const m = await stories();
  const tok = m.tokenizer!;
  assertEquals(tok.tokens.length, 512);
  assertEquals(tok.tokens.slice(0, 4), ["<unk>", "<s>", "</s>", "<0x00>"]);
  assertEquals(tok.bosId, 1);
  assertEquals(tok.eosId, 2);
  assertEquals(tok.scores.length, 512);
  assertEquals(Array.from(tok.tokenTypes!.subarray(0, 4)), [2, 3, 3, 6]);
  // The converter copied tok512.bin's scores; read them straight from that file as the oracle.
  const bin = await Deno.readFile(modelFile("tok512.bin"));
  const view = new DataView(bin.buffer);
  let o = 4;
  for (let i = 0; i < 512; i++) {
    assertEquals(tok.scores[i], view.getFloat32(o, true), `score ${i}`);
    o += 8 + view.getInt32(o + 4, true);
  }
});

Deno.test("ggufToModel() reads every hyper-parameter, the chat template and an untied classifier", () => {
  const tpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
  const m = ggufToModel(
    parseGguf(
      tinyLlamaGguf({ extra: [{ key: "tokenizer.chat_template", type: T.STRING, value: tpl }] }),
      "tiny.gguf",
    ),
    "tiny.gguf",
  );
  assertEquals(m.config, {
    architecture: "llama",
    dim: TINY.dim,
    hiddenDim: TINY.ff,
    nLayers: TINY.layers,
    nHeads: TINY.heads,
    nKvHeads: TINY.kvHeads,
    headDim: TINY.dim / TINY.heads,
    vocabSize: TINY.vocab,
    contextLength: TINY.ctx,
    ropeTheta: 500000,
    ropeDim: TINY.dim / TINY.heads,
    rmsEps: Math.fround(1e-6),
  });
  assertEquals(m.chatTemplate, tpl);
  assertEquals(m.tokenizer?.tokens, ["<unk>", "<s>", "</s>", "<0x0A>", "▁a", "▁b"]);
  assertEquals(m.tokenizer?.scores, new Float32Array([0, 0, 0, 0, -1, -2]));
  assertEquals(m.weights.output.name, "output.weight");
  assertEquals(m.weights.layers[1]!.wk.shape, [TINY.dim / TINY.heads * TINY.kvHeads, TINY.dim]);
  assertEquals(m.source, "tiny.gguf");
});

Deno.test("ggufToModel() applies the documented defaults for optional llama.* keys", () => {
  const headDim = TINY.dim / TINY.heads;
  const bytes = tinyLlamaGguf({
    omit: [
      "llama.attention.head_count_kv",
      "llama.rope.freq_base",
      "llama.rope.dimension_count",
      "llama.attention.layer_norm_rms_epsilon",
    ],
    // Without head_count_kv every head has its own K and V.
    dims: Object.fromEntries(
      Array.from({ length: TINY.layers }, (_, l) => [
        [`blk.${l}.attn_k.weight`, [TINY.dim, TINY.dim]],
        [`blk.${l}.attn_v.weight`, [TINY.dim, TINY.dim]],
      ]).flat(),
    ),
  });
  const c = ggufToModel(parseGguf(bytes, "tiny.gguf"), "tiny.gguf").config;
  assertEquals([c.nKvHeads, c.ropeTheta, c.ropeDim, c.rmsEps], [TINY.heads, 10000, headDim, 1e-5]);
});

Deno.test("ggufToModel() takes the vocabulary size from token_embd when the file has no tokenizer", () => {
  const omit = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
  ];
  const m = ggufToModel(parseGguf(tinyLlamaGguf({ omit }), "tiny.gguf"), "tiny.gguf");
  assertEquals(m.config.vocabSize, TINY.vocab);
  assertEquals(m.tokenizer, undefined);
});

Deno.test("ggufToModel() refuses a model whose vocabulary size it cannot tell", () => {
  // Token ids are checked against the vocabulary size; a model without one must not load.
  const noTokenizer = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
  ];
  const shapeless = parseGguf(
    tinyLlamaGguf({ omit: noTokenizer, dims: { "token_embd.weight": [] } }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(shapeless, "t.gguf"),
    Error,
    "Cannot load GGUF t.gguf: tensor 'token_embd.weight' has no vocabulary dimension",
  );
  const empty = parseGguf(
    tinyLlamaGguf({
      omit: ["tokenizer.ggml.scores", "tokenizer.ggml.token_type"],
      extra: [{
        key: "tokenizer.ggml.tokens",
        type: T.ARRAY,
        value: { elementType: T.STRING, items: [] },
      }],
    }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(empty, "t.gguf"),
    Error,
    "Cannot load GGUF t.gguf: metadata 'tokenizer.ggml.tokens' must hold at least one token, received []",
  );
});

Deno.test("ggufToModel() ties the classifier to token_embd when output.weight is absent", () => {
  const g = parseGguf(tinyLlamaGguf({ omitTensors: ["output.weight"] }), "t.gguf");
  const m = ggufToModel(g, "t.gguf");
  assertStrictEquals(m.weights.output, m.weights.tokenEmbedding);
});

Deno.test("ggufToModel() refuses a tensor the architecture does not use instead of ignoring it", async () => {
  const path = await corruptedCopy(
    "stories260K.gguf",
    (b) => replaceUnique(b, ggufString("output.weight"), ggufString("outpux.weight")),
  );
  assertThrows(
    () => ggufToModel(parseGguf(Deno.readFileSync(path), path), path),
    Error,
    "architecture 'llama' does not use 1 of its tensors (outpux.weight)",
  );
});

// --- errors ---

Deno.test("ggufToModel() rejects an unknown architecture", async () => {
  const value = (s: string) =>
    new Uint8Array([...ggufString("general.architecture"), 8, 0, 0, 0, ...ggufString(s)]);
  const path = await corruptedCopy(
    "stories260K.gguf",
    (b) => replaceUnique(b, value("llama"), value("ollmo")),
  );
  const g = await readGguf(path);
  assertThrows(
    () => ggufToModel(g, path),
    Error,
    `Cannot load GGUF ${path}: architecture 'ollmo' is not supported (supported: llama, qwen2, qwen3)`,
  );
});

Deno.test("ggufToModel() rejects a missing tensor, naming it", async () => {
  const path = await corruptedCopy(
    "stories260K.gguf",
    (b) => replaceUnique(b, enc.encode("blk.3.ffn_up.weight"), enc.encode("blk.3.ffn_up.wEight")),
  );
  const g = await readGguf(path);
  assertThrows(
    () => ggufToModel(g, path),
    Error,
    `Cannot load GGUF ${path}: tensor 'blk.3.ffn_up.weight' is missing`,
  );
});

Deno.test("ggufToModel() rejects a tokenizer model other than llama and gpt2", () => {
  const g = parseGguf(
    tinyLlamaGguf({ extra: [{ key: "tokenizer.ggml.model", type: T.STRING, value: "bert" }] }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(g, "t.gguf"),
    Error,
    "tokenizer model 'bert' (tokenizer.ggml.model) is not supported (supported: llama, gpt2)",
  );
});

Deno.test("ggufToModel() names an unknown byte-level BPE pre-tokenizer", () => {
  const g = parseGguf(
    tinyLlamaGguf({
      extra: [
        { key: "tokenizer.ggml.model", type: T.STRING, value: "gpt2" },
        { key: "tokenizer.ggml.pre", type: T.STRING, value: "klingon" },
      ],
    }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(g, "t.gguf"),
    Error,
    "pre-tokenizer 'klingon' (tokenizer.ggml.pre) is not supported (supported: llama-bpe,",
  );
});

Deno.test("ggufToModel() asks a byte-level BPE vocabulary for its merges", () => {
  const g = parseGguf(
    tinyLlamaGguf({
      extra: [
        { key: "tokenizer.ggml.model", type: T.STRING, value: "gpt2" },
        { key: "tokenizer.ggml.pre", type: T.STRING, value: "qwen2" },
      ],
    }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(g, "t.gguf"),
    Error,
    "metadata 'tokenizer.ggml.merges' must be a non-empty array of strings for a byte-level BPE vocabulary, received nothing",
  );
});

Deno.test("ggufToModel() rejects a tensor of the wrong shape", () => {
  const g = parseGguf(tinyLlamaGguf({ dims: { "blk.1.attn_q.weight": [TINY.dim, 4] } }), "t.gguf");
  assertThrows(
    () => ggufToModel(g, "t.gguf"),
    Error,
    "tensor 'blk.1.attn_q.weight' has shape [4, 8], expected [8, 8]",
  );
});

Deno.test("ggufToModel() rejects missing or mistyped llama.* metadata", () => {
  const missing = parseGguf(tinyLlamaGguf({ omit: ["llama.block_count"] }), "t.gguf");
  assertThrows(
    () => ggufToModel(missing, "t.gguf"),
    Error,
    "metadata 'llama.block_count' is missing",
  );
  const mistyped = parseGguf(
    tinyLlamaGguf({ extra: [{ key: "llama.embedding_length", type: T.STRING, value: "8" }] }),
    "t.gguf",
  );
  assertThrows(
    () => ggufToModel(mistyped, "t.gguf"),
    Error,
    "metadata 'llama.embedding_length' must be a number, received '8'",
  );
  const noArch = parseGguf(tinyLlamaGguf({ omit: ["general.architecture"] }), "t.gguf");
  const err = assertThrows(() => ggufToModel(noArch, "t.gguf"), Error);
  assert(err.message.includes("'general.architecture' is missing"), err.message);
});
