/**
 * `--models-config FILE`: the models a server of several models serves, each with settings of
 * its own, as llama-swap's YAML or Ollama's Modelfile give them. Each setting is a `serve` flag
 * read through the same table as the flags (settings.ts, its rows marked `perModel`), so a
 * value means here what it means on the command line:
 *
 * ```yaml
 * models:
 *   qwen:                        # the name requests use ("model": "qwen")
 *     model: /models/qwen3-8b-q4_k_m.gguf   # a path, https:// URL or known name, as --model
 *     aliases: [qwen3]           # more names, as --served-model-name alias=qwen
 *     context-length: 8192       # any of PER_MODEL_FLAGS
 *     kv-memory: 512MiB
 *     keep-alive: 30m
 *     sampling: { temperature: 0.7, top_p: 0.8, top_k: 20 }   # a request's defaults
 * ```
 *
 * JSON is YAML too, so a `.json` file of the same shape works.
 */
import { parse as parseYaml } from "@std/yaml/parse";
import { z } from "zod";
import type { Config } from "./config.ts";
import { flagOf, type PerModelSetting, row, SETTING_NAMES, type SettingName } from "./settings.ts";
import { SAMPLING_FIELDS } from "../http/schemas.ts";
import type { SamplingDefaults } from "../core/generation.ts";

/** The flags a model's entry may set, with the setting each is: the table's `perModel` rows. */
export const PER_MODEL_FLAGS: Readonly<Record<string, PerModelSetting>> = Object.fromEntries(
  SETTING_NAMES.filter((n) => row(n).perModel).map((n) => [flagOf(n), n as PerModelSetting]),
);

/** One model of the file, validated. */
export interface ModelsFileEntry {
  readonly name: string;
  /** What --model would take. */
  readonly model: string;
  readonly aliases: readonly string[];
  /** Its settings, in place of the server's. */
  readonly settings: Partial<Pick<Config, PerModelSetting>>;
  readonly sampling?: SamplingDefaults;
}

const Entry = z.object({
  model: z.string().min(1, "a model's entry needs its file: model: <path, URL or name>"),
  aliases: z.array(z.string().min(1)).default([]),
  sampling: z.strictObject(SAMPLING_FIELDS).partial().optional(),
  ...Object.fromEntries(
    Object.keys(PER_MODEL_FLAGS).map((f) => [f, z.union([z.string(), z.number()]).optional()]),
  ),
}).strict();

const File = z.strictObject({
  models: z.record(z.string().min(1), Entry).refine((m) => Object.keys(m).length > 0, {
    message: "names no model",
  }),
});

/** Reads and validates the file; throws an Error naming the file and every problem in it. */
export function readModelsConfig(path: string): ModelsFileEntry[] {
  let text: string;
  try {
    text = Deno.readTextFileSync(path);
  } catch (e) {
    throw new Error(`--models-config ${path}: cannot read it (${(e as Error).message})`);
  }
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (e) {
    throw new Error(`--models-config ${path}: not YAML or JSON: ${(e as Error).message}`);
  }
  const parsed = File.safeParse(raw);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) =>
      `${i.path.join(".") || "(the file)"}: ${i.message}`
    );
    throw new Error(`--models-config ${path}:\n  ${lines.join("\n  ")}`);
  }
  const problems: string[] = [];
  const entries = Object.entries(parsed.data.models).map(([name, e]) => {
    const settings: Record<string, unknown> = {};
    for (const [flag, setting] of Object.entries(PER_MODEL_FLAGS)) {
      const v = (e as Record<string, unknown>)[flag];
      if (v === undefined) continue;
      // As the flag would be typed: the table's schema reads strings.
      const r = row(setting as SettingName).schema.safeParse(String(v));
      if (r.success) settings[setting] = r.data;
      else {problems.push(
          `models.${name}.${flag}: ${r.error.issues[0]!.message} (received ${JSON.stringify(v)})`,
        );}
    }
    const s = e.sampling;
    const sampling: SamplingDefaults | undefined = s === undefined ? undefined : {
      ...(s.temperature === undefined ? {} : { temperature: s.temperature }),
      ...(s.top_k === undefined ? {} : { topK: s.top_k }),
      ...(s.top_p === undefined ? {} : { topP: s.top_p }),
      ...(s.min_p === undefined ? {} : { minP: s.min_p }),
    };
    return {
      name,
      model: e.model,
      aliases: e.aliases,
      settings,
      ...(sampling ? { sampling } : {}),
    };
  });
  if (problems.length > 0) throw new Error(`--models-config ${path}:\n  ${problems.join("\n  ")}`);
  return entries;
}
