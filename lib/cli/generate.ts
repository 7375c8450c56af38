import { openModel, uploadProgress } from "./open_model.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import { parseArgs } from "@std/cli/parse-args";
import type { SamplingParams } from "../engine/engine.ts";
import { ServingCore } from "../../actors/core.ts";
import { CoreBackend } from "../serving/core_backend.ts";
import { createEngine, engineMemory, planKv } from "../serving/engine_factory.ts";
import { formatBytes } from "../util/byte_size.ts";
import { DEFAULT_MODEL } from "../source/model_source.ts";
import { z } from "zod";

const GenerateArgs = z.object({
  model: z.string().optional(),
  tokenizer: z.string().optional(),
  "models-dir": z.string().optional(),
  prompt: z.string().default(""),
  "max-tokens": z.coerce.number().int().positive().default(256),
  temperature: z.coerce.number().min(0).default(1),
  "top-k": z.coerce.number().int().min(0).default(0),
  "top-p": z.coerce.number().gt(0).max(1).default(1),
  "min-p": z.coerce.number().min(0).max(1).default(0),
  seed: z.coerce.number().int().min(0).max(0xffffffff).optional(),
  backend: z.enum(["webgpu", "cpu", "auto"]).default("auto"),
  "context-length": z.coerce.number().int().positive().optional(),
});

const USAGE =
  `Usage: deno task generate [--model <path|url|name>] [--tokenizer <path|url>] [--models-dir <dir>] --prompt <text>
  [--max-tokens 256] [--temperature 1] [--top-k 0] [--top-p 1] [--min-p 0] [--seed <n>]
  [--backend auto|webgpu|cpu] [--context-length <n>]
Prints only the generated continuation on stdout; diagnostics go to stderr.`;

/**
 * `generate` command: one prompt, one completion, streamed to stdout as it is decoded.
 * Returns the process exit code.
 */
export async function generateCommand(argv: string[]): Promise<number> {
  const flags = parseArgs(argv, {
    string: [
      "model",
      "tokenizer",
      "models-dir",
      "prompt",
      "max-tokens",
      "temperature",
      "top-k",
      "top-p",
      "min-p",
      "seed",
      "backend",
      "context-length",
    ],
    boolean: ["help"],
  });
  if (flags.help) {
    console.log(USAGE);
    return 0;
  }
  const unknown = Object.keys(flags).filter((k) =>
    k !== "_" && k !== "help" && !(k in GenerateArgs.shape)
  );
  // parseArgs also lists the value of `--prompt ""` as a positional; an empty prompt is valid.
  const positional = flags._.filter((a: string | number) => a !== "");
  if (unknown.length > 0 || positional.length > 0) {
    console.error(
      `Unknown argument(s): ${
        [...unknown.map((k) => `--${k}`), ...positional].join(" ")
      }\n${USAGE}`,
    );
    return 2;
  }
  const parsed = GenerateArgs.safeParse(flags);
  if (!parsed.success) {
    for (const i of parsed.error.issues) {
      const key = String(i.path[0]);
      console.error(
        `--${key}: ${i.message} (received ${
          JSON.stringify((flags as Record<string, unknown>)[key])
        })`,
      );
    }
    return 2;
  }
  const args = parsed.data;
  const { source, tokenizer, ...opened } = await openModel(args.model ?? DEFAULT_MODEL, {
    modelsDir: args["models-dir"],
    tokenizer: args.tokenizer,
    contextLength: args["context-length"],
    purpose: "generate with",
  });
  // One sequence: an automatic KV cache of one full context, shortened to fit the device.
  const plan = await planKv(opened.model, args.backend, {
    blockSize: DEFAULT_LIMITS.blockSize,
    maxRunning: 1,
  });
  const model = plan.contextLength === opened.model.config.contextLength
    ? opened.model
    : { ...opened.model, config: { ...opened.model.config, contextLength: plan.contextLength } };
  const promptIds = tokenizer.encode(args.prompt);
  const limit = model.config.contextLength;
  if (promptIds.length >= limit) {
    throw new Error(
      `Cannot generate: the prompt has ${promptIds.length} tokens, the context length is ${limit}`,
    );
  }
  const maxTokens = Math.min(args["max-tokens"], limit - promptIds.length);
  const kv = { numBlocks: plan.numBlocks, blockSize: plan.blockSize };
  const limits = { maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens, maxSeqs: 1 };
  const { engine, description } = await createEngine(
    model,
    args.backend,
    kv,
    limits,
    uploadProgress(source.modelPath),
  );
  const mem = engineMemory(engine);
  const c = model.config;
  console.error(
    `model ${source.modelPath} (${c.architecture}, ${c.nLayers} layers, vocab ${c.vocabSize}, context ${c.contextLength}) on ${description}; memory: weights ${
      mem ? formatBytes(mem.weights) : "?"
    }, kv cache ${formatBytes(mem?.kvCache ?? plan.bytes)}; prompt ${promptIds.length} tokens`,
  );

  // The same serving core as the server (one sequence): pipelined decode, the same stop rules.
  const core = new ServingCore({
    engine,
    engineFactory: async () => (await createEngine(model, args.backend, kv, limits)).engine,
    codec: tokenizer,
    maxInFlight: DEFAULT_LIMITS.pipelineDepth,
    scheduler: { maxRunning: 1, maxBatchTokens: limits.maxBatchTokens },
  });
  const backend = new CoreBackend("cli", core, tokenizer);
  const sampling: SamplingParams = {
    temperature: args.temperature,
    topK: args["top-k"],
    topP: args["top-p"],
    minP: args["min-p"],
    seed: args.seed ?? crypto.getRandomValues(new Uint32Array(1))[0]!,
  };
  const out = new TextEncoder();
  const started = performance.now();
  let generated = 0;
  try {
    const events = backend.generate({
      prompt: promptIds,
      maxTokens,
      sampling,
      stop: [],
      priority: "interactive",
      requestId: "cli",
    }, new AbortController().signal);
    for await (const e of events) {
      if (e.type === "token") await Deno.stdout.write(out.encode(e.text));
      if (e.type === "done") generated = e.usage.completionTokens;
      if (e.type === "error") throw new Error(`Generation failed (${e.code}): ${e.message}`);
    }
    await Deno.stdout.write(out.encode("\n"));
  } finally {
    await core.close();
  }
  const secs = (performance.now() - started) / 1000;
  console.error(
    `${generated} tokens in ${secs.toFixed(2)} s (${(generated / secs).toFixed(1)} tokens/s)`,
  );
  return 0;
}
