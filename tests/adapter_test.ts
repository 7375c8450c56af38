import { assert, assertEquals } from "@std/assert";
import {
  chooseRasterizerThreads,
  INLINE_RASTERIZER_BYTES,
  laneSubgroupsFit,
  RASTERIZER_THREADS_ENV,
} from "../kernels/webgpu/adapter.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { stepMatrixBytes } from "../lib/model/weights.ts";
import { modelFile } from "./harness/model_files.ts";

/** An environment of its own, so that no test changes what this process's driver reads. */
function fakeEnv(initial: Record<string, string> = {}) {
  const vars = new Map(Object.entries(initial));
  return {
    vars,
    get: (k: string) => vars.get(k),
    set: (k: string, v: string) => void vars.set(k, v),
    delete: (k: string) => void vars.delete(k),
  };
}

Deno.test("a model whose matrices fit INLINE_RASTERIZER_BYTES runs a software rasterizer's workgroups inline, a larger one keeps the thread pool", () => {
  const small = fakeEnv();
  assertEquals(chooseRasterizerThreads(INLINE_RASTERIZER_BYTES, small), "inline");
  assertEquals(small.vars.get(RASTERIZER_THREADS_ENV), "0");
  const large = fakeEnv();
  assertEquals(chooseRasterizerThreads(INLINE_RASTERIZER_BYTES + 1, large), "pool");
  assertEquals(large.vars.has(RASTERIZER_THREADS_ENV), false);
});

Deno.test("LP_NUM_THREADS set by the user is left as it is and decides", () => {
  for (const [value, want] of [["2", "pool"], ["0", "inline"]] as const) {
    const env = fakeEnv({ [RASTERIZER_THREADS_ENV]: value });
    assertEquals(chooseRasterizerThreads(0, env), want, value);
    assertEquals(env.vars.get(RASTERIZER_THREADS_ENV), value);
  }
});

Deno.test("stepMatrixBytes counts every layer's projections and the classifier", async () => {
  const { weights } = await loadModel(modelFile("stories260K.bin"));
  const hand = weights.layers.reduce(
    (n, l) =>
      n +
      [l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown].reduce((m, t) => m + t.data.byteLength, 0),
    0,
  ) + weights.output.data.byteLength;
  assertEquals(stepMatrixBytes(weights), hand);
  // stories260K: 5 layers of q, o (64 x 64), k, v (4 KV heads of 8: 32 x 64), gate, up, down
  // (172 x 64), and a 512 x 64 classifier, all f32.
  assertEquals(hand, 4 * (5 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 172) + 512 * 64));
});

/** Runs `body` (TypeScript, top-level await) in a fresh Deno with `env`; returns its last line as JSON. */
async function inChild(body: string, env: Record<string, string>): Promise<unknown> {
  const dir = await Deno.makeTempDir({ prefix: "adapter_test_" });
  const file = `${dir}/child.ts`;
  const root = new URL("..", import.meta.url).href;
  await Deno.writeTextFile(file, body.replaceAll("ROOT/", root));
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-all",
        "--config",
        new URL("../deno.json", import.meta.url).pathname,
        "--quiet",
        file,
      ],
      env,
      clearEnv: true,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout).trim();
    if (!out.success) {
      throw new Error(`child exited ${out.code}: ${new TextDecoder().decode(out.stderr)}`);
    }
    return JSON.parse(text.split("\n").at(-1)!);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

const ENGINE_CHILD = `
import { WebGpuEngine } from "ROOT/kernels/webgpu/webgpu_engine.ts";
import { loadModel } from "ROOT/lib/model/load_model.ts";
const model = await loadModel(${JSON.stringify(modelFile("stories260K.bin"))});
const engine = await WebGpuEngine.create(model.config, model.weights, { numBlocks: 4, blockSize: 16 });
console.log(JSON.stringify({ inline: engine.gpu.inlineDispatch, env: Deno.env.get("LP_NUM_THREADS") ?? null }));
engine.dispose();
`;

Deno.test("the WebGPU engine runs stories260K inline (LP_NUM_THREADS=0 while its adapter loads), unless the user set the variable", async () => {
  const env = { ...Deno.env.toObject() };
  delete env[RASTERIZER_THREADS_ENV];
  // Inline, and the variable gone again once the driver read it: children choose for themselves.
  assertEquals(await inChild(ENGINE_CHILD, env), { inline: true, env: null });
  assertEquals(
    await inChild(ENGINE_CHILD, { ...env, [RASTERIZER_THREADS_ENV]: "2" }),
    { inline: false, env: "2" },
  );
});

Deno.test("once this process has asked for an adapter, nothing is changed: the driver has read the variable", async () => {
  const env = { ...Deno.env.toObject() };
  delete env[RASTERIZER_THREADS_ENV];
  const body = `
import { chooseRasterizerThreads, requestDefaultAdapter } from "ROOT/kernels/webgpu/adapter.ts";
await requestDefaultAdapter();
const vars = new Map();
const choice = chooseRasterizerThreads(0, { get: (k) => vars.get(k), set: (k, v) => vars.set(k, v), delete: (k) => vars.delete(k) });
console.log(JSON.stringify({ choice, set: vars.size, env: Deno.env.get("LP_NUM_THREADS") ?? null }));
`;
  assertEquals(await inChild(body, env), { choice: "fixed", set: 0, env: null });
});

Deno.test("laneSubgroupsFit() takes subgroups where a CPU rasterizer's are always the lane kernel's 8 lanes", () => {
  const info = (description: string, min: number, max: number, fallback = false) =>
    ({
      description,
      subgroupMinSize: min,
      subgroupMaxSize: max,
      isFallbackAdapter: fallback,
      vendor: "",
      architecture: "",
      device: "",
    }) satisfies GPUAdapterInfo;
  assert(
    laneSubgroupsFit(info("llvmpipe (LLVM 15.0.6, 256 bits)", 8, 8, true)),
    "lavapipe through Vulkan",
  );
  assert(
    !laneSubgroupsFit(info("llvmpipe (LLVM 15.0.6, 256 bits)", 4, 128, true)),
    "llvmpipe through OpenGL ES",
  );
  assert(
    !laneSubgroupsFit(info("llvmpipe (LLVM 15.0.6, 512 bits)", 16, 16, true)),
    "16 lanes to a subgroup (512-bit vectors)",
  );
  assert(!laneSubgroupsFit(info("NVIDIA H200", 32, 32)), "a real GPU: split layout");
});
