import { openModelFor, uploadProgress } from "./open_model.ts";
import { parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";
import type { Settings } from "./settings.ts";
import { whenLauncherGone } from "./parent_watch.ts";
import { CoreBackend } from "../backend/core_backend.ts";
import { engineMemory, resolveBackend } from "../compose/engine_factory.ts";
import { openServing, planServing } from "../compose/open_serving.ts";
import { formatBytes } from "../util/byte_size.ts";
import { describeWithGpuApi } from "../util/gpu_api.ts";
import { buildGenerationRequest } from "../http/generation_request.ts";
import { ApiError } from "../http/errors.ts";
import { PromptTokens } from "../backend/prompt_tokens.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { ModelConfig } from "../model/model_config.ts";

/** `generate`'s settings (the table's rows it takes, and the defaults of the rest). */
export type GenerateArgs = Settings;

/**
 * Parses and validates `generate`'s flags: the arguments, or an error message listing what is
 * wrong (unknown flags, or each bad value with the value received). Exported for tests and the
 * launcher.
 */
export function parseGenerateArgs(argv: readonly string[]): GenerateArgs | { error: string } {
  try {
    return parseSettings("generate", argv);
  } catch (e) {
    return { error: (e as Error).message };
  }
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
        maxTokens: args.maxTokens,
        temperature: args.temperature,
        topK: args.topK,
        topP: args.topP,
        minP: args.minP,
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
  if (printInfo("generate", argv)) return 0;
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
  const { source, tokenizer, ...opened } = await openModelFor(args, "generate with");
  const engineOptions = {
    ...(args.kvDtype === undefined ? {} : { kvDtype: args.kvDtype }),
    ...(args.threads === undefined ? {} : { threads: args.threads }),
  };
  // One sequence: an automatic KV cache of one full context, shortened to fit the device.
  const resolved = await resolving;
  const { plan, kv, model } = await planServing(opened.model, resolved, {
    blockSize: args.blockSize,
    maxRunning: 1,
  }, engineOptions);
  const limit = model.config.contextLength;
  const { request, promptTokens } = cliRequest(args, tokenizer, model.config);
  const maxTokens = request.maxTokens;
  if (maxTokens < args.maxTokens) {
    // Said before generating, so a short output is not taken for the model stopping.
    console.error(
      `--max-tokens ${args.maxTokens} lowered to ${maxTokens}: the prompt has ` +
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
    limits: { maxBatchTokens: args.maxBatchTokens, maxSeqs: 1 },
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
