import { loadModel } from "../model/load_model.ts";
import { type ModelSource, resolveModelSource } from "../source/model_source.ts";
import { ProgressBar } from "../util/progress_bar.ts";
import { Tokenizer } from "../tokenizer/tokenizer.ts";
import type { Model } from "../model/weights.ts";
import type { PlaceTensors } from "../model/gguf.ts";
import { type BackendChoice, modelAllocator, modelPlacement } from "../compose/engine_factory.ts";

export interface OpenModelOptions {
  readonly modelsDir?: string;
  readonly tokenizer?: string;
  readonly contextLength?: number;
  /** Completes "Cannot ... <path>: it has no vocabulary", e.g. "serve" or "generate with". */
  readonly purpose: string;
  /** Start-up progress: bytes downloaded, then bytes of the weights read. */
  readonly onProgress?: (phase: "downloading" | "reading", bytes: number, total?: number) => void;
  /** Where the weights' bytes go (see loadModel). */
  readonly allocate?: (bytes: number) => Uint8Array;
  /** Where each tensor's bytes go, for a GGUF (see loadModel). */
  readonly placeTensors?: PlaceTensors;
}

/**
 * What both commands do first: resolve a model spec to files (downloading if needed), read the
 * weights with a progress bar, and build the tokenizer, which a llama2.c checkpoint only has
 * with --tokenizer.
 */
export async function openModel(
  spec: string,
  opts: OpenModelOptions,
): Promise<{ source: ModelSource; model: Model; tokenizer: Tokenizer }> {
  const onProgress = opts.onProgress;
  const source = await resolveModelSource(spec, {
    modelsDir: opts.modelsDir,
    tokenizer: opts.tokenizer,
    ...(onProgress
      ? { download: { onProgress: (n: number, t?: number) => onProgress("downloading", n, t) } }
      : {}),
  });
  // Drawn only on a terminal; a 260K model loads too fast to notice, a 4 GiB one does not.
  let bar: ProgressBar | undefined;
  let read = 0;
  const model = await loadModel(source.modelPath, {
    tokenizerPath: source.tokenizerPath,
    contextLength: opts.contextLength,
    ...(opts.allocate ? { allocate: opts.allocate } : {}),
    ...(opts.placeTensors ? { placeTensors: opts.placeTensors } : {}),
    onProgress: (bytes, total) => {
      bar ??= new ProgressBar(`loading ${source.modelPath.split("/").pop()}`, total, 0);
      bar.update(read = bytes);
      onProgress?.("reading", bytes, total);
    },
  });
  bar?.finish(read);
  if (!model.tokenizer) {
    throw new Error(
      `Cannot ${opts.purpose} ${source.modelPath}: it has no vocabulary; pass --tokenizer <tokenizer.bin>`,
    );
  }
  return { source, model, tokenizer: new Tokenizer(model.tokenizer) };
}

/**
 * A progress callback for the weights' upload to the device, drawn (on a terminal only) after
 * the reading bar: on a big model the upload takes as long as the read.
 */
export function uploadProgress(modelPath: string): (bytes: number, total: number) => void {
  let bar: ProgressBar | undefined;
  return (bytes, total) => {
    bar ??= new ProgressBar(`uploading ${modelPath.split("/").pop()}`, total, 0);
    if (bytes >= total) bar.finish(bytes);
    else bar.update(bytes);
  };
}

/** What a command's settings say of the model it opens, and of the engine its bytes are for. */
export interface ModelSettings {
  readonly model: string;
  readonly modelsDir?: string;
  readonly tokenizer?: string;
  readonly contextLength?: number;
  readonly backend: BackendChoice;
  readonly kvMemory?: number;
}

/** openModel for a command's settings: the weights read where the backend's engine wants them. */
export function openModelFor(
  s: ModelSettings,
  purpose: string,
  onProgress?: OpenModelOptions["onProgress"],
  placeTensors?: PlaceTensors,
): ReturnType<typeof openModel> {
  return openModel(s.model, {
    modelsDir: s.modelsDir,
    tokenizer: s.tokenizer,
    contextLength: s.contextLength,
    purpose,
    ...(onProgress ? { onProgress } : {}),
    allocate: modelAllocator(s.backend),
    placeTensors: placeTensors ?? modelPlacement(s.backend, s.kvMemory),
  });
}
