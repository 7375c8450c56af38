/**
 * `deno task plan`: the layouts of a model over some hosts, predicted by the cost model
 * (lib/cluster/plan_*.ts) and printed as a table, best first; `--calibrate` measures this
 * machine for the cost model first (plan_calibrate.ts).
 */
import { parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";
import type { Settings } from "./settings.ts";
import { modelBytes, type PlanModel, planModel } from "../cluster/plan_model.ts";
import { parseHostList, parseHostsFile, type PlanCluster } from "../cluster/plan_hosts.ts";
import {
  type Calibration,
  CALIBRATION_OUT,
  parseCalibration,
  SHIPPED_CALIBRATION,
} from "../cluster/plan_calibration.ts";
import { type LayoutPlan, planLayouts, type PlanOptions } from "../cluster/plan_layouts.ts";
import { formatBytes } from "../util/byte_size.ts";
import { mirrorDirFromEnv, resolveModelsDir } from "../source/model_source.ts";
import { PLAN_SHAPES } from "../cluster/plan_model.ts";

/** A shape, a path, or a name whose .gguf is in the models directory or the mirror. */
async function modelSpec(spec: string): Promise<string> {
  if (PLAN_SHAPES[spec] !== undefined || spec.includes("/") || spec.endsWith(".gguf")) return spec;
  for (const dir of [resolveModelsDir(), mirrorDirFromEnv()]) {
    if (dir === undefined) continue;
    const path = `${dir}/${spec}.gguf`;
    if (await Deno.stat(path).then((i) => i.isFile, () => false)) return path;
  }
  return spec;
}

/** The hosts and link of the flags: a hosts file (its link wins) or the compact list. */
export async function clusterOf(s: Settings): Promise<PlanCluster> {
  if (s.hosts === undefined) {
    throw new Error("--hosts is required: e.g. --hosts 4x16GiB@1thr, or a hosts file (.json)");
  }
  const flagLink = { bandwidthBytesPerSecond: s.bandwidth, latencySeconds: s.latency };
  if (!s.hosts.endsWith(".json")) return { hosts: parseHostList(s.hosts), link: flagLink };
  let text: string;
  try {
    text = await Deno.readTextFile(s.hosts);
  } catch (e) {
    throw new Error(`Cannot read hosts file ${s.hosts}: ${(e as Error).message}`);
  }
  const f = parseHostsFile(text, s.hosts);
  return { hosts: f.hosts, link: f.link ?? flagLink };
}

async function calibrationOf(path: string | undefined): Promise<Calibration> {
  if (path === undefined) return SHIPPED_CALIBRATION;
  let json: unknown;
  try {
    json = JSON.parse(await Deno.readTextFile(path));
  } catch (e) {
    throw new Error(`Cannot read calibration ${path}: ${(e as Error).message}`);
  }
  return parseCalibration(json, path);
}

/** The plan's options from the flags. */
export function planOptions(s: Settings): PlanOptions {
  return {
    sequences: s.sequences,
    context: s.context,
    promptTokens: s.promptTokens,
    kvElementBytes: s.kvDtype === "f32" ? 4 : 2,
    processOverheadBytes: s.processOverhead,
    head: s.headStage,
  };
}

const fixed = (x: number) => x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2);
const seconds = (x: number) => x >= 1 ? `${x.toFixed(1)} s` : `${Math.round(x * 1000)} ms`;

/**
 * The plans as a Markdown table: the best `top` that fit, then the best of each TP degree not
 * among them (why more ranks lose), then as many that do not fit.
 */
export function planTable(plans: readonly LayoutPlan[], o: PlanOptions, top: number): string {
  const name = (p: LayoutPlan) => `${p.layout.tp}×${p.layout.pp}×${p.layout.dp}`;
  const fitting = plans.filter((p): p is Extract<LayoutPlan, { fits: true }> => p.fits);
  const fit = fitting.slice(0, top);
  for (const p of fitting) {
    if (!fit.some((f) => f.layout.tp === p.layout.tp)) fit.push(p);
  }
  const refused = plans.filter((p) => !p.fits).slice(0, top);
  const lines = [
    `| TP×PP×DP | hosts | layers per stage | tok/s at 1 | tok/s at ${o.sequences} | first token | most memory | why |`,
    "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |",
    ...fit.map((p) => {
      const r = p.prediction;
      return `| ${name(p)} | ${p.hostsUsed} | ${r.split.join("+")} | ${
        fixed(r.tokensPerSecond1)
      } | ${fixed(r.tokensPerSecondN)} | ${seconds(r.ttftSeconds)} | ${
        formatBytes(r.peak.bytes)
      } of ${formatBytes(r.peak.host.memoryBytes)} | ${p.why} |`;
    }),
    ...refused.map((p) => `| ${name(p)} | ${p.hostsUsed} | | | | | | ${p.why} |`),
  ];
  if (fit.length === 0) lines.push("", "No layout fits these hosts.");
  return lines.join("\n");
}

function describe(model: PlanModel, cluster: PlanCluster, cal: string, o: PlanOptions): string {
  const { bandwidthBytesPerSecond: bw, latencySeconds: lat } = cluster.link;
  const link = bw === Infinity ? "loopback" : `${(bw * 8 / 1e9).toPrecision(3)} Gbit/s`;
  return `model ${model.name}: ${model.layerBytes.length} layers, ${
    formatBytes(modelBytes(model))
  } of weights; ${cluster.hosts.length} hosts; link ${link}, ${
    lat * 1000
  } ms; ${o.sequences} sequences of ${o.context} positions, prompt ${o.promptTokens}; calibration ${cal}`;
}

export async function planCommand(argv: string[]): Promise<number> {
  if (printInfo("plan", argv)) return 0;
  let s: Settings;
  try {
    s = parseSettings("plan", argv);
  } catch (e) {
    console.error((e as Error).message);
    return 2;
  }
  try {
    if (s.calibrate) {
      const { calibrate } = await import("./plan_calibrate.ts");
      const path = s.calibration ?? CALIBRATION_OUT;
      await calibrate(s.model, path);
      s = { ...s, calibration: path };
    }
    const [model, cluster, cal] = await Promise.all([
      planModel(await modelSpec(s.model)),
      clusterOf(s),
      calibrationOf(s.calibration),
    ]);
    const o = planOptions(s);
    console.log(describe(model, cluster, s.calibration ?? "shipped", o) + "\n");
    console.log(planTable(planLayouts(model, cluster, cal, o, s.rankBy), o, s.top));
    return 0;
  } catch (e) {
    console.error((e as Error).message);
    return 2;
  }
}
