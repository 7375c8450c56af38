import type { Hono } from "hono";
import type { GenerationBackend } from "../core/generation.ts";
import { samplingDefaults } from "./request_params.ts";
import { templateTools, toolFormatName } from "../chat/tools.ts";

/** What the start-up code knows beyond the backend: where the model came from and its limits. */
export interface ServerProps {
  readonly modelPath?: string;
  /** The engine in words, e.g. "webgpu (llvmpipe ...)". */
  readonly backend?: string;
  readonly maxRunning?: number;
  readonly maxWaiting?: number;
  readonly maxBatchTokens?: number;
  readonly kvBlocks?: number;
  readonly blockSize?: number;
  readonly resultCacheBytes?: number;
}

export interface PropsOptions {
  readonly backend: GenerationBackend;
  readonly servedModelNames: readonly string[];
  readonly props: ServerProps;
  /** Limits of the HTTP edge itself. */
  readonly limits: Readonly<Record<string, number>>;
  readonly isLoaded: () => boolean;
}

/**
 * GET /props: the model, its context, chat template and the server's limits, in
 * llama-server's field names where it has them (`default_generation_settings.n_ctx`,
 * `total_slots`, `chat_template`, `bos_token`, `eos_token`, `model_path`) plus ours.
 */
export function registerPropsRoute(app: Hono, o: PropsOptions): void {
  app.get("/props", (c) => {
    const b = o.backend;
    const d = samplingDefaults(b.samplingDefaults);
    const p = o.props;
    return c.json({
      model: o.servedModelNames[0],
      served_model_names: o.servedModelNames,
      model_path: p.modelPath ?? null,
      backend: p.backend ?? null,
      loaded: o.isLoaded(),
      context_length: b.contextLength,
      vocab_size: b.vocabSize ?? null,
      chat_template: b.chatTemplate ?? null,
      // "native:<format>" where the template renders tools, else "generic" (lib/chat/tools.ts).
      tool_format: toolFormatName(templateTools(b.chatTemplate)),
      bos_token: b.bosToken,
      eos_token: b.eosToken,
      total_slots: p.maxRunning ?? null,
      limits: {
        max_running: p.maxRunning ?? null,
        max_waiting: p.maxWaiting ?? null,
        max_batch_tokens: p.maxBatchTokens ?? null,
        kv_blocks: p.kvBlocks ?? null,
        kv_block_size: p.blockSize ?? null,
        result_cache_bytes: p.resultCacheBytes ?? 0,
        ...o.limits,
      },
      default_generation_settings: {
        n_ctx: b.contextLength,
        params: {
          temperature: d.temperature,
          top_k: d.topK,
          top_p: d.topP,
          min_p: d.minP,
        },
      },
    });
  });
}
