/**
 * Constrained decoding's cost: decode tokens/s of N concurrent generations under a JSON schema
 * against the same generations unconstrained (same prompts, same number of tokens), on the CPU
 * engine through the real serving core; the schema compile time, cold and cached, with the event
 * loop's longest stall meanwhile; and the next mask's cost, for 1 and for 32 matchers at once.
 *
 *   deno task bench:structured [--model /tmp/perf/qwen25-05b-q4_k_m.gguf] [--seqs 1,32]
 *     [--items 24] [--threads n] [--rounds 3]
 *
 * The schema is an array of exactly --items digits (`[3, 1, 4, …]`), so every generation
 * writes the same number of tokens whatever the (random) weights prefer, and the
 * unconstrained run is given that many tokens.
 */
import { parseArgs } from "@std/cli/parse-args";
import { ServingCore } from "../actors/core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { GrammarService, lazyGrammarService } from "../lib/grammar/grammar_service.ts";
import { grammarVocabulary } from "../lib/grammar/grammar_vocabulary.ts";
import type { OutputConstraint } from "../lib/grammar/output_constraint.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, ratio, table } from "./stats.ts";

const args = parseArgs(Deno.args, {
  string: ["model", "seqs", "items", "threads", "rounds"],
  default: { model: "/tmp/perf/qwen25-05b-q4_k_m.gguf", seqs: "1,32", items: "24", rounds: "3" },
});
const rounds = Number(args.rounds);
const seqCounts = args.seqs.split(",").map(Number);
const items = Number(args.items);
const threads = args.threads === undefined ? undefined : Number(args.threads);

const model = await loadModel(args.model);
const tokenizer = new Tokenizer(model.tokenizer!);
const maxSeqs = Math.max(...seqCounts);
const kv = { numBlocks: maxSeqs * 8, blockSize: 16 };
const engine = () =>
  WasmEngine.create(model.config, model.weights, kv, {
    maxSeqs,
    ...(threads ? { threads } : {}),
  });
const core = new ServingCore({
  engine: await engine(),
  engineFactory: engine,
  codec: tokenizer,
  grammars: lazyGrammarService(tokenizer, model.config.vocabSize),
  scheduler: { maxRunning: maxSeqs },
});

const schema = {
  type: "array",
  items: { type: "integer", minimum: 0, maximum: 9 },
  minItems: items,
  maxItems: items,
};
const constraint: OutputConstraint = { type: "json_schema", schema: JSON.stringify(schema) };

interface Run {
  readonly tokens: number[];
  /** Σ of each generation's decode tokens/s: the aggregate rate while they run together. */
  readonly decodeTps: number;
  readonly finish: string[];
}

async function run(n: number, maxTokens: number, c?: OutputConstraint): Promise<Run> {
  const one = async (i: number) => {
    const req: GenerationRequest = {
      prompt: tokenizer.encode(`Numbers, list ${i}:`),
      maxTokens,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      stop: [],
      priority: "interactive",
      requestId: `bench-${i}`,
      ...(c ? { constraint: c } : {}),
    };
    let tokens = 0, tps = 0, finish = "";
    for await (const ev of core.generate(req) as AsyncIterable<GenerationEvent>) {
      if (ev.type === "token") tokens += ev.ids.length;
      if (ev.type === "done") [tps, finish] = [ev.timings.decodeTokensPerSecond, ev.finishReason];
      if (ev.type === "error") throw new Error(ev.message);
    }
    return { tokens, tps, finish };
  };
  const all = await Promise.all(Array.from({ length: n }, (_, i) => one(i)));
  return {
    tokens: all.map((r) => r.tokens),
    decodeTps: all.reduce((s, r) => s + r.tps, 0),
    finish: all.map((r) => r.finish),
  };
}

console.log(machineLine(machineInfo()));
console.log(
  `model ${args.model} (vocab ${model.config.vocabSize}), cpu engine, greedy, schema: ${items} digits, best of ${rounds} alternating rounds`,
);
await run(1, 8); // warm the engine
const rows: string[][] = [];
for (const n of seqCounts) {
  // Best of alternating rounds: the machine is shared, and one slow moment must not decide.
  let best = { free: 0, constrained: 0 };
  let tokens = 0;
  const finishes = new Set<string>();
  for (let round = 0; round < rounds; round++) {
    const constrained = await run(n, 8 * items + 8, constraint);
    constrained.finish.forEach((f) => finishes.add(f));
    tokens = Math.round(constrained.tokens.reduce((a, b) => a + b, 0) / constrained.tokens.length);
    const free = await run(n, tokens);
    best = {
      free: Math.max(best.free, free.decodeTps),
      constrained: Math.max(best.constrained, constrained.decodeTps),
    };
  }
  console.error(
    `${n} sequences: unconstrained ${fmt(best.free)} tok/s, json schema ${
      fmt(best.constrained)
    } tok/s`,
  );
  rows.push([
    String(n),
    String(tokens),
    fmt(best.free),
    fmt(best.constrained),
    ratio(best.constrained, best.free),
    [...finishes].join(","),
  ]);
}
console.log(
  "\n" +
    table(
      ["sequences", "tokens each", "unconstrained tok/s", "json schema tok/s", "ratio", "finish"],
      rows,
    ),
);
await core.close();

// Compile time: a fresh service (cold: builds the TokenizerInfo, then compiles), then the same
// and a new schema again, each with the event loop's longest stall meanwhile (the largest gap
// between ticks of a 1 ms timer: what every other stream waits at worst).
async function stall<T>(work: () => Promise<T>): Promise<{ value: T; ms: number; gap: number }> {
  let last = performance.now(), gap = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    gap = Math.max(gap, now - last);
    last = now;
  }, 1);
  const t = performance.now();
  try {
    const value = await work();
    const ms = performance.now() - t;
    gap = Math.max(gap, performance.now() - last);
    return { value, ms, gap };
  } finally {
    clearInterval(timer);
  }
}
const made = await stall(() =>
  GrammarService.create(grammarVocabulary(tokenizer, model.config.vocabSize))
);
const grammars = made.value;
const rich = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 20 },
    age: { type: "integer", minimum: 0, maximum: 150 },
    tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 5 },
    address: {
      type: "object",
      properties: { city: { type: "string" }, zip: { type: "string", pattern: "^[0-9]{5}$" } },
      required: ["city"],
    },
  },
  required: ["name", "age"],
  additionalProperties: false,
};
const richConstraint: OutputConstraint = { type: "json_schema", schema: JSON.stringify(rich) };
const cold = await stall(() => grammars.compile(richConstraint));
const cached = await stall(() => grammars.compile(richConstraint));

// Mask cost: n matchers of the digits schema walked in lock step, each step asking for all n
// masks at once (as the scheduler does), then feeding each the first digit its mask allows.
const digit = [...Array(model.config.vocabSize).keys()].filter((id) =>
  id < tokenizer.vocabSize && !tokenizer.isSpecial(id) &&
  /^[0-9]$/.test(new TextDecoder().decode(tokenizer.tokenBytes(id)))
);
/** The first id a mask allows that is not a stop id (-1: only stops, the output is complete). */
function firstAllowed(m: Uint32Array): number {
  for (let w = 0; w < m.length; w++) {
    for (let bits = m[w]!; bits !== 0; bits &= bits - 1) {
      const id = w * 32 + 31 - Math.clz32(bits & -bits);
      if (!grammars.stopIds.includes(id)) return id;
    }
  }
  return -1;
}
async function maskCost(n: number): Promise<number> {
  let cs = await Promise.all(Array.from({ length: n }, () => grammars.constraint(constraint)));
  let masks = 0, ms = 0;
  while (cs.length > 0) {
    const t = performance.now();
    const got = await Promise.all(cs.map((c) => c.nextMask()));
    ms += performance.now() - t;
    masks += cs.length;
    const next = got.map((m) =>
      digit.find((id) => (m[id >>> 5]! >>> (id & 31)) & 1) ?? firstAllowed(m)
    );
    cs.forEach((c, i) => next[i]! < 0 ? c.dispose() : c.accept(next[i]!));
    cs = cs.filter((_, i) => next[i]! >= 0);
  }
  return ms / masks;
}
const mask1 = await maskCost(1);
const mask32 = await maskCost(Math.max(...seqCounts));
console.log(
  table(["what", "ms", "longest event-loop stall, ms"], [
    ["vocabulary for the grammar engine (once per server)", fmt(made.ms), fmt(made.gap)],
    ["schema compile, cold", fmt(cold.ms), fmt(cold.gap)],
    ["schema compile, cached (same schema)", fmt(cached.ms, 3), fmt(cached.gap)],
    ["mask per token, 1 sequence (round trip to the grammar thread)", fmt(mask1, 3), ""],
    [
      `mask per token, ${Math.max(...seqCounts)} sequences asked at once`,
      fmt(mask32, 3),
      "",
    ],
  ]),
);
grammars.close();
