import type { Gpu, KernelOp } from "./device.ts";
import type { LogitAdjust } from "../../lib/engine/logit_adjust.ts";
import { PlanRegions } from "./plan_regions.ts";

/** u32 words of one entry: sample row, token id, bias, penalty, subtract. */
const ENTRY_WORDS = 5;
const THREADS = 64;

/**
 * lib/engine/logit_adjust.ts on the device: one thread per listed (row, token), in place on the
 * logits buffer after the classifier and before the sampler. Entries of one step never name a
 * (row, token) twice, so threads never race.
 */
export function logitAdjustWgsl(vocab: number): string {
  return /* wgsl */ `
struct Entry { row: u32, token: u32, bias: f32, penalty: f32, subtract: f32 }
struct Adjusts { count: u32, entries: array<Entry> }
@group(0) @binding(0) var<storage, read> adj: Adjusts;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
const V = ${vocab}u;

@compute @workgroup_size(${THREADS})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i >= adj.count) { return; }
  let e = adj.entries[i];
  let at = e.row * V + e.token;
  let x = logits[at] + e.bias;
  let p = select(x * e.penalty, x / e.penalty, x > 0.0);
  logits[at] = p - e.subtract;
}
`;
}

/**
 * The logit-adjust kernel of one engine. Each submit packs every plan's entries into one
 * buffer (PlanRegions: a region each, written once before the submit); `use(i)` points the op
 * at plan i's region before that plan's kernels are encoded.
 */
export class LogitAdjustOp implements KernelOp {
  readonly label = "logit adjust";
  readonly #gpu: Gpu;
  readonly #pipeline: GPUComputePipeline;
  readonly #logits: GPUBuffer;
  readonly #regions: PlanRegions;
  #group: GPUBindGroup | undefined;
  #count = 0;

  constructor(gpu: Gpu, vocab: number, logits: GPUBuffer) {
    this.#gpu = gpu;
    this.#logits = logits;
    this.#pipeline = gpu.pipeline(logitAdjustWgsl(vocab), this.label);
    this.#regions = new PlanRegions(gpu, "logit adjustments");
  }

  /**
   * Packs the adjustments of each plan of one submit (per plan, its sampled rows' adjustments in
   * row order, undefined for a row without) and uploads them.
   */
  prepare(plans: readonly (readonly (LogitAdjust | undefined)[])[]): void {
    const counts = plans.map((rows) => rows.reduce((n, a) => n + (a?.ids.length ?? 0), 0));
    this.#regions.write(counts, ENTRY_WORDS * 4, (data, p, word) => {
      const u32 = new Uint32Array(data), f32 = new Float32Array(data);
      let w = word;
      plans[p]!.forEach((a, row) => {
        if (a === undefined) return;
        for (let i = 0; i < a.ids.length; i++) {
          u32[w] = row;
          u32[w + 1] = a.ids[i]!;
          f32[w + 2] = a.bias[i]!;
          f32[w + 3] = a.penalty[i]!;
          f32[w + 4] = a.subtract[i]!;
          w += ENTRY_WORDS;
        }
      });
    });
  }

  /** Points the next encode at plan `i` of the last prepare() (nothing to do when it has none). */
  use(i: number): void {
    const { count, group } = this.#regions.bind(i, this.#pipeline, [this.#logits], this.label);
    this.#count = count;
    this.#group = group;
  }

  encode(pass: GPUComputePassEncoder): void {
    if (this.#count === 0 || this.#group === undefined) return;
    pass.setPipeline(this.#pipeline);
    pass.setBindGroup(0, this.#group);
    pass.dispatchWorkgroups(Math.ceil(this.#count / THREADS));
  }

  cost() {
    return { flops: 4 * this.#count, bytes: this.#count * (ENTRY_WORDS * 4 + 8) };
  }

  /** Frees its buffers (the engine's `owned` list calls this). */
  destroy(): void {
    this.#regions.destroy();
  }
}
