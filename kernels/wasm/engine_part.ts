import type { ModelConfig } from "../../lib/model/model_config.ts";
import { ActBuffer } from "./act_buffer.ts";
import { HEAP_BASE, type WasmHeap } from "./heap.ts";
import { ATTENTION_GROUP, OP_WORDS } from "./program.ts";
import { CTRL, SCRATCH_BYTES } from "./pool_protocol.ts";

/** Classifier rows computed per program: bounds the logits buffer (rows × vocabulary). */
export const LOGIT_ROWS = 16;

/** The sizes every part's step buffers follow. */
export interface PartShape {
  readonly config: ModelConfig;
  readonly maxRows: number;
  readonly maxSeqs: number;
  readonly threads: number;
  /** Block-table entries a step may use. */
  readonly tableCap: number;
}

/**
 * Rows of scores one thread's attention op keeps: one for every query it computes together
 * (ATTENTION_GROUP prompt rows of a head, or every query head of a KV head at decode).
 */
export function scoreRows(config: ModelConfig): number {
  return Math.max(ATTENTION_GROUP, config.nHeads / config.nKvHeads);
}

/** Bytes of one thread's attention scores (scoreRows rows), a whole number of cache lines. */
export function scoreBytes(config: ModelConfig): number {
  return scoreRows(config) * Math.ceil((config.contextLength + 16) * 4 / 64) * 64;
}

/** Ops in a part's program: at most 16 a layer, the final norm and the end. */
function progOps(config: ModelConfig): number {
  return config.nLayers * 16 + 8;
}

/** The plain buffers of a part, in bytes, by name (the classifier's only in the last part). */
function plainBuffers(s: PartShape, last: boolean) {
  const { dim, hiddenDim, nHeads, nKvHeads, headDim, vocabSize } = s.config;
  const qDim = nHeads * headDim, kvDim = nKvHeads * headDim;
  return {
    x: s.maxRows * dim * 4,
    qkv: s.maxRows * (qDim + 2 * kvDim) * 4,
    gu: s.maxRows * 2 * hiddenDim * 4,
    rowInts: 4 * s.maxRows * 4, // positions | slots | tableOffs | rowmap, maxRows each
    tables: s.tableCap * 4,
    rope: s.maxRows * (s.config.ropeDim / 2) * 8,
    scores: scoreBytes(s.config) * s.threads,
    prog: progOps(s.config) * OP_WORDS * 4,
    logits: last ? LOGIT_ROWS * vocabSize * 4 : 0,
    stats: last ? LOGIT_ROWS * 16 : 0,
    chunkDesc: last ? 64 : 0,
  };
}

/**
 * Bytes a part's memory holds besides its layers' weights and KV cache: its step buffers, the
 * pool's control block and the kernels' static data (a little more, for alignment).
 */
export function partOverheadBytes(s: PartShape, last: boolean): number {
  const { dim, hiddenDim, nHeads, headDim } = s.config;
  const plain = Object.values(plainBuffers(s, last)).reduce((n, b) => n + b + 64, 0);
  const acts = ActBuffer.bytesFor(s.maxRows, dim) +
    ActBuffer.bytesFor(s.maxRows, nHeads * headDim) +
    ActBuffer.bytesFor(s.maxRows, hiddenDim) + (last ? ActBuffer.bytesFor(s.maxSeqs, dim) : 0);
  return HEAP_BASE + CTRL.bytes + s.threads * SCRATCH_BYTES + plain + acts + 4096;
}

/**
 * The step buffers and KV cache one memory of the CPU engine holds for its range of layers.
 * Every part has the rows' inputs (positions, block tables, RoPE) and a residual stream; the
 * engine copies the residual rows from one part to the next. Only the last has the classifier's.
 */
export class EnginePart {
  readonly x: number;
  readonly qkv: number;
  readonly gu: number;
  readonly rowInts: number;
  readonly tables: number;
  readonly rope: number;
  readonly scores: number;
  readonly prog: number;
  readonly progOps: number;
  readonly logits: number;
  readonly stats: number;
  readonly chunkDesc: number;
  readonly actDim: ActBuffer;
  readonly actAtt: ActBuffer;
  readonly actHidden: ActBuffer;
  /** The sampled rows after the final norm (last part only). */
  readonly actOut: ActBuffer | undefined;
  readonly kv: number;
  readonly kvBytes: number;
  /** Bytes of the step buffers. */
  readonly bufferBytes: number;
  readonly #owned: [number, number][] = [];

  constructor(
    readonly heap: WasmHeap,
    /** This part's index among the pool's memories. */
    readonly mem: number,
    readonly start: number,
    readonly end: number,
    shape: PartShape,
    kvLayerBytes: number,
    last: boolean,
  ) {
    const own = (bytes: number, what: string) => {
      if (bytes === 0) return 0;
      const p = heap.alloc(bytes, what);
      this.#owned.push([p, bytes]);
      return p;
    };
    this.kvBytes = 2 * (end - start) * kvLayerBytes;
    this.kv = own(this.kvBytes, `the KV cache of layers ${start}..${end - 1}`);
    const b = plainBuffers(shape, last);
    this.x = own(b.x, "the residual rows");
    this.qkv = own(b.qkv, "the q/k/v rows");
    this.gu = own(b.gu, "the gate/up rows");
    this.rowInts = own(b.rowInts, "per-row indices");
    this.tables = own(b.tables, "block tables");
    this.rope = own(b.rope, "RoPE tables");
    this.scores = own(b.scores, "attention scores");
    this.progOps = progOps(shape.config);
    this.prog = own(b.prog, "the step program");
    this.logits = own(b.logits, "the logits");
    this.stats = own(b.stats, "the logits' row statistics");
    this.chunkDesc = own(b.chunkDesc, "a classifier descriptor");
    const { dim, hiddenDim, nHeads, headDim } = shape.config;
    this.actDim = new ActBuffer(heap, shape.maxRows, dim, "activation rows");
    this.actAtt = new ActBuffer(heap, shape.maxRows, nHeads * headDim, "attention rows");
    this.actHidden = new ActBuffer(heap, shape.maxRows, hiddenDim, "hidden rows");
    this.actOut = last ? new ActBuffer(heap, shape.maxSeqs, dim, "classifier rows") : undefined;
    this.bufferBytes = this.#owned.reduce((n, [, bytes]) => n + bytes, -this.kvBytes) +
      this.#acts().reduce((n, a) => n + a.bytes, 0);
  }

  #acts(): ActBuffer[] {
    return [this.actDim, this.actAtt, this.actHidden, ...(this.actOut ? [this.actOut] : [])];
  }

  /** Returns the buffers and the KV cache to the heap. */
  free(): void {
    for (const [p, n] of this.#owned) this.heap.free(p, n);
    for (const a of this.#acts()) a.free();
  }
}
