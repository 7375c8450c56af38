/**
 * The slowest schemas of issue 37's attack, each sent as one constrained request through the
 * real serving core (CPU engine, lazy grammar service), with what the server did meanwhile:
 * the latency of plain (unconstrained) requests sent one after another, and of one canary
 * constrained request (a small fresh schema) sent 100 ms after the attack. Each case gets a
 * fresh core and is cut at --timeout seconds (">N s"), so the code before the fix, whose
 * compiles could not be cut, still finishes in minutes.
 *
 *   deno run -A bench/grammar_attack_bench.ts [--model <gguf>] [--timeout 15] [--unbounded]
 *
 * --unbounded lifts the bounds checked before a compile (depth, repetition, lengths, enum,
 * bytes; lib/grammar/grammar_limits.ts), so the time and memory budgets and the worker restarts
 * alone stand between the attack and the server.
 *
 * It uses only what main at bd9a650 had too, so the same file measures both: copy it into a
 * checkout of bd9a650 (`git worktree add /tmp/base bd9a650`) and run it there.
 */
import { parseArgs } from "@std/cli/parse-args";
import { ServingCore } from "../actors/core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { lazyGrammarService } from "../lib/grammar/grammar_service.ts";
import type { OutputConstraint } from "../lib/grammar/output_constraint.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { machineInfo, machineLine } from "./machine.ts";
import { fmt, table } from "./stats.ts";

const mirror = Deno.env.get("MODEL_MIRROR") ?? "../shared/models";
const args = parseArgs(Deno.args, {
  string: ["model", "timeout"],
  boolean: ["unbounded"],
  default: { model: `${mirror}/compat/llama3-like-q4_k_m.gguf`, timeout: "15" },
});
const timeoutMs = Number(args.timeout) * 1000;

// Imported only when asked: main at bd9a650 has no such module.
const limits = args.unbounded
  ? {
    ...(await import("../lib/grammar/grammar_limits.ts")).GRAMMAR_LIMITS,
    maxBytes: Infinity,
    maxDepth: Infinity,
    maxEnumValues: Infinity,
    maxRepetition: Infinity,
    maxLengthBound: Infinity,
  }
  : undefined;

const model = await loadModel(args.model);
const tokenizer = new Tokenizer(model.tokenizer!);

function nested(depth: number, wrap: (s: unknown) => unknown): unknown {
  let s: unknown = { type: "string" };
  for (let i = 0; i < depth; i++) s = wrap(s);
  return s;
}
const objects = (n: number) =>
  nested(n, (s) => ({ type: "object", properties: { a: s }, required: ["a"] }));
const schema = (s: unknown): OutputConstraint => ({
  type: "json_schema",
  schema: JSON.stringify(s),
});

const CASES: [string, OutputConstraint][] = [
  ["pattern ^(a{0,1000}){0,1000}$", schema({ type: "string", pattern: "^(a{0,1000}){0,1000}$" })],
  ["maxLength 1e9", schema({ type: "string", maxLength: 1e9 })],
  ["minLength 1e9", schema({ type: "string", minLength: 1e9 })],
  ["enum of 100,000 strings", schema({ enum: Array.from({ length: 100_000 }, (_, i) => `v${i}`) })],
  ["60 nested objects", schema(objects(60))],
  ["1,000 nested arrays", schema(nested(1000, (s) => ({ type: "array", items: s })))],
  ["GBNF, 2,000 nested parentheses", {
    type: "grammar",
    grammar: `root ::= ${"(".repeat(2000)}"a"${")".repeat(2000)}`,
  }],
  // What tool_choice "required" builds from a tool whose parameters nest 70 deep.
  [
    "tool parameters 70 deep",
    schema({
      type: "object",
      properties: { name: { const: "deep" }, arguments: objects(70) },
      required: ["name", "arguments"],
      additionalProperties: false,
    }),
  ],
  [
    "$ref cycle, no base case",
    schema({
      $ref: "#/$defs/n",
      $defs: {
        n: { type: "object", properties: { next: { $ref: "#/$defs/n" } }, required: ["next"] },
      },
    }),
  ],
  ['GBNF (("a"){0,1000}){0,1000}', { type: "grammar", grammar: 'root ::= ("a"{0,1000}){0,1000}' }],
];

const CANARY = schema({
  type: "object",
  properties: {
    colour: { enum: ["red", "green"] },
    n: { type: "integer", minimum: 0, maximum: 9 },
  },
  required: ["colour", "n"],
});

function request(i: string, maxTokens: number, c?: OutputConstraint): GenerationRequest {
  return {
    prompt: tokenizer.encode(`Once upon a time ${i}`),
    maxTokens,
    sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
    stop: [],
    priority: "interactive",
    requestId: `bench-${i}`,
    ...(c ? { constraint: c } : {}),
  };
}

/** Runs a request to its end: what it ended with, and when. */
async function run(
  core: ServingCore,
  req: GenerationRequest,
): Promise<{ end: string; ms: number }> {
  const t = performance.now();
  let end = "";
  for await (const ev of core.generate(req) as AsyncIterable<GenerationEvent>) {
    if (ev.type === "done") end = `200 (${ev.finishReason})`;
    if (ev.type === "error") end = `${ev.code}: ${ev.message}`;
  }
  return { end, ms: performance.now() - t };
}

const cut = <T>(p: Promise<T>) =>
  Promise.race([p, new Promise<undefined>((r) => setTimeout(() => r(undefined), timeoutMs))]);
const over = `>${timeoutMs / 1000} s`;

async function measure(name: string, c: OutputConstraint | undefined): Promise<string[]> {
  const engine = () =>
    WasmEngine.create(model.config, model.weights, { numBlocks: 64, blockSize: 16 }, {
      maxSeqs: 4,
    });
  const grammars = limits
    ? lazyGrammarService(tokenizer, model.config.vocabSize, { limits, onRestart: () => {} })
    : lazyGrammarService(tokenizer, model.config.vocabSize);
  const core = new ServingCore({
    engine: await engine(),
    engineFactory: engine,
    codec: tokenizer,
    grammars,
    scheduler: { maxRunning: 4 },
  });
  await (await grammars.service()).compile({ type: "json_object" }); // vocabulary sent, warm
  await run(core, request("warm", 4));
  let attackDone = c === undefined;
  const attack = c === undefined
    ? undefined
    : run(core, request("attack", 16, c)).finally(() => attackDone = true);
  const canary = new Promise((r) => setTimeout(r, 100)).then(() =>
    run(core, request("canary", 24, CANARY))
  );
  const plain: number[] = [];
  const started = performance.now();
  // Plain requests, one after another, while the attack runs (at least 1 s, at most the cut).
  while (
    (!attackDone || performance.now() - started < 1000) && performance.now() - started < timeoutMs
  ) {
    plain.push((await run(core, request(`plain-${plain.length}`, 4))).ms);
  }
  const [a, k] = [await cut(attack ?? Promise.resolve(undefined)), await cut(canary)];
  plain.sort((x, y) => x - y);
  const row = [
    name,
    c === undefined ? "" : a ? fmt(a.ms / 1000, 2) : over,
    c === undefined ? "" : a ? a.end.slice(0, 70) : "still compiling",
    k ? `${fmt(k.ms / 1000, 2)}: ${k.end.startsWith("200") ? "200" : k.end.slice(0, 50)}` : over,
    fmt(plain[Math.floor(plain.length / 2)]!, 0),
    fmt(plain.at(-1)!, 0),
  ];
  console.error(row.join(" | "));
  (await grammars.service()).close(); // ends a compile that is still running
  return row;
}

console.log(machineLine(machineInfo()));
console.log(
  `model ${args.model} (vocab ${model.config.vocabSize}), cpu engine, cut at ${over}${
    limits ? `, bounds lifted (compile budget ${limits.compileMs} ms)` : ""
  }`,
);
const rows = [await measure("(no attack)", undefined)];
for (const [name, c] of CASES) rows.push(await measure(name, c));
console.log(
  "\n" + table(
    [
      "schema",
      "attack answered, s",
      "answer",
      "canary constrained, s: answer",
      "plain p50, ms",
      "plain max, ms",
    ],
    rows,
  ),
);
Deno.exit(0); // cores of cut cases still hold a request
