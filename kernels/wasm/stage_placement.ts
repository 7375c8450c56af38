import type { PlaceTensors } from "../../lib/model/gguf.ts";
import { wasmHeap } from "./heap.ts";
import type { LayerRange } from "./layer_split.ts";
import { placeInHeaps, type PlacementLimits } from "./tensor_placement.ts";

const LAYER = /^blk\.(\d+)\./;

/** Layers a GGUF holds, from its tensors' names (blk.N.*). */
export function layerCount(names: readonly string[]): number {
  return 1 + names.reduce((n, name) => Math.max(n, Number(LAYER.exec(name)?.[1] ?? -1)), -1);
}

/**
 * Whether a pipeline stage running layers `range` of `layers` reads tensor `name`: its layers'
 * blocks, the embedding on the first stage (and on the last where it is also the classifier),
 * the output norm and classifier on the last, and model-wide vectors (rope_freqs) everywhere.
 */
export function stageHolds(
  name: string,
  range: LayerRange,
  layers: number,
  tied: boolean,
): boolean {
  const m = LAYER.exec(name);
  if (m) return Number(m[1]) >= range.start && Number(m[1]) < range.end;
  const last = range.end === layers;
  if (name.startsWith("token_embd")) return range.start === 0 || (tied && last);
  if (name.startsWith("output")) return last;
  return true;
}

/** Refuses a layer range that is not a non-empty part of [0, layers). */
export function checkLayerRange(range: LayerRange, layers: number, source: string): void {
  const ok = Number.isInteger(range.start) && Number.isInteger(range.end) && range.start >= 0 &&
    range.start < range.end && range.end <= layers;
  if (!ok) {
    throw new Error(
      `Invalid layer range ${range.start}-${range.end} for ${source}: it has ${layers} layers, ` +
        `expected start < end within 0-${layers}`,
    );
  }
}

/**
 * Where a pipeline stage reads a GGUF's tensors to: only those of its layer range (stageHolds)
 * are read, by offset, into the CPU engine's memories (split by range as placeInHeaps does
 * when they need several); every other tensor is left unread.
 */
export function stagePlacement(
  range: LayerRange,
  source: string,
  opts: PlacementLimits = {},
): PlaceTensors {
  return (tensors) => {
    const layers = layerCount(tensors.map((t) => t.name));
    checkLayerRange(range, layers, source);
    const tied = !tensors.some((t) => t.name === "output.weight");
    const keep = tensors.map((t) => stageHolds(t.name, range, layers, tied));
    const kept = tensors.filter((_, i) => keep[i]);
    const heap = opts.heap ?? wasmHeap;
    const views = placeInHeaps(kept, opts) ??
      kept.map((t) => heap(0).bytes(t.bytes, `'${t.name}'`));
    let k = 0;
    return tensors.map((_, i) => (keep[i] ? views[k++]! : null));
  };
}
