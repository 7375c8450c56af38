import type { PartialRead, PlaceTensors } from "../../lib/model/gguf.ts";
import { wasmHeap } from "./heap.ts";
import type { PlacementLimits } from "./tensor_placement.ts";
import { type Span, type TpShard, tpShard } from "./tp_shard.ts";

const LAYER_MATRIX =
  /^blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$/;

/** The rows of layer matrix `kind` rank `s` computes (tp_shard.ts), in the file's row order. */
function rowsOf(kind: string, s: TpShard, headDim: number): Span {
  const heads = (h: Span) => ({ start: h.start * headDim, end: h.end * headDim });
  if (kind === "attn_q") return heads(s.heads);
  if (kind === "attn_k" || kind === "attn_v") return heads(s.kvHeads);
  if (kind === "ffn_gate" || kind === "ffn_up") return s.hiddenRows;
  return s.dimRows; // attn_output, ffn_down
}

/**
 * Where tensor-parallel rank `rank` of `size` reads a GGUF's tensors to: each layer matrix whole
 * in size (so the engine's row views keep their offsets) but only the rank's rows read, by
 * offset; the pages of the other rows are never touched, so they take no resident memory. The
 * norms, biases and embedding are read whole; the classifier (untied) on rank 0 only. A "neox"
 * file's Q/K rows are reordered within each head, so a rank's heads keep the same rows.
 *
 * Every tensor lands in the first WebAssembly memory: a rank whose file (with the unread rows)
 * needs more than one is refused there, as the engine refuses a rank over several memories.
 */
export function tpPlacement(rank: number, size: number, opts: PlacementLimits = {}): PlaceTensors {
  return (tensors, header) => {
    const arch = header.metadata.get("general.architecture")?.value;
    const nHeads = Number(header.metadata.get(`${arch}.attention.head_count`)?.value);
    const nKvHeads = Number(
      header.metadata.get(`${arch}.attention.head_count_kv`)?.value ?? nHeads,
    );
    const q = tensors.find((t) => t.name === "blk.0.attn_q.weight");
    const gate = tensors.find((t) => t.name === "blk.0.ffn_gate.weight");
    if (!q || !gate || !(nHeads > 0 && nKvHeads > 0)) {
      throw new Error(
        `Cannot place tensor-parallel rank ${rank}'s tensors: expected blk.0.attn_q.weight, ` +
          `blk.0.ffn_gate.weight and ${arch}.attention.head_count in the file`,
      );
    }
    const [qRows, dim] = q.shape as [number, number];
    const shard = tpShard({ dim, hiddenDim: gate.shape[0]!, nHeads, nKvHeads }, rank, size);
    const heap = (opts.heap ?? wasmHeap)(0);
    return tensors.map((t): Uint8Array | PartialRead | null => {
      if (t.name === "output.weight" && rank !== 0) return null;
      const room = heap.room;
      const view = heap.bytes(t.bytes, `'${t.name}'`);
      const kind = LAYER_MATRIX.exec(t.name)?.[1];
      if (kind === undefined) return view;
      const rows = rowsOf(kind, shard, qRows / nHeads);
      const rowBytes = t.bytes / t.shape[0]!;
      const from = rows.start * rowBytes, to = rows.end * rowBytes;
      // Above the heap's old top the memory was never handed out: zeros, left untouched. A
      // reused range holds an earlier owner's bytes, which the load's finite check would read.
      if (room - heap.room < t.bytes) (view.fill(0, 0, from), view.fill(0, to));
      return { view, reads: [[from, to]] };
    });
  };
}
