import { assertFiniteWeights } from "./finite_weights.ts";
import { readFileWithProgress, readHead, type ReadProgress } from "../util/read_file.ts";
import { describeBytes, type PlaceTensors, readGguf } from "./gguf.ts";
import { assertLoadable, ggufToModel } from "./gguf_model.ts";
import {
  LLAMA2C_HEADER_BYTES,
  llama2cHeader,
  llama2cHeaderProblem,
  parseLlama2cCheckpoint,
} from "./llama2c_checkpoint.ts";
import { parseLlama2cTokenizer } from "../tokenizer/llama2c_tokenizer.ts";
import type { Model } from "./weights.ts";

/** Options for {@link loadModel}. */
export interface LoadModelOptions {
  /** A llama2.c `tokenizer.bin`; replaces the vocabulary of a GGUF, and is the only source of one for a `.bin`. */
  tokenizerPath?: string;
  /** Replaces the context length the file declares (e.g. a converter wrote a smaller one than the model was trained with). */
  contextLength?: number;
  /** Progress of reading the weights, for a start-up progress bar. */
  onProgress?: ReadProgress;
  /**
   * Where the weights' bytes go (default: a new Uint8Array): the CPU engine passes its shared
   * WebAssembly memory, so the file is read into the one place its threads read it from.
   */
  allocate?: (bytes: number) => Uint8Array;
  /** For a GGUF: a view per tensor instead (see PlaceTensors); `allocate` where it declines. */
  placeTensors?: PlaceTensors;
}

/** The file formats loadModel recognises. */
export type ModelFormat = "gguf" | "llama2c";

const GGUF_MAGIC = [0x47, 0x47, 0x55, 0x46]; // "GGUF"

/**
 * Tells a model file's format from its first bytes: the magic "GGUF", or a llama2.c header
 * of 7 plausible int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, ±vocab_size, seq_len).
 * Returns undefined for anything else.
 */
export function detectModelFormat(head: Uint8Array): ModelFormat | undefined {
  if (head.byteLength >= 4 && GGUF_MAGIC.every((b, i) => head[i] === b)) return "gguf";
  if (head.byteLength < LLAMA2C_HEADER_BYTES) return undefined;
  return llama2cHeaderProblem(llama2cHeader(head)) === undefined ? "llama2c" : undefined;
}

/**
 * Loads a model from a GGUF file or a llama2.c checkpoint, telling them apart by their first
 * bytes. The file's bytes are held in memory once (tensors are views of them).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const model = await loadModel("stories260K.bin", { tokenizerPath: "tok512.bin" });
 * const same = await loadModel("stories260K.gguf", { contextLength: 512 });
 * // One model in two formats: the same shape, and both carry its 512-token vocabulary.
 * assertEquals(same.config.nLayers, model.config.nLayers);
 * assertEquals([same.tokenizer?.tokens.length, model.tokenizer?.tokens.length], [512, 512]);
 * ```
 */
export async function loadModel(path: string, opts: LoadModelOptions = {}): Promise<Model> {
  if (
    opts.contextLength !== undefined &&
    !(Number.isInteger(opts.contextLength) && opts.contextLength > 0)
  ) {
    throw new Error(
      `Cannot load model ${path}: contextLength must be a positive integer, received ${opts.contextLength}`,
    );
  }
  const head = await readFileHead(path, LLAMA2C_HEADER_BYTES);
  const format = detectModelFormat(head);
  let model: Model;
  if (format === "gguf") {
    // Every blocker is reported from the header, before gigabytes of weights are read.
    const gguf = await readGguf(
      path,
      opts.onProgress,
      (h) => assertLoadable(h, path),
      opts.allocate,
      opts.placeTensors,
    );
    model = ggufToModel(gguf, path);
  } else if (format === "llama2c") {
    const { config, weights } = parseLlama2cCheckpoint(
      await readFileWithProgress(path, opts.onProgress, opts.allocate),
      path,
    );
    model = { config, weights, source: path };
  } else {
    const what = head.byteLength < LLAMA2C_HEADER_BYTES
      ? ` (only ${head.byteLength} bytes long)`
      : "";
    throw new Error(
      `Cannot load model ${path}: it is neither a GGUF file nor a llama2.c checkpoint${what}: first bytes ${
        describeBytes(head.subarray(0, 8))
      }`,
    );
  }
  assertFiniteWeights(model.weights, path);
  if (opts.tokenizerPath !== undefined) {
    const tokenizer = parseLlama2cTokenizer(
      await Deno.readFile(opts.tokenizerPath),
      model.config.vocabSize,
      opts.tokenizerPath,
    );
    model = { ...model, tokenizer };
  }
  if (opts.contextLength !== undefined) {
    model = { ...model, config: { ...model.config, contextLength: opts.contextLength } };
  }
  return model;
}

async function readFileHead(path: string, n: number): Promise<Uint8Array> {
  using file = await Deno.open(path, { read: true });
  return await readHead(file, n);
}
