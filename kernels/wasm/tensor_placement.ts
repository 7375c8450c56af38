import type { ModelWeights } from "../../lib/model/weights.ts";
import { HEAP_BASE, owningHeap, WasmHeap, wasmHeap } from "./heap.ts";
import { availableMemory, UNKNOWN_MEMORY_CAP } from "../../lib/engine/kv_budget.ts";
import { type LayerRange, splitLayers, type SplitUnit } from "./layer_split.ts";

/** What the CPU engine's step buffers and kernels take in a memory beside weights and KV cache. */
export const CPU_HEADROOM = 512 * 2 ** 20;

/**
 * Bytes of KV cache a split model's memories keep room for, over all layers: `--kv-memory` when
 * given, else what planKvCache's automatic size may take at most, a quarter of the memory free
 * once the file is read (`MemAvailable` now, less the file), or its cap when that is unknown.
 * Each layer's share rides with the layer, so a machine with more free memory gets more, less
 * full memories. The room is address space only: pages are committed as blocks are written.
 */
export function splitKvBytes(fileBytes: number, kvMemory?: number): number {
  if (kvMemory !== undefined) return kvMemory;
  const free = availableMemory();
  return free === undefined ? UNKNOWN_MEMORY_CAP : Math.max(0, free - fileBytes) / 4;
}

const LAYER = /^blk\.(\d+)\./;

/**
 * Layer of a GGUF tensor: blk.N.* is layer N; the embedding goes with the first unless it is
 * also the classifier (no output.weight), the rest with the last.
 */
function layerOf(name: string, layers: number, tied: boolean): number {
  const m = LAYER.exec(name);
  if (m) return Number(m[1]);
  return name.startsWith("token_embd") && !tied ? 0 : layers - 1;
}

/** Sizes placeInHeaps splits by: the defaults, or a test's small ones. */
export interface PlacementLimits {
  /** Bytes one memory holds (default 4 GiB). */
  readonly memoryBytes?: number;
  /** Kept free in each memory for step buffers and kernels (default CPU_HEADROOM). */
  readonly headroom?: number;
  /** KV cache to keep room for, over all layers (default splitKvBytes()). */
  readonly kvBytes?: number;
  /** The i-th heap to consider (default: the process's, wasmHeap(i)). */
  readonly heap?: (i: number) => WasmHeap;
}

/**
 * Where a GGUF's tensors are read to for the CPU engine. A file that fits in heap 0 beside
 * CPU_HEADROOM is read there in one piece (undefined: the caller's allocate does it). A bigger
 * one is split by layer range (layer_split.ts), each layer counted with its share of the KV
 * cache (splitKvBytes), and each tensor is read straight into its range's heap: the first heap
 * of the process with room, so weights are never held twice.
 */
export function placeInHeaps(
  tensors: readonly { readonly name: string; readonly bytes: number }[],
  opts: PlacementLimits = {},
): Uint8Array[] | undefined {
  const total = tensors.reduce((n, t) => n + t.bytes, 0);
  const limits = {
    memoryBytes: opts.memoryBytes ?? WasmHeap.MAX_BYTES,
    headroom: opts.headroom ?? CPU_HEADROOM,
    heap: opts.heap ?? wasmHeap,
  };
  if (total + limits.headroom <= limits.heap(0).room) return undefined;
  const tied = !tensors.some((t) => t.name === "output.weight");
  const layers = 1 + tensors.reduce((n, t) => Math.max(n, Number(LAYER.exec(t.name)?.[1] ?? 0)), 0);
  const kvShare = Math.ceil((opts.kvBytes ?? splitKvBytes(total)) / layers);
  const units: { bytes: number; what: string; biggest: number }[] = Array.from(
    { length: layers },
    (_, i) => ({ bytes: kvShare, what: `layer ${i}`, biggest: 0 }),
  );
  for (const t of tensors) {
    const layer = layerOf(t.name, layers, tied);
    const u = units[layer]!;
    u.bytes += t.bytes;
    if (t.bytes > u.biggest) {
      u.biggest = t.bytes;
      u.what =
        `layer ${layer} with '${t.name}' (${t.bytes} bytes) and its ${kvShare} bytes of KV cache`;
    }
  }
  const ranges = splitLayers(units as SplitUnit[], limits.headroom, limits.memoryBytes);
  const heaps = pickHeaps(
    ranges.map((r) => units.slice(r.start, r.end).reduce((n, u) => n + u.bytes, limits.headroom)),
    limits.heap,
  );
  const heapOf = (layer: number) => heaps[ranges.findIndex((r: LayerRange) => layer < r.end)]!;
  return tensors.map((t) => heapOf(layerOf(t.name, layers, tied)).bytes(t.bytes, `'${t.name}'`));
}

/** For each range's bytes, a distinct heap with room for them. */
function pickHeaps(bytes: readonly number[], heap: (i: number) => WasmHeap): WasmHeap[] {
  const picked: WasmHeap[] = [];
  for (const b of bytes) {
    for (let i = 0;; i++) {
      const h = heap(i);
      if (h.room === h.maxBytes - HEAP_BASE && h.room < b) {
        throw new Error(
          `Cannot place ${b} bytes of layers in a CPU engine memory: a fresh one holds ${h.room}`,
        );
      }
      if (!picked.includes(h) && h.room >= b) {
        picked.push(h);
        break;
      }
    }
  }
  return picked;
}

/**
 * The heaps of the process a model's layers (those of `range`, a pipeline stage's) were read
 * into, in layer order, each with how many consecutive layers it holds; undefined when some
 * layer's weights lie elsewhere.
 */
export function heldLayers(
  weights: ModelWeights,
  range: LayerRange = { start: 0, end: weights.layers.length },
): { heap: WasmHeap; layers: number }[] | undefined {
  // wDown: a neox file's Q/K are reordered copies, made at load in ordinary memory.
  const owners = weights.layers.slice(range.start, range.end).map((l) => owningHeap(l.wDown.data));
  if (!owners.every((h) => h !== undefined)) return undefined;
  const runs: { heap: WasmHeap; layers: number }[] = [];
  for (const h of owners) {
    const last = runs[runs.length - 1];
    if (last?.heap === h) last.layers++;
    else runs.push({ heap: h!, layers: 1 });
  }
  return runs;
}

/**
 * KV blocks the CPU engine's memories hold beside what they already have: each memory holds
 * its layers' share of every block (K and V of `layerBlockBytes` per layer) and keeps
 * `headroom` for its step buffers, so the fullest one per layer sets the count.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const MiB = 2 ** 20;
 * // Llama-3.1-8B's 32 layers over two memories, 16 each; a block of 16 f16 tokens is 64 KiB
 * // per layer. 1.5 GiB and 1 GiB free beside the headroom: the second holds 1024 blocks.
 * const memories = [{ room: 2048 * MiB, layers: 16 }, { room: 1536 * MiB, layers: 16 }];
 * assertEquals(kvBlocksBeside(memories, 64 * 1024, 512 * MiB), 1024);
 * ```
 */
export function kvBlocksBeside(
  memories: readonly { readonly room: number; readonly layers: number }[],
  layerBlockBytes: number,
  headroom = CPU_HEADROOM,
): number {
  return Math.min(
    ...memories.map((m) =>
      Math.floor(Math.max(0, m.room - headroom) / (m.layers * layerBlockBytes))
    ),
  );
}
