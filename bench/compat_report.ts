/**
 * The compat files against llama.cpp's fixtures on both engines, as one table per run (what the
 * compat tests assert, with every number shown): for each file and backend, whether it loads,
 * whether prompt ids equal llama.cpp's for every fixture prompt, greedy steps compared (up to
 * each prompt's first llama.cpp margin <= 0.5 nats, at most --steps) and equal, and the max
 * |Δlogprob| of llama.cpp's top-2 ids (step 0 of every prompt and every compared step).
 *
 * `MODEL_MIRROR=../shared/models deno run -A bench/compat_report.ts [--steps 32] [--only cpu|webgpu]`
 */
import { parseArgs } from "@std/cli/parse-args";
import { acquireGpu } from "../kernels/webgpu/device.ts";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import type { Engine } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compareGreedy, COMPAT_FILES, compatPath, readFixture } from "../tests/harness/compat.ts";
import { markdownTable } from "./markdown_table.ts";

const f = parseArgs(Deno.args, { string: ["steps", "only"] });
const steps = Number(f.steps ?? "32");
const backends = (f.only ?? "cpu,webgpu").split(",");
const gpu = backends.includes("webgpu") ? await acquireGpu() : undefined;
const rows: string[][] = [];
for (const stem of COMPAT_FILES) {
  for (const backend of backends) {
    const t0 = performance.now();
    let engine: Engine | undefined;
    try {
      const [model, fx] = await Promise.all([loadModel(compatPath(stem)), readFixture(stem)]);
      const tok = new Tokenizer(model.tokenizer!);
      const idsEqual = fx.prompts.filter((p) =>
        JSON.stringify(tok.encode(p.prompt)) === JSON.stringify(p.prompt_ids)
      ).length;
      const kv = { numBlocks: 36, blockSize: 16 };
      engine = backend === "cpu"
        ? new CpuEngine(model.config, model.weights, kv)
        : await WebGpuEngine.create(model.config, model.weights, kv, { gpu: gpu!, maxSeqs: 8 });
      const r = await compareGreedy(engine, fx.prompts, { steps });
      const compared = r.reduce((n, x) =>
        n + x.compared, 0);
      const equal = r.reduce((n, x) => n + x.equal, 0);
      rows.push([
        stem,
        backend,
        "yes",
        `${idsEqual}/${fx.prompts.length}`,
        `${equal}/${compared}`,
        Math.max(...r.map((x) => x.maxLogprobDelta)).toFixed(3),
        Math.max(...r.map((x) => x.step0LogprobDelta)).toFixed(3),
        ((performance.now() - t0) / 1000).toFixed(1),
      ]);
    } catch (e) {
      rows.push([stem, backend, `no: ${(e as Error).message.split("\n")[0]}`, "", "", "", "", ""]);
    } finally {
      engine?.dispose();
    }
    console.error(rows.at(-1)!.join(" | "));
  }
}
console.log(
  markdownTable([
    "file",
    "backend",
    "loads",
    "prompt ids equal",
    "greedy steps equal / compared",
    "max abs Δlogprob",
    "step-0 max abs Δlogprob",
    "seconds",
  ], rows),
);
