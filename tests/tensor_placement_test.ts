/**
 * Reading a GGUF too big for one WebAssembly memory (kernels/wasm/tensor_placement.ts): each
 * tensor straight into the memory of its layer range, where the CPU engine then reads it in
 * place. Small memories stand in for 4 GiB ones, so a compat file splits as an 8B file does.
 */
import { assert, assertEquals, assertThrows } from "@std/assert";
import {
  heldLayers,
  kvBlocksBeside,
  placeInHeaps,
  type PlacementLimits,
} from "../kernels/wasm/tensor_placement.ts";
import { WasmHeap } from "../kernels/wasm/heap.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { GREEDY, type SeqInput } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { readGgufHeader, tensorLayout } from "../lib/model/gguf.ts";
import { compatPath } from "./harness/compat.ts";

const MEMORY = 16 << 20;

function smallHeaps(): { heaps: WasmHeap[]; limits: PlacementLimits } {
  const heaps: WasmHeap[] = [];
  return {
    heaps,
    limits: {
      memoryBytes: MEMORY,
      headroom: 4 << 20,
      kvBytes: 1 << 20,
      heap: (i) => (heaps[i] ??= new WasmHeap(MEMORY)),
    },
  };
}

async function logitsOf(e: WasmEngine): Promise<Uint32Array[]> {
  const seqs: SeqInput[] = [[1, 15043, 3186], [1, 17, 18, 19, 20]].map((tokens, i) => ({
    seqId: i,
    tokens,
    startPos: 0,
    blockTable: [i],
    sample: true,
    sampling: GREEDY,
  }));
  const r = await e.step({ stepId: 0, seqs, returnLogits: true });
  return r.sampled.map((s) =>
    new Uint32Array(s.logits!.buffer, s.logits!.byteOffset, s.logits!.length)
  );
}

const KV = { numBlocks: 8, blockSize: 16 };
const OPTS = { maxBatchTokens: 64, maxSeqs: 16, threads: 2 };

Deno.test("a GGUF too big for one memory is read tensor by tensor into two by layer range, and the engine runs it there in place, with the logits of one memory", async () => {
  const path = compatPath("tinyllama-like-q4_0"); // 12.4 MB of tensors, untied classifier
  const { heaps, limits } = smallHeaps();
  const model = await loadModel(path, {
    contextLength: 512,
    placeTensors: (t) => placeInHeaps(t, limits),
  });
  assertEquals(heldLayers(model.weights)?.map((h) => h.layers), [1, 1]);
  assertEquals(heaps.length, 2);
  // The embedding in the first memory, the classifier in the last.
  assert(heaps[0]!.owns(model.weights.tokenEmbedding.data));
  assert(heaps[1]!.owns(model.weights.output.data));
  // Every tensor's bytes are the file's, each read once into its memory.
  const header = await readGgufHeader(path);
  const fileBytes = header.tensorInfos.reduce((n, i) => n + tensorLayout(i, path).bytes, 0);
  const usedAtLoad = heaps.map((h) => h.used);
  assert(
    usedAtLoad.reduce((a, b) => a + b, 0) - 2 * (1 << 20) <=
      fileBytes + 64 * header.tensorInfos.length,
  );

  const split = await WasmEngine.create(model.config, model.weights, KV, OPTS);
  try {
    assertEquals(split.memories, 2);
    // Nothing the size of a matrix was copied: each memory grew by its cache, buffers and
    // norms (f32 copies of a few KiB) only.
    const grown = heaps.reduce((n, h, i) => n + h.used - usedAtLoad[i]!, 0);
    assert(
      grown <= split.memory.kvCache + split.memory.buffers + (1 << 20),
      `${grown} bytes allocated`,
    );
    const whole = await loadModel(path, { contextLength: 512 });
    const one = await WasmEngine.create(whole.config, whole.weights, KV, OPTS);
    try {
      assertEquals(one.memories, 1);
      const [a, b] = [await logitsOf(split), await logitsOf(one)];
      a.forEach((l, i) => assertEquals(Array.from(l), Array.from(b[i]!), `sequence ${i}`));
    } finally {
      one.dispose();
    }
  } finally {
    split.dispose();
  }
});

Deno.test("a tensor bigger than one memory is refused at placement, naming it and the sizes", () => {
  const { limits } = smallHeaps();
  const tensors = [
    { name: "token_embd.weight", bytes: 1000 },
    { name: "blk.0.ffn_up.weight", bytes: 39 << 20 },
    { name: "output.weight", bytes: 1000 },
  ];
  assertThrows(
    () => placeInHeaps(tensors, limits),
    Error,
    `Cannot split the model over CPU engine memories of ${MEMORY} bytes: layer 0 with 'blk.0.ffn_up.weight' (${
      39 << 20
    } bytes) and its ${1 << 20} bytes of KV cache needs`,
  );
});

Deno.test("each layer takes its share of the KV cache to keep room for: more cache, more memories", () => {
  const MiB = 2 ** 20;
  const tensors = [0, 1, 2, 3].map((i) => ({ name: `blk.${i}.ffn_up.weight`, bytes: 4 * MiB }));
  const memoriesFor = (kvBytes: number) => {
    const heaps: WasmHeap[] = [];
    const views = placeInHeaps(tensors, {
      memoryBytes: MEMORY,
      headroom: 2 * MiB,
      kvBytes,
      heap: (i) => (heaps[i] ??= new WasmHeap(MEMORY)),
    });
    return new Set(views!.map((v) => heaps.findIndex((h) => h.owns(v)))).size;
  };
  // 16 MiB less 2 of headroom holds three 4 MiB layers, or one with 4 MiB of cache beside it.
  assertEquals(memoriesFor(0), 2);
  assertEquals(memoriesFor(16 * MiB), 4);
});

Deno.test("a GGUF that fits in one memory beside the headroom is left to the caller's single buffer", () => {
  const { limits } = smallHeaps();
  assertEquals(placeInHeaps([{ name: "blk.0.attn_q.weight", bytes: 1 << 20 }], limits), undefined);
});

Deno.test("kvBlocksBeside() counts the blocks the fullest memory per layer holds beside its headroom", () => {
  const MiB = 2 ** 20;
  // 20 layers with 100 MiB free past the headroom (5 MiB a layer), 10 with 80 (8 MiB a layer):
  // 1 MiB per layer per block holds 5 blocks in the first.
  const memories = [{ room: 612 * MiB, layers: 20 }, { room: 592 * MiB, layers: 10 }];
  assertEquals(kvBlocksBeside(memories, MiB, 512 * MiB), 5);
  assertEquals(kvBlocksBeside([{ room: 100 * MiB, layers: 1 }], MiB, 512 * MiB), 0);
});
