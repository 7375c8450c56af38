import { assertEquals } from "@std/assert";
import { perfShapeModel, perfTensorType, usesMoreBits } from "../bench/perf_shapes.ts";
import { ggmlTypeName, readGgufHeader } from "../lib/model/gguf.ts";
import { byteSize } from "../lib/model/tensor.ts";
import { compatPath } from "./harness/compat.ts";

// llama-quantize's Q4_K_M files give attn_v and ffn_down more bits in these layers; read from
// the headers of the perf files (../shared/models/perf/README.md), 24 and 16 layers.
Deno.test("usesMoreBits picks the layers llama-quantize gave more bits in the 24- and 16-layer perf files", () => {
  const layers = (n: number) =>
    Array.from({ length: n }, (_, i) => i).filter((i) => usesMoreBits(i, n));
  assertEquals(layers(24), [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
  assertEquals(layers(16), [0, 1, 4, 7, 10, 13, 14, 15]);
});

for (
  const [shape, stem] of [["qwen25_05b", "qwen2-like-q4_k_m"], [
    "llama32_1b",
    "llama3-like-q4_k_m",
  ]] as const
) {
  Deno.test(`perfTensorType gives every matrix of ${stem}.gguf (made by llama-quantize, Q4_K_M) its encoding in that file`, async () => {
    const header = await readGgufHeader(compatPath(stem));
    const layers = 2;
    let compared = 0;
    for (const t of header.tensorInfos) {
      const m = t.name.match(/^(?:blk\.(\d+)\.)?([a-z_]+)\.weight$/);
      if (!m || m[2]!.endsWith("norm") || m[2] === "rope_freqs") continue;
      const got = perfTensorType(shape, m[2]!, Number(m[1] ?? 0), layers);
      assertEquals(got, ggmlTypeName(t.typeId).toLowerCase(), t.name);
      compared++;
    }
    assertEquals(compared, 1 + 7 * layers);
  });
}

Deno.test("perfShapeModel builds the shape's matrices in those encodings, with whole blocks of data", () => {
  const { config, weights } = perfShapeModel("qwen25_05b", 2);
  assertEquals([config.dim, config.hiddenDim, config.vocabSize], [896, 4864, 151936]);
  const l1 = weights.layers[1]!;
  assertEquals([l1.wv.type, l1.wDown.type, l1.wq.type], ["q8_0", "q6_k", "q5_0"]);
  assertEquals(l1.qBias?.shape, [14 * 64]);
  for (const t of [weights.tokenEmbedding, ...weights.layers.flatMap((l) => [l.wq, l.wDown])]) {
    assertEquals(t.data.byteLength, byteSize(t.type, t.shape), t.name);
  }
});
