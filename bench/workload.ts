/**
 * What the benchmarks send: seeded prompt and output lengths, prompts made of story words (the
 * test model writes children's stories), JSONL request files and Poisson arrival times.
 */
import { seededRandom } from "../lib/util/seeded_random.ts";

/** A seeded uniform generator on [0, 1): the same seed gives the same workload. */
export { seededRandom };

/** A length distribution: "128" is fixed, "16-64" uniform over the integers 16..64. */
export interface LengthDist {
  readonly min: number;
  readonly max: number;
}

/** Parses "N" or "A-B" (positive integers, A <= B); the error names the flag. */
export function parseLengthDist(spec: string, flag: string): LengthDist {
  const m = /^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$/.exec(spec);
  const min = m ? Number(m[1]) : NaN;
  const max = m ? Number(m[2] ?? m[1]) : NaN;
  if (!m || min < 1 || max < min) {
    throw new Error(
      `Invalid --${flag}: expected a length "N" or a range "A-B" with 1 <= A <= B, received ${
        JSON.stringify(spec)
      }`,
    );
  }
  return { min, max };
}

/** One draw from `d`. */
export function drawLength(d: LengthDist, rand: () => number): number {
  return d.min + Math.floor(rand() * (d.max - d.min + 1));
}

/** Exponential gaps of a Poisson process at `ratePerSecond`: arrival offsets in ms from 0. */
export function poissonArrivals(
  count: number,
  ratePerSecond: number,
  rand: () => number,
): number[] {
  if (!(ratePerSecond > 0)) {
    throw new Error(
      `Cannot draw Poisson arrivals: the rate must be positive, received ${ratePerSecond}`,
    );
  }
  const out: number[] = [];
  let t = 0;
  for (let i = 0; i < count; i++) {
    out.push(t);
    t += (-Math.log(1 - rand()) / ratePerSecond) * 1000;
  }
  return out;
}

const WORDS = (
  "once upon a time there was a little girl named lily she liked to play in the park with her " +
  "friend tom one day they saw a big red ball under a tree the sun was shining and the birds " +
  "were singing happy mom said do not go far so they ran to the small pond and found a shiny " +
  "stone the dog barked and jumped because he wanted to play too after that they went home " +
  "and ate a yummy cake then the cat slept on the warm bed and everyone smiled"
).split(" ");

/** `n` random story words joined by spaces. */
export function storyWords(n: number, rand: () => number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(WORDS[Math.floor(rand() * WORDS.length)]!);
  return out.join(" ");
}

/** Counts the tokens a prompt will take (BOS included), when the model's tokenizer is at hand. */
export type TokenCounter = (text: string) => number;

/**
 * A prompt of about `tokens` tokens. With a counter it is the longest run of words whose
 * encoding (BOS included) is at most `tokens` long; without one it assumes 1.5 tokens a word
 * (the load report shows the prompt lengths the server counted).
 */
export function storyPrompt(tokens: number, rand: () => number, count?: TokenCounter): string {
  if (!count) return storyWords(Math.max(1, Math.round(tokens / 1.5)), rand);
  const words: string[] = [];
  let text = "";
  for (;;) {
    const next = WORDS[Math.floor(rand() * WORDS.length)]!;
    const candidate = words.length === 0 ? next : `${text} ${next}`;
    if (count(candidate) > tokens && words.length > 0) return text;
    words.push(next);
    text = candidate;
    if (count(text) >= tokens) return text;
  }
}

/** A chat message of the OpenAI / WebSocket protocol. */
export interface ChatTurn {
  readonly role: "system" | "developer" | "user" | "assistant";
  readonly content: string;
}

/** One request of a workload: a prompt or chat messages, and its max_tokens. */
export interface WorkItem {
  readonly prompt?: string;
  readonly messages?: readonly ChatTurn[];
  readonly maxTokens: number;
}

export interface WorkloadOptions {
  readonly count: number;
  readonly promptTokens: LengthDist;
  readonly outputTokens: LengthDist;
  readonly seed: number;
  readonly countTokens?: TokenCounter;
}

/** `count` requests with seeded prompt and output lengths. */
export function syntheticWorkload(opts: WorkloadOptions): WorkItem[] {
  const rand = seededRandom(opts.seed);
  return Array.from({ length: opts.count }, () => {
    const p = drawLength(opts.promptTokens, rand);
    const maxTokens = drawLength(opts.outputTokens, rand);
    return { prompt: storyPrompt(p, rand, opts.countTokens), maxTokens };
  });
}

/**
 * Parses a JSONL request file: one object a line with "prompt" (string) or "messages"
 * (chat turns), and optionally "max_tokens" (else `defaultMaxTokens`). Blank lines are skipped;
 * errors name the line.
 */
export function parseJsonlWorkload(
  text: string,
  source: string,
  defaultMaxTokens: number,
): WorkItem[] {
  const items: WorkItem[] = [];
  text.split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
    const where = `${source}:${i + 1}`;
    let v: unknown;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new Error(`Cannot read workload ${where}: not JSON (${(e as Error).message})`);
    }
    const o = v as { prompt?: unknown; messages?: unknown; max_tokens?: unknown };
    if (v === null || typeof v !== "object") {
      throw new Error(
        `Cannot read workload ${where}: expected an object, received ${line.slice(0, 60)}`,
      );
    }
    const maxTokens = o.max_tokens ?? defaultMaxTokens;
    if (!Number.isInteger(maxTokens) || (maxTokens as number) < 1) {
      throw new Error(
        `Cannot read workload ${where}: max_tokens must be a positive integer, received ${
          JSON.stringify(o.max_tokens)
        }`,
      );
    }
    if (typeof o.prompt === "string") {
      items.push({ prompt: o.prompt, maxTokens: maxTokens as number });
    } else if (Array.isArray(o.messages) && o.messages.length > 0) {
      items.push({ messages: o.messages as ChatTurn[], maxTokens: maxTokens as number });
    } else {
      throw new Error(
        `Cannot read workload ${where}: expected "prompt" (a string) or "messages" (a non-empty array)`,
      );
    }
  });
  if (items.length === 0) throw new Error(`Cannot read workload ${source}: it has no requests`);
  return items;
}
