import { describeModelFile } from "../model/model_info.ts";
import type { GenerationBackend } from "../core/generation.ts";
import { sha256OfText } from "../util/sha256.ts";

/**
 * What Ollama's model listings (/api/tags, /api/ps, /api/show) say of a served model, from its
 * file: size, modification time, format, architecture, parameters and quantization. Read once
 * (the header only), on the first listing.
 */

export interface OllamaDetails {
  readonly parent_model: string;
  readonly format: string;
  readonly family: string;
  readonly families: string[];
  readonly parameter_size: string;
  readonly quantization_level: string;
}

export interface ModelFacts {
  readonly size: number;
  readonly modifiedAt: string;
  /**
   * Ollama's digest names the model's content; here the sha256 of the file's path, size and
   * modification time, which changes when the file does (hashing gigabytes per listing would
   * not do).
   */
  readonly digest: string;
  readonly details: OllamaDetails;
  readonly parameters?: number;
}

/** Ollama's way of writing a parameter count: 8.0B, 494.03M, 260.00K. */
export function parameterSize(n: number | undefined): string {
  if (n === undefined || n === 0) return "";
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(2)}M`;
  return `${(n / 1e3).toFixed(2)}K`;
}

/** The facts of the model at `path` (none known without a path: a test's fake backend). */
export async function readModelFacts(path: string | undefined): Promise<ModelFacts> {
  if (path === undefined) {
    return {
      size: 0,
      modifiedAt: new Date(0).toISOString(),
      digest: sha256OfText(""),
      details: details("", "", "", undefined),
    };
  }
  const stat = await Deno.stat(path);
  const info = await describeModelFile(path);
  const modified = (stat.mtime ?? new Date(0)).toISOString();
  return {
    size: stat.size,
    modifiedAt: modified,
    digest: sha256OfText(`${path}\n${stat.size}\n${modified}`),
    details: details(
      info.format,
      info.architecture ?? "",
      info.quantization ?? "",
      info.parameters,
    ),
    ...(info.parameters !== undefined ? { parameters: info.parameters } : {}),
  };
}

function details(format: string, arch: string, quant: string, params?: number): OllamaDetails {
  return {
    parent_model: "",
    format,
    family: arch,
    families: arch === "" ? [] : [arch],
    parameter_size: parameterSize(params),
    // "Q8_0 (+F16, F32)": Ollama's field holds the file type alone.
    quantization_level: quant.split(" ")[0] ?? "",
  };
}

/** A model as /api/tags lists it. */
export function tagsEntry(name: string, f: ModelFacts) {
  return {
    name,
    model: name,
    modified_at: f.modifiedAt,
    size: f.size,
    digest: f.digest,
    details: f.details,
  };
}

/**
 * A model as /api/ps lists it: loaded for as long as the server runs, so `expires_at` is Go's
 * zero time (Ollama's "no expiry" is a date far off; neither is a real deadline here), and
 * `size_vram` is not measured (0).
 */
export function psEntry(name: string, f: ModelFacts) {
  return { ...tagsEntry(name, f), expires_at: "0001-01-01T00:00:00Z", size_vram: 0 };
}

/** /api/show: the template, the details, the architecture's numbers, what it can do. */
export function showBody(
  backend: GenerationBackend,
  path: string | undefined,
  f: ModelFacts,
) {
  const arch = f.details.family;
  return {
    license: "",
    modelfile: path === undefined ? "" : `FROM ${path}\n`,
    parameters: "",
    template: backend.chatTemplate ?? "",
    system: "",
    details: f.details,
    model_info: {
      ...(arch === "" ? {} : { "general.architecture": arch }),
      ...(f.parameters !== undefined ? { "general.parameter_count": f.parameters } : {}),
      ...(arch === "" ? {} : { [`${arch}.context_length`]: backend.contextLength }),
    },
    // Every model calls tools here: with its template's syntax, or the generic format.
    capabilities: ["completion", "tools"],
    modified_at: f.modifiedAt,
  };
}
