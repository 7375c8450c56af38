import { openModel, uploadProgress } from "./open_model.ts";
import { DEFAULT_LIMITS } from "../engine/limits.ts";
import { parseFlags } from "./args.ts";
import { unknownArgumentsError } from "./flag_suggestions.ts";
import { whenLauncherGone } from "./parent_watch.ts";
import { versionLine } from "./version.ts";
import { CoreBackend } from "../backend/core_backend.ts";
import {
  engineMemory,
  modelAllocator,
  modelPlacement,
  resolveBackend,
} from "../compose/engine_factory.ts";
import { openServing, planServing } from "../compose/open_serving.ts";
import { formatBytes } from "../util/byte_size.ts";
import { describeWithGpuApi } from "../util/gpu_api.ts";
import { DEFAULT_MODEL } from "../source/model_source.ts";
import { z } from "zod";
import { flagNumber, numberDefault } from "../http/request_params.ts";
import { buildGenerationRequest } from "../http/generation_request.ts";
import { ApiError } from "../http/errors.ts";
import { PromptTokens } from "../backend/prompt_tokens.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { ModelConfig } from "../model/model_config.ts";

const GenerateArgs = z.object({
  model: z.string().optional(),
  tokenizer: z.string().optional(),
  "models-dir": z.string().optional(),
  prompt: z.string().default(""),
  // The limits and defaults are the request parameters' (lib/http/request_params.ts).
  "max-tokens": flagNumber("max_tokens").default(256),
  temperature: flagNumber("temperature").default(numberDefault("temperature")),
  "top-k": flagNumber("top_k").default(numberDefault("top_k")),
  "top-p": flagNumber("top_p").default(numberDefault("top_p")),
  "min-p": flagNumber("min_p").default(numberDefault("min_p")),
  seed: flagNumber("seed").optional(),
  backend: z.enum(["webgpu", "cpu", "reference", "auto"]).default("auto"),
  "context-length": z.coerce.number().int().positive().optional(),
  threads: z.coerce.number().int().positive().max(256).optional(),
  "kv-dtype": z.enum(["f16", "f32"]).optional(),
});

/** llama.cpp's spellings of the same flags (`llama-cli -m x -p "..." -n 64 -c 512 --temp 0`). */
export const GENERATE_ALIASES: Readonly<Record<string, string>> = {
  m: "model",
  p: "prompt",
  n: "max-tokens",
  "n-predict": "max-tokens",
  c: "context-length",
  "ctx-size": "context-length",
  temp: "temperature",
  t: "threads",
};

const USAGE =
  `Usage: deno task generate [--model <path|url|name>] [--tokenizer <path|url>] [--models-dir <dir>] --prompt <text>
  [--max-tokens 256] [--temperature 1] [--top-k 0] [--top-p 1] [--min-p 0] [--seed <n>]
  [--backend auto|cpu|webgpu|reference] [--threads <n>] [--kv-dtype f16|f32] [--context-length <n>]
       deno task generate --help | --version
Prints only the generated continuation on stdout; diagnostics go to stderr.
llama.cpp's names work too: -m (--model), -p (--prompt), -n / --n-predict (--max-tokens),
-c / --ctx-size (--context-length), --temp (--temperature).

Examples:
  deno task generate --prompt "Once upon a time" --max-tokens 64 --temperature 0
  deno task generate --model stories260K-q8_0 --prompt "Tom and his dog" --seed 7
  deno task generate --model ./my-model.gguf --backend cpu --prompt "Hello"
  deno task generate -m stories260K-q8_0 -p "Once upon a time" -n 64 --temp 0`;

export type GenerateArgs = z.infer<typeof GenerateArgs>;

/**
 * Parses and validates `generate`'s flags: the arguments, or an error message listing what is
 * wrong (unknown flags, or each bad value with the value received). Exported for tests and the
 * launcher.
 */
export function parseGenerateArgs(argv: readonly string[]): GenerateArgs | { error: string } {
  const { values, unknown } = parseFlags(argv, {
    string: Object.keys(GenerateArgs.shape),
    boolean: ["help", "version"],
    aliases: GENERATE_ALIASES,
  });
  if (unknown.length > 0) {
    const known = [...Object.keys(GenerateArgs.shape), "help", "version"];
    return { error: unknownArgumentsError(unknown, known, "deno task generate") };
  }
  delete values.help;
  delete values.version;
  const parsed = GenerateArgs.safeParse(values);
  if (parsed.success) return parsed.data;
  return {
    error: parsed.error.issues.map((i) => {
      const key = String(i.path[0]);
      return `--${key}: ${i.message} (received ${JSON.stringify(values[key])})`;
    }).join("\n"),
  };
}

/** What `--help` or `--version` print, or undefined for a run. */
export function generateInfo(argv: readonly string[]): string | undefined {
  if (argv.includes("--help")) return USAGE;
  if (argv.includes("--version")) return versionLine();
  return undefined;
}

/**
 * The flags as a request, through the mapping every API uses (lib/http/generation_request.ts):
 * the prompt tokenized once, refused if it leaves no room, max_tokens capped to the room left,
 * the seed mapped (or drawn) as the server does. Before the engine is built, so a prompt that
 * cannot fit fails at once.
 */
function cliRequest(args: GenerateArgs, tokenizer: Tokenizer, config: ModelConfig) {
  const text = new PromptTokens(tokenizer);
  const backend = {
    contextLength: config.contextLength,
    vocabSize: config.vocabSize,
    tokenize: (t: string, o: { bos: boolean; special: boolean }) => text.tokenize(t, o),
    minTokens: (t: string) => text.minTokens(t),
  };
  try {
    return buildGenerationRequest(
      {
        prompt: args.prompt,
        promptParam: "--prompt",
        maxTokens: args["max-tokens"],
        temperature: args.temperature,
        topK: args["top-k"],
        topP: args["top-p"],
        minP: args["min-p"],
        seed: args.seed,
      },
      backend,
      "cli",
    );
  } catch (e) {
    if (e instanceof ApiError) throw new Error(`Cannot generate: ${e.message}`);
    throw e;
  }
}

/**
 * `generate` command: one prompt, one completion, streamed to stdout as it is decoded.
 * Returns the process exit code.
 */
export async function generateCommand(argv: string[]): Promise<number> {
  const info = generateInfo(argv);
  if (info !== undefined) {
    console.log(info);
    return 0;
  }
  const parsed = parseGenerateArgs(argv);
  if ("error" in parsed) {
    console.error(parsed.error);
    return 2;
  }
  // Started by the launcher, which is gone: nobody reads the output any more.
  whenLauncherGone(() => Deno.exit(143));
  const args = parsed;
  // Asked while the model loads: the adapter probe is a child process of its own.
  const resolving = resolveBackend(args.backend);
  const { source, tokenizer, ...opened } = await openModel(args.model ?? DEFAULT_MODEL, {
    modelsDir: args["models-dir"],
    tokenizer: args.tokenizer,
    contextLength: args["context-length"],
    purpose: "generate with",
    allocate: modelAllocator(args.backend),
    placeTensors: modelPlacement(args.backend),
  });
  const engineOptions = {
    ...(args["kv-dtype"] === undefined ? {} : { kvDtype: args["kv-dtype"] }),
    ...(args.threads === undefined ? {} : { threads: args.threads }),
  };
  // One sequence: an automatic KV cache of one full context, shortened to fit the device.
  const resolved = await resolving;
  const { plan, kv, model } = await planServing(opened.model, resolved, {
    blockSize: DEFAULT_LIMITS.blockSize,
    maxRunning: 1,
  }, engineOptions);
  const limit = model.config.contextLength;
  const { request, promptTokens } = cliRequest(args, tokenizer, model.config);
  const maxTokens = request.maxTokens;
  if (maxTokens < args["max-tokens"]) {
    // Said before generating, so a short output is not taken for the model stopping.
    console.error(
      `--max-tokens ${args["max-tokens"]} lowered to ${maxTokens}: the prompt has ` +
        `${promptTokens} tokens and the context is ${limit} (--context-length raises it)`,
    );
  }
  // The same serving core as the server (one sequence): pipelined decode, the same stop rules.
  const { core, engine, description } = await openServing({
    model,
    tokenizer,
    backend: args.backend,
    resolved,
    kv,
    limits: { maxBatchTokens: DEFAULT_LIMITS.maxBatchTokens, maxSeqs: 1 },
    engineOptions,
    onUpload: uploadProgress(source.modelPath),
  });
  const mem = engineMemory(engine);
  const c = model.config;
  console.error(
    `model ${source.modelPath} (${c.architecture}, ${c.nLayers} layers, vocab ${c.vocabSize}, context ${c.contextLength}) on ${
      describeWithGpuApi(description)
    }; memory: weights ${mem ? formatBytes(mem.weights) : "?"}, kv cache ${
      formatBytes(mem?.kvCache ?? plan.bytes)
    }; prompt ${promptTokens} tokens`,
  );

  const backend = new CoreBackend("cli", core, tokenizer);
  const out = new TextEncoder();
  const started = performance.now();
  let generated = 0;
  let finish = "";
  try {
    const events = backend.generate(request, new AbortController().signal);
    for await (const e of events) {
      if (e.type === "token") await Deno.stdout.write(out.encode(e.text));
      if (e.type === "done") {
        generated = e.usage.completionTokens;
        finish = e.finishReason === "stop"
          ? "the model ended the text"
          : `--max-tokens ${maxTokens}`;
      }
      if (e.type === "error") throw new Error(`Generation failed (${e.code}): ${e.message}`);
    }
    await Deno.stdout.write(out.encode("\n"));
  } finally {
    await core.close();
  }
  const secs = (performance.now() - started) / 1000;
  console.error(
    `${generated} tokens in ${secs.toFixed(2)} s (${
      (generated / secs).toFixed(1)
    } tokens/s); stopped by ${finish}`,
  );
  return 0;
}
