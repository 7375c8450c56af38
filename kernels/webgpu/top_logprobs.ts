import type { Gpu, KernelOp } from "./device.ts";
import { MAX_TOP_LOGPROBS } from "../../lib/engine/top_logprobs.ts";
import { PlanRegions } from "./plan_regions.ts";

/** As in sample.ts: llvmpipe leaves a loop after 65535 iterations per invocation, silently. */
const LOOP_BUDGET = 64000;

/**
 * Threads per row: the fewest (a power of two, at least `base`) whose invocations stay within
 * LOOP_BUDGET: each runs 2 + n strided passes over the vocabulary and as many reductions.
 */
export function topLogprobsThreads(vocab: number, base: number): number {
  const passes = MAX_TOP_LOGPROBS + 2;
  const iterations = (t: number) => Math.ceil(vocab / t) * passes + passes * t;
  let t = base;
  while (iterations(t) > LOOP_BUDGET && t < 256) t *= 2;
  return t;
}

/**
 * lib/engine/top_logprobs.ts on the device, one workgroup per row that asks: the log-sum-exp of
 * the row, then n picks, each the largest rank key (the sampler's: order-preserving logit bits,
 * then the lower id) strictly below the previous pick. Reductions run in thread order, so a
 * row's result does not depend on the other rows.
 */
export function topLogprobsWgsl(vocab: number, threads: number): string {
  return /* wgsl */ `
struct Ask { row: u32, n: u32 }
struct Asks { count: u32, asks: array<Ask> }
@group(0) @binding(0) var<storage, read> req: Asks;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
const V = ${vocab}u;
const T = ${threads}u;
const MAX_N = ${MAX_TOP_LOGPROBS}u;
var<workgroup> redF: array<f32, T>;
var<workgroup> redK: array<u32, T>;
var<workgroup> redL: array<u32, T>;
var<workgroup> redH: array<u32, T>;

fn orderKey(z: f32) -> u32 {
  let b = bitcast<u32>(z);
  return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}
fn after(k: u32, l: u32, ck: u32, cl: u32) -> bool {
  return k > ck || (k == ck && l > cl);
}

@compute @workgroup_size(T)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let a = wg.x;
  if (a >= req.count) { return; }
  let ask = req.asks[a];
  let base = ask.row * V;
  var m = -3.4e38;
  for (var j = t; j < V; j += T) { m = max(m, logits[base + j]); }
  redF[t] = m;
  workgroupBarrier();
  var mx = redF[0];
  for (var i = 1u; i < T; i++) { mx = max(mx, redF[i]); }
  workgroupBarrier();
  var s = 0.0;
  for (var j = t; j < V; j += T) { s += exp(logits[base + j] - mx); }
  redF[t] = s;
  workgroupBarrier();
  var total = 0.0;
  for (var i = 0u; i < T; i++) { total += redF[i]; }
  workgroupBarrier();
  let logSum = log(total);
  var pk = 0u;
  var pl = 0u;
  for (var k = 0u; k < min(ask.n, MAX_N); k++) {
    var bk = 0u;
    var bl = 0u;
    var has = false;
    for (var j = t; j < V; j += T) {
      let key = orderKey(logits[base + j]);
      let l = V - 1u - j;
      if ((k == 0u || after(pk, pl, key, l)) && (!has || after(key, l, bk, bl))) {
        bk = key;
        bl = l;
        has = true;
      }
    }
    redK[t] = bk;
    redL[t] = bl;
    redH[t] = select(0u, 1u, has);
    workgroupBarrier();
    var ck = 0u;
    var cl = 0u;
    var found = false;
    for (var i = 0u; i < T; i++) {
      if (redH[i] == 1u && (!found || after(redK[i], redL[i], ck, cl))) {
        ck = redK[i];
        cl = redL[i];
        found = true;
      }
    }
    workgroupBarrier();
    let id = V - 1u - cl;
    if (t == 0u) {
      out[2u * (a * MAX_N + k)] = select(0xffffffffu, id, found);
      out[2u * (a * MAX_N + k) + 1u] = bitcast<u32>(logits[base + id] - mx - logSum);
    }
    pk = ck;
    pl = cl;
  }
}
`;
}

/** Bytes of the results of `asks` rows: MAX_TOP_LOGPROBS (id, logprob) pairs each. */
export function topLogprobsBytes(asks: number): number {
  return asks * MAX_TOP_LOGPROBS * 8;
}

/**
 * The top-logprobs kernel of one engine: each submit writes every plan's asks (sampled row, n)
 * into one buffer (PlanRegions, a region per plan); `use(i)` points the op at plan i's. Plans
 * whose rows ask for none dispatch nothing, and only the asking rows' results are copied back.
 */
export class TopLogprobsOp implements KernelOp {
  readonly label = "top logprobs";
  /** [maxSeqs, MAX_TOP_LOGPROBS, 2] u32: id, then the f32 bits of its logprob. */
  readonly out: GPUBuffer;
  readonly #gpu: Gpu;
  readonly #pipeline: GPUComputePipeline;
  readonly #logits: GPUBuffer;
  readonly #threads: number;
  readonly #regions: PlanRegions;
  #group: GPUBindGroup | undefined;
  #count = 0;

  constructor(gpu: Gpu, vocab: number, logits: GPUBuffer, maxSeqs: number) {
    this.#gpu = gpu;
    this.#logits = logits;
    this.#threads = topLogprobsThreads(vocab, gpu.cpuRasterizer ? 8 : 64);
    this.#pipeline = gpu.pipeline(topLogprobsWgsl(vocab, this.#threads), this.label);
    this.#regions = new PlanRegions(gpu, "top logprobs asks");
    this.out = gpu.device.createBuffer({
      size: Math.max(16, topLogprobsBytes(maxSeqs)),
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC,
      label: "top logprobs",
    });
  }

  /** Packs each plan's asks: per plan, its sampled rows' counts in row order (0 or undefined: none). */
  prepare(plans: readonly (readonly (number | undefined)[])[]): void {
    const asks = plans.map((rows) => rows.flatMap((n, row) => (n ? [[row, n] as const] : [])));
    this.#regions.write(asks.map((a) => a.length), 8, (data, p, word) => {
      const u32 = new Uint32Array(data);
      let w = word;
      for (const [row, n] of asks[p]!) {
        u32[w++] = row;
        u32[w++] = n;
      }
    });
  }

  /** Points the next encode at plan `i`; returns how many rows of it ask. */
  use(i: number): number {
    const { count, group } = this.#regions.bind(
      i,
      this.#pipeline,
      [this.#logits, this.out],
      this.label,
    );
    this.#count = count;
    this.#group = group;
    return this.#count;
  }

  encode(pass: GPUComputePassEncoder): void {
    if (this.#count === 0 || this.#group === undefined) return;
    pass.setPipeline(this.#pipeline);
    pass.setBindGroup(0, this.#group);
    pass.dispatchWorkgroups(this.#count);
  }

  cost() {
    return { flops: 0, bytes: 0 };
  }

  destroy(): void {
    this.out.destroy();
    this.#regions.destroy();
  }
}
