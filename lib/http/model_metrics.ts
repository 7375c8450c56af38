/**
 * /metrics of a server with several models: each loaded model's app renders its own registry,
 * and these are merged into one exposition with a `model` label on every sample (each family's
 * HELP and TYPE once, as Prometheus requires), followed by the pool's own families.
 */
import { formatValue } from "./metrics.ts";
import type { ModelStatus } from "./model_directory.ts";

interface Family {
  help?: string;
  type?: string;
  readonly samples: string[];
}

/** The front's own exposition (unlabelled) and each model's, merged family by family. */
export function mergeModelMetrics(
  front: string,
  models: readonly { readonly model: string; readonly text: string }[],
): string {
  const families = new Map<string, Family>();
  const family = (name: string) => {
    let f = families.get(name);
    if (f === undefined) families.set(name, f = { samples: [] });
    return f;
  };
  const add = (text: string, model?: string) => {
    let current: string | undefined;
    for (const line of text.split("\n")) {
      if (line === "") continue;
      const meta = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(line);
      if (meta) {
        const f = family(current = meta[2]!);
        if (meta[1] === "HELP") f.help ??= meta[3];
        else f.type ??= meta[3];
        continue;
      }
      if (line.startsWith("#")) continue;
      const name = /^[^\s{]+/.exec(line)![0];
      // Histogram and summary samples (_bucket, _sum, _count) belong to the family above them.
      const owner = current !== undefined && name.startsWith(current) ? current : name;
      family(owner).samples.push(model === undefined ? line : withLabel(line, name, model));
    }
  };
  add(front);
  for (const m of models) add(m.text, m.model);
  const out: string[] = [];
  for (const [name, f] of families) {
    if (f.help !== undefined) out.push(`# HELP ${name} ${f.help}`);
    if (f.type !== undefined) out.push(`# TYPE ${name} ${f.type}`);
    out.push(...f.samples);
  }
  return out.join("\n") + "\n";
}

function withLabel(line: string, name: string, model: string): string {
  const label = `model="${escapeLabel(model)}"`;
  const rest = line.slice(name.length);
  return rest.startsWith("{")
    ? `${name}{${label}${rest.startsWith("{}") ? rest.slice(1) : "," + rest.slice(1)}`
    : `${name}{${label}}${rest}`;
}

function escapeLabel(v: string): string {
  return v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

/** The pool's families: loads, load time, failures, evictions, resident bytes, loaded or not. */
export function poolMetrics(status: readonly ModelStatus[]): string {
  const rows: [string, string, string, (s: ModelStatus) => number][] = [
    ["llm_model_loads_total", "counter", "Loads of the model that finished", (s) => s.loads],
    [
      "llm_model_load_failures_total",
      "counter",
      "Loads of the model that failed",
      (s) => s.loadFailures,
    ],
    [
      "llm_model_load_seconds_total",
      "counter",
      "Seconds spent in the model's finished loads",
      (s) => s.loadSeconds,
    ],
    [
      "llm_model_evictions_total",
      "counter",
      "Times the model was unloaded to make room for another",
      (s) => s.evictions,
    ],
    [
      "llm_model_resident_bytes",
      "gauge",
      "Memory the model holds (weights and KV cache; while loading, what it claimed)",
      (s) => s.bytes,
    ],
    [
      "llm_model_loaded",
      "gauge",
      "1 while the model is loaded",
      (s) => s.phase === "loaded" ? 1 : 0,
    ],
  ];
  const out: string[] = [];
  for (const [name, type, help, value] of rows) {
    out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const s of status) {
      out.push(`${name}{model="${escapeLabel(s.name)}"} ${formatValue(value(s))}`);
    }
  }
  return out.join("\n") + "\n";
}
