/**
 * What a model file is, read from its header alone (for `deno task models`): format,
 * architecture and quantization, without loading the weights.
 */
import { ggmlTypeName, type GgufHeader, readGgufHeaderOf } from "./gguf.ts";
import { readFully } from "../util/read_file.ts";
import { detectModelFormat } from "./load_model.ts";
import { fileTypeName } from "./file_type.ts";

export interface ModelFileInfo {
  /** `gguf`, `llama2c`, or `other` (a tokenizer, or not a model). */
  readonly format: "gguf" | "llama2c" | "other";
  readonly architecture?: string;
  /**
   * The file type llama-quantize wrote (`general.file_type`, else the tensor type holding most
   * of the weights), then the other tensor types present, e.g. `Q8_0 (+F16, F32)` or
   * `Q4_K_M (+Q8_0, Q5_0, Q4_K, Q6_K, F32)`; llama2.c checkpoints are F32.
   */
  readonly quantization?: string;
  /** Weights in the file's tensors (GGUF), e.g. 260K for stories260K. */
  readonly parameters?: number;
  /** The context a GGUF file declares (`<arch>.context_length`). */
  readonly contextLength?: number;
  /** Why the header could not be read, for a file that looks like a model but is broken. */
  readonly problem?: string;
}

/** Reads just enough of `path` to describe it. */
export async function describeModelFile(path: string): Promise<ModelFileInfo> {
  using file = await Deno.open(path, { read: true });
  const size = (await file.stat()).size;
  const head = await readAt(file, Math.min(size, 64));
  const format = detectModelFormat(head);
  if (format === "llama2c") return { format, architecture: "llama", quantization: "F32" };
  if (format !== "gguf") return { format: "other" };
  try {
    return { format, ...summarize(await readGgufHeaderOf(file, size, path)) };
  } catch (e) {
    return { format, problem: e instanceof Error ? e.message : String(e) };
  }
}

function summarize(
  h: GgufHeader,
): { architecture?: string; quantization?: string; parameters?: number; contextLength?: number } {
  const arch = h.metadata.get("general.architecture")?.value;
  const context = h.metadata.get(`${arch}.context_length`)?.value;
  const elements = new Map<string, number>();
  for (const t of h.tensorInfos) {
    const name = ggmlTypeName(t.typeId).toUpperCase();
    const n = t.dims.reduce((a, b) => a * b, 1);
    elements.set(name, (elements.get(name) ?? 0) + n);
  }
  const byElements = [...elements.entries()].sort((a, b) => b[1] - a[1]).map(([t]) => t);
  // The file type first (Q4_K_M), as llama.cpp and Ollama name files; else the commonest type.
  const named = fileTypeName(h.metadata.get("general.file_type")?.value) ?? byElements[0];
  const others = byElements.filter((t) => t !== named);
  const quantization = named === undefined
    ? undefined
    : others.length === 0
    ? named
    : `${named} (+${others.join(", ")})`;
  return {
    architecture: typeof arch === "string" ? arch : undefined,
    quantization,
    parameters: [...elements.values()].reduce((a, b) => a + b, 0),
    ...(typeof context === "number" || typeof context === "bigint"
      ? { contextLength: Number(context) }
      : {}),
  };
}

async function readAt(file: Deno.FsFile, n: number): Promise<Uint8Array> {
  const out = new Uint8Array(n);
  return out.subarray(0, await readFully(file, 0, out));
}
