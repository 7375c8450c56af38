/**
 * Constrained decoding's cost: decode tokens/s of N concurrent generations under a JSON schema
 * against the same generations unconstrained (same prompts, same number of tokens), on the CPU
 * engine through the real serving core, and the schema compile time, cold and cached.
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
      prompt: `Numbers, list ${i}:`,
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
// and a new schema again.
const t0 = performance.now();
const grammars = await GrammarService.create(grammarVocabulary(tokenizer, model.config.vocabSize));
const tInfo = performance.now();
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
const t1 = performance.now();
await grammars.compile(richConstraint);
const t2 = performance.now();
await grammars.compile(richConstraint);
const t3 = performance.now();
console.log(
  table(["what", "ms"], [
    ["vocabulary for the grammar engine (once per server)", fmt(tInfo - t0)],
    ["schema compile, cold", fmt(t2 - t1)],
    ["schema compile, cached (same schema)", fmt(t3 - t2, 3)],
  ]),
);
