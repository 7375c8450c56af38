/**
 * `deno task bench:tokenizer`: how long a real vocabulary takes to load and to encode a long
 * prompt, with baselines measured in the same run:
 *
 * Wall-clock and CPU-time medians (CPU time inflates less on a shared machine).
 *
 * - load: the GGUF header read and the Tokenizer built, for Llama 3's 128k tokens + 280k merges
 *   and Qwen2.5's 152k + 151k, against TinyLlama's 32k SentencePiece vocabulary;
 * - encode 8,000 characters (mixed prose, code, numbers and non-Latin text): byte-level BPE with
 *   a fresh word cache and with a warm one, against a naive BPE (a full rescan of the word's
 *   pairs per merge, no cache; the textbook algorithm, checked to give the same ids) and
 *   against the SentencePiece tokenizer on the same text.
 *
 *   MODEL_MIRROR=../shared/models deno task bench:tokenizer [--runs 7]
 */
import process from "node:process";
import { parseArgs } from "@std/cli/parse-args";
import { readGgufTokenizer } from "../lib/model/gguf_tokenizer.ts";
import { bytesToChars } from "../lib/tokenizer/byte_unicode.ts";
import { preTokenizer } from "../lib/tokenizer/pre_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { TokenizerData } from "../lib/tokenizer/tokenizer_data.ts";
import type { ByteStrings } from "../lib/util/byte_strings.ts";
import { markdownTable } from "./markdown_table.ts";

export interface TokenizerBenchRow {
  readonly what: string;
  /** Wall-clock median. */
  readonly ms: number;
  /** CPU time (user + system) median: on a shared, loaded machine wall time inflates, this less so. */
  readonly cpuMs: number;
  readonly baselineMs: number;
  readonly baseline: string;
  readonly note: string;
}

/** The prompt: a deterministic mix whose words repeat as in real text, cut to `chars` characters. */
export function benchText(chars: number): string {
  const parts = [
    "Once upon a time, in a land far away, a little llama named Lily found 3 shiny stones. ",
    "She didn't know what they were, so she asked her friend Tom: \"What's this?\" ",
    "function add(a, b) {\n  return a + b; // 1234567 + 89\n}\n\n",
    "日本語のテキストも少し入れます。 🦙 naïve café — “quotes” ",
    "    indented line\twith tabs and  double  spaces\n",
    "x = [1, 22, 333, 4444] # numbers; y = {'key': \"value\"}\n",
  ];
  let s = "";
  for (let i = 0; s.length < chars; i++) s += parts[(i * 7 + (i >> 2)) % parts.length];
  return s.slice(0, chars);
}

/** Byte-level BPE the textbook way: no heap, no cache, one full scan of the pairs per merge. */
function naiveBpe(data: TokenizerData): (text: string) => number[] {
  const pre = preTokenizer(data.pre);
  const merges = data.merges!;
  const ranks = new Map<string, number>();
  for (let i = 0; i < merges.length; i++) {
    const m = Array.isArray(merges) ? merges[i]! : (merges as ByteStrings).get(i);
    if (!ranks.has(m)) ranks.set(m, i);
  }
  const ids = new Map<string, number>();
  data.tokens.forEach((t, i) => ids.set(t, i));
  return (text) => {
    const out: number[] = [];
    for (const word of pre.split(text)) {
      const chars = bytesToChars(word);
      if (pre.ignoreMerges && ids.has(chars)) {
        out.push(ids.get(chars)!);
        continue;
      }
      const syms = [...chars];
      for (;;) {
        let best = -1;
        let bestRank = Infinity;
        for (let i = 0; i + 1 < syms.length; i++) {
          const r = ranks.get(syms[i] + " " + syms[i + 1]);
          if (r !== undefined && r < bestRank) [best, bestRank] = [i, r];
        }
        if (best < 0) break;
        syms.splice(best, 2, syms[best]! + syms[best + 1]!);
      }
      for (const s of syms) {
        const id = ids.get(s);
        if (id !== undefined) out.push(id);
        else for (const ch of s) out.push(ids.get(ch)!);
      }
    }
    return out;
  };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

interface Timing {
  wall: number;
  cpu: number;
}

function time(f: () => void): Timing {
  const c = process.cpuUsage();
  const t = performance.now();
  f();
  const wall = performance.now() - t;
  const d = process.cpuUsage(c);
  return { wall, cpu: (d.user + d.system) / 1000 };
}

async function timeAsync(f: () => Promise<void>): Promise<Timing> {
  const c = process.cpuUsage();
  const t = performance.now();
  await f();
  const wall = performance.now() - t;
  const d = process.cpuUsage(c);
  return { wall, cpu: (d.user + d.system) / 1000 };
}

const wallMedian = (ts: Timing[]) => median(ts.map((t) => t.wall));
const cpuMedian = (ts: Timing[]) => median(ts.map((t) => t.cpu));

export async function runTokenizerBench(
  mirror: string,
  opts: { runs?: number; chars?: number } = {},
): Promise<TokenizerBenchRow[]> {
  const runs = opts.runs ?? 7;
  const chars = opts.chars ?? 8000;
  const file = (name: string) => `${mirror}/compat/${name}`;
  const files = {
    llama3: file("llama3-like-q4_k_m.gguf"),
    qwen2: file("qwen2-like-q4_k_m.gguf"),
    spm: file("tinyllama-like-q4_0.gguf"),
  };
  const load = async (path: string) => {
    const ts: Timing[] = [];
    for (let r = 0; r < runs; r++) {
      ts.push(await timeAsync(async () => void new Tokenizer((await readGgufTokenizer(path))!)));
    }
    return ts;
  };
  const spmLoad = await load(files.spm);
  const rows: TokenizerBenchRow[] = [];
  const row = (what: string, ts: Timing[], base: Timing[], baseline: string, note = "") =>
    rows.push({
      what,
      ms: wallMedian(ts),
      cpuMs: cpuMedian(ts),
      baselineMs: wallMedian(base),
      baseline,
      note,
    });
  for (
    const [what, path] of [
      ["load Llama 3 vocab (128k tokens, 280k merges)", files.llama3],
      ["load Qwen2.5 vocab (152k tokens, 151k merges)", files.qwen2],
    ] as const
  ) {
    const ts = await load(path);
    row(what, ts, spmLoad, "TinyLlama SPM (32k)", `first ${ts[0]!.wall.toFixed(0)} ms`);
  }

  const text = benchText(chars);
  const spm = new Tokenizer((await readGgufTokenizer(files.spm))!);
  for (const [name, path] of [["Llama 3", files.llama3], ["Qwen2.5", files.qwen2]] as const) {
    const data = (await readGgufTokenizer(path))!;
    const naive = naiveBpe(data);
    const fresh: Timing[] = [];
    const warm: Timing[] = [];
    let ids: number[] = [];
    for (let r = 0; r < runs; r++) {
      const tok = new Tokenizer(data);
      fresh.push(time(() => (ids = tok.encode(text))));
      warm.push(time(() => void tok.encode(text)));
    }
    const naiveTs: Timing[] = [];
    let naiveIds: number[] = [];
    for (let r = 0; r < Math.min(runs, 3); r++) naiveTs.push(time(() => (naiveIds = naive(text))));
    const expected = new Tokenizer(data).addBos ? [data.bosId, ...naiveIds] : naiveIds;
    if (JSON.stringify(ids) !== JSON.stringify(expected)) {
      throw new Error(`${name}: the tokenizer and the naive BPE disagree on the bench text`);
    }
    const spmTs: Timing[] = [];
    for (let r = 0; r < runs; r++) spmTs.push(time(() => void spm.encode(text)));
    const note = `${ids.length} tokens`;
    row(`encode ${chars} chars, ${name}, fresh word cache`, fresh, naiveTs, "naive BPE", note);
    row(`encode ${chars} chars, ${name}, warm word cache`, warm, naiveTs, "naive BPE", note);
    row(`encode ${chars} chars, ${name}, fresh word cache`, fresh, spmTs, "SentencePiece", note);
  }
  return rows;
}

export function tokenizerTable(rows: readonly TokenizerBenchRow[]): string {
  return markdownTable(
    ["what", "ms", "cpu ms", "baseline", "baseline ms", "ratio", "note"],
    rows.map((r) => [
      r.what,
      r.ms.toFixed(1),
      r.cpuMs.toFixed(1),
      r.baseline,
      r.baselineMs.toFixed(1),
      `${(r.ms / r.baselineMs).toFixed(2)}x`,
      r.note,
    ]),
  );
}

if (import.meta.main) {
  const args = parseArgs(Deno.args, { string: ["runs"], boolean: ["help"] });
  if (args.help) {
    console.log("MODEL_MIRROR=../shared/models deno task bench:tokenizer [--runs 7]");
    Deno.exit(0);
  }
  const mirror = Deno.env.get("MODEL_MIRROR");
  if (!mirror) {
    throw new Error("MODEL_MIRROR is unset: point it at the models directory (../shared/models)");
  }
  const runs = args.runs === undefined ? 7 : Number(args.runs);
  if (!Number.isInteger(runs) || runs < 1) {
    throw new Error(`--runs must be a positive integer, received ${args.runs}`);
  }
  console.log(
    `## Tokenizer: vocabulary load and an 8,000-character prompt (${runs} runs, median)\n`,
  );
  console.log(tokenizerTable(await runTokenizerBench(mirror, { runs })));
}
