import { bindAll, type Gpu, type KernelOp } from "./device.ts";
import { DIM_SAMPLES, WGSL_STEP_TYPES } from "./step_meta.ts";
import { MIN_TEMPERATURE } from "../../lib/engine/sampling.ts";

/** Threads per sampled sequence: 64 on GPUs; one SIMD batch (8) on CPU rasterizers. */
const GPU_THREADS = 64;
const CPU_THREADS = 8;
const MAX_THREADS = 128; // bins: 16 floats per thread in workgroup memory (16 KiB by default)

/**
 * Loop iterations one invocation may run, all loops together: llvmpipe (Mesa's CPU rasterizer)
 * leaves every loop once an invocation has run 65535 iterations, silently (a WGSL loop of 70000
 * counts 65535; two of 40000 count 40000 and 25534). Kept under it with a margin.
 */
const LOOP_BUDGET = 64000;

/** Radix passes of one search: 8 for the key's 32 bits, one per 4 bits of a token index. */
function searchPasses(vocab: number): number {
  return 8 + Math.ceil(Math.max(1, Math.ceil(Math.log2(vocab))) / 4);
}

/**
 * The fewest threads (a power of two, at least `base`) whose invocations stay within
 * LOOP_BUDGET on a vocabulary of this size: each runs 5 + 3 * passes strided loops over the
 * vocabulary (argmax, log-sum-exp, scaled argmax, top-p mass, kept mass, and three searches),
 * plus per-pass digit loops and reductions over the threads. Without it, a 8-thread sampler
 * over a 32000-token vocabulary, or a 64-thread one over 151936 tokens, stops its loops early
 * on llvmpipe and returns wrong ids (even the vocabulary size itself).
 */
export function samplerThreads(vocab: number, base: number): number {
  const passes = searchPasses(vocab);
  const iterations = (t: number) =>
    Math.ceil(vocab / t) * (5 + 3 * passes) + 3 * passes * (64 + t) + 8 * t;
  let threads = base;
  while (iterations(threads) > LOOP_BUDGET && threads < MAX_THREADS) threads *= 2;
  if (iterations(threads) > LOOP_BUDGET) {
    throw new Error(
      `Cannot build the sampler: a vocabulary of ${vocab} tokens needs more than ${MAX_THREADS} threads per sequence to stay within ${LOOP_BUDGET} loop iterations per invocation`,
    );
  }
  return threads;
}

/** lib/rng.ts's hash32 and uniform in WGSL: u32 arithmetic wraps exactly like Math.imul. */
export const WGSL_RNG = /* wgsl */ `
fn hash32(seed: u32, counter: u32) -> u32 {
  var h = seed ^ (counter * 0x9e3779b9u);
  h = (h ^ (h >> 16u)) * 0x85ebca6bu;
  h = (h ^ (h >> 13u)) * 0xc2b2ae35u;
  h = h ^ (h >> 16u);
  h = (h ^ (h >> 15u)) * 0x2c1b3c6du;
  h = (h ^ (h >> 12u)) * 0x297a2d39u;
  return h ^ (h >> 15u);
}
fn uniform01(seed: u32, counter: u32) -> f32 {
  return f32(hash32(seed, counter) >> 8u) / 16777216.0;
}
`;

/**
 * WGSL for sampling, one workgroup per sampled sequence, with lib/sampling.ts's semantics.
 *
 * The sampler never sorts the vocabulary. Every token gets a unique 64-bit rank key: the
 * order-preserving bits of its scaled logit, then (vocab-1-index) so ties go to the lower
 * index; the sorted order is descending key. Top-k, top-p and min-p each keep a prefix of that
 * order, and the draw picks the token where the running sum crosses u*total, so each is "the
 * largest key whose prefix count/mass reaches a target": found by a radix search over the key,
 * 4 bits a pass, summing counts or masses per digit (in a fixed order, for batch invariance).
 */
export function sampleWgsl(vocab: number, threads = GPU_THREADS, maskRows = 0): string {
  if (!(threads >= 1 && Number.isInteger(threads))) {
    throw new Error(
      `Cannot build the sampler: threads must be a positive integer, received ${threads}`,
    );
  }
  const passes = searchPasses(vocab);
  const loDigits = passes - 8;
  // Token masks (constrained decoding, lib/engine/token_mask.ts): masks[i] != 0 says sample i
  // is masked, and its row of ceil(V / 32) words starts at maskRows + i * W. A masked token
  // draws as if its logit were -Infinity (-FLT_MAX here, whose weight is exp(...) = 0 just the
  // same); the logprob stays the raw logits'.
  const masked = maskRows > 0;
  const words = Math.ceil(vocab / 32);
  const maskDecls = masked
    ? `@group(0) @binding(5) var<storage, read> masks: array<u32>;
const W = ${words}u;
const MASK_ROWS = ${maskRows}u;
var<private> maskBase: u32;
var<private> isMasked: bool;
fn allowed(j: u32) -> bool {
  return !isMasked || ((masks[maskBase + (j >> 5u)] >> (j & 31u)) & 1u) == 1u;
}`
    : `fn allowed(j: u32) -> bool { return true; }
const isMasked = false;`;
  return /* wgsl */ `
${WGSL_STEP_TYPES}
@group(0) @binding(0) var<uniform> dims: vec4<u32>;
@group(0) @binding(1) var<storage, read> samples: array<Sample>;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
@group(0) @binding(4) var<storage, read_write> lastSampled: array<u32>;
${maskDecls}
${WGSL_RNG}
const V = ${vocab}u;
const T = ${threads}u;
const PASSES = ${passes}u;
const LO_DIGITS = ${loDigits}u;
var<workgroup> redF: array<f32, T>;
var<workgroup> redK: array<u32, T>;
var<workgroup> redL: array<u32, T>;
var<workgroup> bins: array<f32, ${threads * 16}>;
var<workgroup> totals: array<f32, 16>;

// A token's scaled logit as the sampler sees it: a masked token's is the lowest float.
fn scaled(base: u32, j: u32, temp: f32) -> f32 {
  return select(-3.4028234e38, logits[base + j] / temp, allowed(j));
}

// Order-preserving bits of an f32: larger float, larger u32.
fn orderKey(z: f32) -> u32 {
  let b = bitcast<u32>(z);
  return select(b | 0x80000000u, ~b, (b >> 31u) == 1u);
}
fn atOrAfter(k: u32, l: u32, ck: u32, cl: u32) -> bool {
  return k > ck || (k == ck && l >= cl);
}
fn sumAll(v: f32, t: u32) -> f32 {
  redF[t] = v;
  workgroupBarrier();
  var s = 0.0;
  for (var i = 0u; i < T; i++) { s += redF[i]; }
  workgroupBarrier();
  return s;
}
// The largest rank key (k, l) over the threads' candidates.
fn maxKey(k: u32, l: u32, t: u32) -> vec2<u32> {
  redK[t] = k;
  redL[t] = l;
  workgroupBarrier();
  var best = vec2<u32>(redK[0], redL[0]);
  for (var i = 1u; i < T; i++) {
    if (atOrAfter(redK[i], redL[i], best.x, best.y) && !(redK[i] == best.x && redL[i] == best.y)) {
      best = vec2<u32>(redK[i], redL[i]);
    }
  }
  workgroupBarrier();
  return best;
}

struct Search { key: u32, lo: u32, found: bool }

// Largest rank key x such that the weight of tokens with key >= x reaches target (>= when
// !strict, > when strict). Weights: 1 per token (count) or exp(z - zmax) masked to the tokens
// at or after (ck, cl) with weight >= minE.
fn search(base: u32, temp: f32, zmax: f32, count: bool, ck: u32, cl: u32, minE: f32,
          goal: f32, strict: bool, t: u32) -> Search {
  var pk = 0u;
  var pl = 0u;
  var mk = 0u;
  var ml = 0u;
  var below = 0.0; // weight of tokens whose key is above the current prefix
  var found = true;
  for (var ps = 0u; ps < PASSES; ps++) {
    // Zeroed explicitly: a declaration inside a loop is not re-zeroed by every compiler.
    var local: array<f32, 16>;
    for (var d = 0u; d < 16u; d++) { local[d] = 0.0; }
    for (var j = t; j < V; j += T) {
      let z = scaled(base, j, temp);
      let k = orderKey(z);
      let l = V - 1u - j;
      if ((k & mk) == pk && (l & ml) == pl) {
        var w = 1.0;
        if (!count) {
          let e = exp(z - zmax);
          w = select(0.0, e, atOrAfter(k, l, ck, cl) && e >= minE);
        }
        var digit: u32;
        if (ps < 8u) { digit = (k >> (28u - 4u * ps)) & 15u; }
        else { digit = (l >> (4u * (LO_DIGITS - 1u - (ps - 8u)))) & 15u; }
        local[digit] += w;
      }
    }
    for (var d = 0u; d < 16u; d++) { bins[t * 16u + d] = local[d]; }
    workgroupBarrier();
    // With fewer than 16 threads, a thread totals several digits.
    for (var d = t; d < 16u; d += T) {
      var s = 0.0;
      for (var i = 0u; i < T; i++) { s += bins[i * 16u + d]; }
      totals[d] = s;
    }
    workgroupBarrier();
    // Walk digits from the top; the first whose cumulative weight reaches the target wins.
    var chosen = 0u;
    var hit = false;
    var run = below;
    var before = below;
    for (var d = 16u; d > 0u; d--) {
      let prev = run;
      run += totals[d - 1u];
      // A goal of 0 (top-p 0) means "the first token with any weight", not "no token at all".
      let ok = select(run >= goal, run > goal, strict || goal <= 0.0);
      if (ok && !hit) { hit = true; chosen = d - 1u; before = prev; }
    }
    if (ps == 0u && !hit) { found = false; }
    // Past the first pass a miss is rounding: the digit-0 prefix is the one that reached it.
    if (!hit) { chosen = 0u; before = run - totals[0]; }
    below = before;
    if (ps < 8u) {
      let sh = 28u - 4u * ps;
      pk |= chosen << sh;
      mk |= 15u << sh;
    } else {
      let sh = 4u * (LO_DIGITS - 1u - (ps - 8u));
      pl |= chosen << sh;
      ml |= 15u << sh;
    }
  }
  return Search(pk, pl, found);
}

@compute @workgroup_size(${threads})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let i = wg.x;
  if (i >= dims[${DIM_SAMPLES}]) { return; }
  let sm = samples[i];
  let base = i * V;
${masked ? "  isMasked = masks[i] != 0u;\n  maskBase = MASK_ROWS + i * W;" : ""}

  // Raw logits: the argmax (rank key order) and log-sum-exp for the logprob.
  var bk = 0u;
  var bl = 0u;
  for (var j = t; j < V; j += T) {
    let k = orderKey(logits[base + j]);
    let l = V - 1u - j;
    if (j == t || atOrAfter(k, l, bk, bl)) { bk = k; bl = l; }
  }
  let top = maxKey(bk, bl, t);
  let argmax = V - 1u - top.y;
  let rawMax = logits[base + argmax];
  var se = 0.0;
  for (var j = t; j < V; j += T) { se += exp(logits[base + j] - rawMax); }
  let logSum = log(sumAll(se, t));

  var chosen = argmax;
  if (isMasked) {
    // Greedy under a mask: the largest allowed logit (the lowest id on ties).
    var gk = 0u;
    var gl = 0u;
    for (var j = t; j < V; j += T) {
      let k = orderKey(logits[base + j]);
      let l = V - 1u - j;
      if (allowed(j) && atOrAfter(k, l, gk, gl)) { gk = k; gl = l; }
    }
    let g = maxKey(gk, gl, t);
    chosen = V - 1u - g.y;
  }
  // Below MIN_TEMPERATURE logits / T overflows f32: greedy, as on the CPU.
  if (sm.temperature >= ${MIN_TEMPERATURE.toExponential()}) {
    // Divided, not multiplied by 1/T: the same f32 rounding as the CPU reference.
    let temp = sm.temperature;
    var zk = 0u;
    var zl = 0u;
    for (var j = t; j < V; j += T) {
      let k = orderKey(scaled(base, j, temp));
      let l = V - 1u - j;
      if (j == t || atOrAfter(k, l, zk, zl)) { zk = k; zl = l; }
    }
    let zTop = maxKey(zk, zl, t);
    let zmax = scaled(base, V - 1u - zTop.y, temp);
    var ck = 0u;
    var cl = 0u;
    if (sm.topK > 0u && sm.topK < V) {
      let c = search(base, temp, zmax, true, 0u, 0u, 0.0, f32(sm.topK), false, t);
      ck = c.key;
      cl = c.lo;
    }
    if (sm.topP < 1.0) {
      var kept = 0.0;
      for (var j = t; j < V; j += T) {
        let z = scaled(base, j, temp);
        kept += select(0.0, exp(z - zmax), atOrAfter(orderKey(z), V - 1u - j, ck, cl) && allowed(j));
      }
      let mass = sumAll(kept, t);
      let c = search(base, temp, zmax, false, ck, cl, 0.0, sm.topP * mass, false, t);
      if (c.found) { ck = c.key; cl = c.lo; }
    }
    // p >= minP * pmax, where pmax's weight is exp(zmax - zmax) = 1.
    let minE = select(0.0, sm.minP, sm.minP > 0.0);
    var kept = 0.0;
    var lastK = 0xffffffffu;
    var lastL = 0xffffffffu;
    for (var j = t; j < V; j += T) {
      let z = scaled(base, j, temp);
      let k = orderKey(z);
      let l = V - 1u - j;
      let e = exp(z - zmax);
      if (atOrAfter(k, l, ck, cl) && e >= minE && allowed(j)) {
        kept += e;
        if (!atOrAfter(k, l, lastK, lastL)) { lastK = k; lastL = l; }
      }
    }
    let total = sumAll(kept, t);
    // The last kept token (smallest key), for when rounding leaves the walk short.
    redK[t] = lastK;
    redL[t] = lastL;
    workgroupBarrier();
    var last = vec2<u32>(redK[0], redL[0]);
    for (var n = 1u; n < T; n++) {
      if (!atOrAfter(redK[n], redL[n], last.x, last.y)) { last = vec2<u32>(redK[n], redL[n]); }
    }
    workgroupBarrier();
    let goal = uniform01(sm.seed, sm.position) * total;
    let c = search(base, temp, zmax, false, ck, cl, minE, goal, true, t);
    chosen = select(V - 1u - last.y, V - 1u - c.lo, c.found);
  }
  if (t == 0u) {
    out[2u * i] = chosen;
    out[2u * i + 1u] = bitcast<u32>(logits[base + chosen] - rawMax - logSum);
    lastSampled[sm.lastSlot] = chosen;
  }
}
`;
}

/** How the sampler spreads one sequence's vocabulary over threads. */
export type SampleLayout = "wide" | "narrow";

export interface SampleTarget {
  readonly dims: GPUBufferBinding | GPUBuffer;
  readonly samples: GPUBufferBinding | GPUBuffer;
  /** [samples, vocab] f32. */
  readonly logits: GPUBuffer;
  /** [samples, 2] u32: token id, then the f32 bits of its logprob. */
  readonly out: GPUBuffer;
  readonly lastSampled: GPUBuffer;
  /** Token masks (kernels/token_masks.ts) for up to `rows` samples; absent: never masked. */
  readonly masks?: { readonly buffer: GPUBuffer; readonly rows: number };
  /**
   * "wide" (64 threads per sequence; suits GPUs) or "narrow" (one SIMD batch of 8, so the
   * reductions through workgroup memory stay short; suits CPU rasterizers). Default by device.
   * Either takes more threads where a large vocabulary needs them ({@link samplerThreads}).
   */
  readonly layout?: SampleLayout;
}

/** A bound sampler over `count` sequences. */
export function createSampler(gpu: Gpu, vocab: number, t: SampleTarget): KernelOp {
  const narrow = (t.layout ?? (gpu.cpuRasterizer ? "narrow" : "wide")) === "narrow";
  const threads = samplerThreads(vocab, narrow ? CPU_THREADS : GPU_THREADS);
  const pipeline = gpu.pipeline(sampleWgsl(vocab, threads, t.masks?.rows ?? 0), "sample");
  const group = bindAll(
    gpu,
    pipeline,
    [t.dims, t.samples, t.logits, t.out, t.lastSampled, ...(t.masks ? [t.masks.buffer] : [])],
    "sample",
  );
  return {
    label: "sample",
    // One read of each row of logits: the least any sampler does (greedy reads twice, filters more).
    cost: (c) => ({ flops: 2 * c.samples.length * vocab, bytes: c.samples.length * vocab * 4 }),
    encode(pass: GPUComputePassEncoder, count: number): void {
      if (count === 0) return;
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(count);
    },
  };
}
