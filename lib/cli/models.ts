/** `deno task models`: the model files the server can find, by the name `--model` takes. */
import { parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";
import { describeModelFile } from "../model/model_info.ts";
import { listLocalModelFiles } from "../source/model_source.ts";
import { describeKnownModels } from "../source/model_source.ts";
import { formatBytes } from "../util/byte_size.ts";

/** The parsed flags, or an error message. */
export function parseModelsArgs(argv: readonly string[]): { modelsDir?: string } | string {
  try {
    const { modelsDir } = parseSettings("models", argv);
    return modelsDir === undefined ? {} : { modelsDir };
  } catch (e) {
    return (e as Error).message;
  }
}

/** Renders rows as a fixed-width table with a header line. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: readonly string[]) =>
    r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join("  ").trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}

export async function modelsCommand(argv: string[]): Promise<number> {
  if (printInfo("models", argv)) return 0;
  const parsed = parseModelsArgs(argv);
  if (typeof parsed === "string") {
    console.error(parsed);
    return 2;
  }
  const { modelsDir, mirrorDir, files } = await listLocalModelFiles(parsed);
  const rows: string[][] = [];
  const stemCount = new Map<string, number>();
  for (const f of files) stemCount.set(f.stem, (stemCount.get(f.stem) ?? 0) + 1);
  for (const f of files) {
    const info = await describeModelFile(f.path);
    const format = f.kind === "tokenizer"
      ? "tokenizer"
      : info.format === "llama2c"
      ? "llama2.c"
      : info.format === "gguf"
      ? "GGUF"
      : "unknown";
    // The name --model takes: the stem, or the file name where two files share a stem.
    const unique = f.kind === "model" && stemCount.get(f.stem) === 1;
    rows.push([
      unique ? f.stem : f.name,
      f.place,
      formatBytes(f.bytes),
      format,
      info.architecture ?? (info.problem ? `unreadable: ${info.problem}` : "-"),
      info.quantization ?? "-",
    ]);
  }
  console.log(`models directory: ${modelsDir}`);
  console.log(`mirror:           ${mirrorDir ?? "(MODEL_MIRROR unset)"}`);
  console.log(`known names:      ${describeKnownModels()}\n`);
  console.log(
    rows.length === 0
      ? "no .gguf or .bin files in either place"
      : table(["name", "where", "size", "format", "architecture", "quantization"], rows),
  );
  return 0;
}
