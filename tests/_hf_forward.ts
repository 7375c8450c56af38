/**
 * An independent float64 forward pass for tests, written from the Hugging Face model code
 * (Llama, Qwen2, Qwen3) rather than from lib/: it reads a GGUF's tensors in the file's own
 * layout, applies RoPE the way the architecture's file lays out Q/K ("norm": adjacent pairs;
 * "neox": halves), adds biases and q/k norms where the tensors exist, and returns the logits of
 * every position of one sequence. Slow and obvious: an oracle for tiny models only.
 */
import { dequantize } from "../lib/model/dequantize.ts";
import type { GgufFile } from "../lib/model/gguf.ts";

export interface HfShape {
  readonly dim: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly ropeDim: number;
  readonly ff: number;
  readonly layers: number;
  readonly vocab: number;
  readonly theta: number;
  readonly eps: number;
  readonly neox: boolean;
}

export function hfForward(g: GgufFile, s: HfShape, tokens: readonly number[]): Float64Array[] {
  const w = (name: string) => {
    const t = g.tensors.get(name);
    return t ? Float64Array.from(dequantize(t)) : undefined;
  };
  const req = (name: string) => {
    const t = w(name);
    if (!t) throw new Error(`oracle: tensor ${name} missing`);
    return t;
  };
  const mv = (m: Float64Array, x: Float64Array, rows: number) => {
    const cols = x.length;
    const out = new Float64Array(rows);
    for (let r = 0; r < rows; r++) {
      let acc = 0;
      for (let c = 0; c < cols; c++) acc += m[r * cols + c]! * x[c]!;
      out[r] = acc;
    }
    return out;
  };
  const norm = (x: Float64Array, wt: Float64Array) => {
    let ss = 0;
    for (const v of x) ss += v * v;
    const k = 1 / Math.sqrt(ss / x.length + s.eps);
    return x.map((v, i) => v * k * wt[i]!);
  };
  const factors = w("rope_freqs.weight");
  const freq = (i: number) => Math.pow(s.theta, -(2 * i) / s.ropeDim) / (factors ? factors[i]! : 1);
  const rot = (x: Float64Array, nh: number, pos: number) => {
    const half = s.ropeDim / 2;
    for (let h = 0; h < nh; h++) {
      for (let i = 0; i < half; i++) {
        const a = h * s.headDim + (s.neox ? i : 2 * i);
        const b = h * s.headDim + (s.neox ? i + half : 2 * i + 1);
        const c = Math.cos(pos * freq(i));
        const sn = Math.sin(pos * freq(i));
        const x0 = x[a]!;
        const x1 = x[b]!;
        x[a] = x0 * c - x1 * sn;
        x[b] = x0 * sn + x1 * c;
      }
    }
  };
  const headNorm = (x: Float64Array, nh: number, wt: Float64Array | undefined) => {
    if (!wt) return;
    for (let h = 0; h < nh; h++) {
      const part = norm(x.slice(h * s.headDim, (h + 1) * s.headDim), wt);
      x.set(part, h * s.headDim);
    }
  };
  const addB = (x: Float64Array, b: Float64Array | undefined) => {
    if (b) { for (let i = 0; i < x.length; i++) x[i] = x[i]! + b[i]!; }
  };
  const emb = req("token_embd.weight");
  const out = w("output.weight") ?? emb;
  const qd = s.heads * s.headDim;
  const kd = s.kvHeads * s.headDim;
  const keys: Float64Array[][] = Array.from({ length: s.layers }, () => []);
  const values: Float64Array[][] = Array.from({ length: s.layers }, () => []);
  const logits: Float64Array[] = [];
  tokens.forEach((tok, pos) => {
    let x = emb.slice(tok * s.dim, (tok + 1) * s.dim);
    for (let l = 0; l < s.layers; l++) {
      const p = `blk.${l}.`;
      const h = norm(x, req(p + "attn_norm.weight"));
      const q = mv(req(p + "attn_q.weight"), h, qd);
      const k = mv(req(p + "attn_k.weight"), h, kd);
      const v = mv(req(p + "attn_v.weight"), h, kd);
      addB(q, w(p + "attn_q.bias"));
      addB(k, w(p + "attn_k.bias"));
      addB(v, w(p + "attn_v.bias"));
      headNorm(q, s.heads, w(p + "attn_q_norm.weight"));
      headNorm(k, s.kvHeads, w(p + "attn_k_norm.weight"));
      rot(q, s.heads, pos);
      rot(k, s.kvHeads, pos);
      keys[l]!.push(k);
      values[l]!.push(v);
      const att = new Float64Array(qd);
      for (let hh = 0; hh < s.heads; hh++) {
        const kv = Math.floor(hh / (s.heads / s.kvHeads));
        const sc = keys[l]!.map((kk) => {
          let d = 0;
          for (let i = 0; i < s.headDim; i++) {
            d += q[hh * s.headDim + i]! * kk[kv * s.headDim + i]!;
          }
          return d / Math.sqrt(s.headDim);
        });
        const mx = Math.max(...sc);
        const e = sc.map((z) => Math.exp(z - mx));
        const sum = e.reduce((a, b) => a + b, 0);
        for (let t = 0; t < e.length; t++) {
          for (let i = 0; i < s.headDim; i++) {
            att[hh * s.headDim + i] = att[hh * s.headDim + i]! +
              (e[t]! / sum) * values[l]![t]![kv * s.headDim + i]!;
          }
        }
      }
      const o = mv(req(p + "attn_output.weight"), att, s.dim);
      x = x.map((xv, i) => xv + o[i]!);
      const h2 = norm(x, req(p + "ffn_norm.weight"));
      const gt = mv(req(p + "ffn_gate.weight"), h2, s.ff);
      const up = mv(req(p + "ffn_up.weight"), h2, s.ff);
      const act = gt.map((gv, i) => (gv / (1 + Math.exp(-gv))) * up[i]!);
      const down = mv(req(p + "ffn_down.weight"), act, s.dim);
      x = x.map((xv, i) => xv + down[i]!);
    }
    logits.push(mv(out, norm(x, req("output_norm.weight")), s.vocab));
  });
  return logits;
}
