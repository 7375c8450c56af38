/**
 * Test helpers for the compat files (`$MODEL_MIRROR/compat/*.gguf`) and llama.cpp's fixtures on
 * them (`*.llama_cpp.json`, format llmserve-compat-fixture/1; see compat/README.md): reading a
 * fixture, and running greedy prompts on an engine while comparing each step with it.
 */
import { assert, assertEquals } from "@std/assert";
import { type Engine, GREEDY, type SeqInput } from "../../lib/engine/engine.ts";
import { modelFile } from "./model_files.ts";
import { runGenerate } from "./generate_command.ts";
import { loadModel } from "../../lib/model/load_model.ts";
import { Tokenizer } from "../../lib/tokenizer/tokenizer.ts";

/** Every GGUF of the compat folder, by stem (X.gguf has X.llama_cpp.json). */
export const COMPAT_FILES = [
  "tinyllama-like-q4_0",
  "tinyllama-like-q4_k_m",
  "tinyllama-like-q5_k_m",
  "llama3-like-q4_k_m",
  "qwen2-like-q4_k_m",
  "qwen3-like-q4_k_m",
  "stories260K-bf16",
  "stories260K-q4_1",
  "stories260K-q5_1",
] as const;

export interface FixtureStep {
  readonly id: number;
  readonly logprob: number;
  /** llama.cpp's two most likely ids with their logprobs. */
  readonly top: readonly [readonly [number, number], readonly [number, number]];
  /** top1 - top2, in nats. */
  readonly margin: number;
}

export interface FixturePrompt {
  readonly name: string;
  readonly prompt: string;
  readonly prompt_ids: readonly number[];
  readonly bos_added: boolean;
  readonly completion_ids: readonly number[];
  /** llama.cpp's own text of completion_ids. */
  readonly completion_text: string;
  readonly steps: readonly FixtureStep[];
}

export interface Fixture {
  readonly format: string;
  readonly model: { readonly file: string; readonly gguf: Record<string, unknown> };
  readonly llama_cpp: { readonly special_tokens: { readonly eog_ids: readonly number[] } };
  readonly prompts: readonly FixturePrompt[];
  readonly chat?: {
    readonly messages: readonly { role: string; content: string }[];
    readonly apply_template_prompt: string;
    readonly template_ids: readonly number[];
  };
}

export function compatPath(stem: string): string {
  return modelFile(`compat/${stem}.gguf`);
}

export async function readFixture(stem: string): Promise<Fixture> {
  const f = JSON.parse(await Deno.readTextFile(modelFile(`compat/${stem}.llama_cpp.json`)));
  if (f.format !== "llmserve-compat-fixture/1") {
    throw new Error(`fixture ${stem}: unknown format ${f.format}`);
  }
  return f as Fixture;
}

/** Smallest llama.cpp top-2 margin at which its greedy token is a fact, not a tie (README). */
export const MARGIN = 0.5;

/** How one prompt compared with llama.cpp. */
export interface PromptComparison {
  readonly name: string;
  /** Steps compared: up to (not including) the first whose margin is <= MARGIN, at most 32. */
  readonly compared: number;
  /** Of those, steps whose greedy token equals llama.cpp's. */
  readonly equal: number;
  /** First compared step where our token differed, if any. */
  readonly firstMismatch?: { step: number; ours: number; theirs: number; margin: number };
  /** Max |our logprob - llama.cpp's| over both of llama.cpp's top-2 ids, at step 0 and every compared step. */
  readonly maxLogprobDelta: number;
  /** The worst of those against its tolerance (logprobTolerance()): above 1 fails. */
  readonly worstToTolerance: number;
  /** The same at step 0 alone (depends on every tensor; compared whatever the margin). */
  readonly step0LogprobDelta: number;
}

/**
 * How far our logprob may be from llama.cpp's for a quantized file: 0.25 nats (its activation
 * quantization, README "Known caveats"), plus 5% of the logprob's size, since that error is on
 * the raw logits and a token 10 nats down the tail carries the error of a logit 10 nats away.
 * Measured: top-1 tokens within 0.05 nats; top-2 tokens at -6..-17 nats up to 0.57.
 */
export function logprobTolerance(llamaCppLogprob: number): number {
  return 0.25 + 0.05 * Math.abs(llamaCppLogprob);
}

/** log-softmax of `logits` at the given ids (double precision). */
export function logprobsAt(logits: Float32Array, ids: readonly number[]): number[] {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - max);
  const lse = max + Math.log(sum);
  return ids.map((id) => logits[id]! - lse);
}

/**
 * Runs every prompt greedily on `engine` together (one prefill step, then one decode step per
 * token for all of them), and compares each step with llama.cpp's: the token where its margin is
 * over MARGIN (stopping a prompt's comparison at the first smaller one), and the logprobs of its
 * top-2 ids. `seqIdBase` keeps sequence ids apart when engines are shared.
 */
export async function compareGreedy(
  engine: Engine,
  prompts: readonly FixturePrompt[],
  opts: { steps?: number; blocksPerSeq?: number } = {},
): Promise<PromptComparison[]> {
  const steps = opts.steps ?? 32;
  const bs = engine.kv.blockSize;
  const longest = Math.max(...prompts.map((p) => p.prompt_ids.length)) + steps;
  const per = opts.blocksPerSeq ?? Math.ceil(longest / bs);
  if (per * prompts.length > engine.kv.numBlocks) {
    throw new Error(
      `compareGreedy: needs ${per * prompts.length} KV blocks, engine has ${engine.kv.numBlocks}`,
    );
  }
  const tables = prompts.map((_, i) => Array.from({ length: per }, (_, b) => i * per + b));
  const state = prompts.map((p) => ({
    pos: 0,
    next: [...p.prompt_ids],
    cut: p.steps.findIndex((s) => s.margin <= MARGIN),
    equal: 0,
    compared: 0,
    maxDelta: 0,
    worst: 0,
    step0: 0,
    firstMismatch: undefined as PromptComparison["firstMismatch"],
  }));
  for (let step = 0; step < steps; step++) {
    const seqs: SeqInput[] = prompts.map((_, i) => ({
      seqId: i,
      tokens: state[i]!.next,
      startPos: state[i]!.pos,
      blockTable: tables[i]!,
      sample: true,
      sampling: GREEDY,
    }));
    const r = await engine.step({ stepId: step, seqs, returnLogits: true });
    r.sampled.forEach((s, i) => {
      const st = state[i]!;
      const fx = prompts[i]!.steps[step]!;
      const live = st.cut < 0 || step < st.cut;
      if (live || step === 0) {
        const [a, b] = logprobsAt(s.logits!, [fx.top[0][0], fx.top[1][0]]);
        const da = Math.abs(a! - fx.top[0][1]);
        const db = Math.abs(b! - fx.top[1][1]);
        const d = Math.max(da, db);
        st.maxDelta = Math.max(st.maxDelta, d);
        st.worst = Math.max(
          st.worst,
          da / logprobTolerance(fx.top[0][1]),
          db / logprobTolerance(fx.top[1][1]),
        );
        if (step === 0) st.step0 = d;
      }
      if (live) {
        st.compared++;
        if (s.token === fx.id) st.equal++;
        else st.firstMismatch ??= { step, ours: s.token, theirs: fx.id, margin: fx.margin };
      }
      st.pos += st.next.length;
      st.next = [s.token];
    });
  }
  for (let i = 0; i < prompts.length; i++) engine.release?.(i);
  return prompts.map((p, i) => ({
    name: p.name,
    compared: state[i]!.compared,
    equal: state[i]!.equal,
    ...(state[i]!.firstMismatch ? { firstMismatch: state[i]!.firstMismatch } : {}),
    maxLogprobDelta: state[i]!.maxDelta,
    worstToTolerance: state[i]!.worst,
    step0LogprobDelta: state[i]!.step0,
  }));
}

/**
 * A greedy `/v1/completions` of `n` tokens at `base` answers 200 with non-empty text that is a
 * prefix of llama.cpp's continuation `text` (a shorter answer is a stop; any other is wrong).
 */
export async function assertGreedyCompletion(
  base: string,
  stem: string,
  prompt: string,
  n: number,
  text: string,
): Promise<void> {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: n, temperature: 0 }),
  });
  const body = await res.json();
  assertEquals(res.status, 200, JSON.stringify(body));
  assertEquals(body.choices[0].text, text, `${stem}: ${JSON.stringify(body)}`);
}

/**
 * The fixture prompt with the longest run of clear (margin > MARGIN) steps, llama.cpp's text for
 * it, and how many tokens to generate (at most 3, all clear).
 */
export async function clearPrompt(
  fx: Fixture,
  stem: string,
): Promise<{ prompt: string; text: string; n: number }> {
  const scored = fx.prompts.map((p) => {
    const cut = p.steps.findIndex((s) => s.margin <= MARGIN);
    return { p, clear: cut < 0 ? p.steps.length : cut };
  }).sort((a, b) => b.clear - a.clear);
  const best = scored[0]!;
  assert(best.clear >= 1, `fixture ${fx.model.file}: no prompt has a clear first step`);
  const n = Math.min(3, best.clear);
  // The text of llama.cpp's first n ids, which must begin llama.cpp's own completion text.
  const p = best.p;
  const model = await loadModel(compatPath(stem));
  const text = new Tokenizer(model.tokenizer!).decode(p.completion_ids.slice(0, n));
  assert(text.length > 0, `${stem}: llama.cpp's first ${n} ids decode to nothing`);
  assert(
    p.completion_text.startsWith(text),
    `${stem}: llama.cpp's ids decode to '${text}', not a prefix of its text '${p.completion_text}'`,
  );
  return { prompt: best.p.prompt, text, n };
}

/** The `generate` command, greedy, for `maxTokens` tokens of a compat file on `backend`. */
export function generateGreedy(
  stem: string,
  prompt: string,
  maxTokens: number,
  backend: string,
): ReturnType<typeof runGenerate> {
  return runGenerate([
    "--model",
    compatPath(stem),
    "--prompt",
    prompt,
    "--max-tokens",
    String(maxTokens),
    "--temperature",
    "0",
    "--backend",
    backend,
  ]);
}

/**
 * The `generate` command's greedy text (cpu backend) for a compat file alone: the oracle for
 * what a server or router serving it beside other models answers.
 */
export async function generateAlone(
  stem: string,
  prompt: string,
  maxTokens: number,
): Promise<string> {
  const out = await generateGreedy(stem, prompt, maxTokens, "cpu");
  assertEquals(out.code, 0, out.stderr);
  return out.stdout.replace(/\n$/, "");
}
