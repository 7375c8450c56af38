import { assert, assertEquals } from "@std/assert";
import { deadline } from "@std/async/deadline";
import { WebGpuEngine } from "../kernels/webgpu/webgpu_engine.ts";
import { createEngine, planKv, resolveBackend } from "../lib/compose/engine_factory.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { modelFile } from "./harness/model_files.ts";
import { compatPath } from "./harness/compat.ts";

Deno.test("createEngine() gives a WebGPU engine whose dispose() also destroys the device it acquired", async () => {
  const model = await loadModel(modelFile("stories260K.bin"), {
    tokenizerPath: modelFile("tok512.bin"),
  });
  const { engine } = await createEngine(model, "webgpu", { numBlocks: 8, blockSize: 16 }, {
    maxBatchTokens: 16,
    maxSeqs: 2,
  });
  if (!(engine instanceof WebGpuEngine)) {
    throw new Error(`expected the webgpu engine, got ${engine.name}`);
  }
  // The executor builds a new engine after every failure: an old device left alive is a leak.
  engine.dispose();
  const info = await deadline(engine.gpu.device.lost, 5_000);
  assertEquals(info.reason, "destroyed");
});

Deno.test("createEngine('auto') times a decode step on both engines and keeps the faster: on a software adapter, the CPU engine, with both timings in its description", async () => {
  const model = await loadModel(modelFile("stories260K.gguf"));
  const kv = { numBlocks: 16, blockSize: 16 };
  const { engine, description } = await createEngine(model, "auto", kv);
  try {
    const m = /decode step ([\d.]+) ms on cpu, ([\d.]+) ms on webgpu \((.+)\)/.exec(description);
    assertEquals(m !== null, true, description);
    const [cpuMs, gpuMs] = [Number(m![1]), Number(m![2])];
    // It kept the one it measured faster, and says so first.
    assertEquals(engine.name, cpuMs <= gpuMs ? "cpu" : "webgpu", description);
    assertEquals(
      description.startsWith(cpuMs <= gpuMs ? "cpu (WebAssembly" : "webgpu ("),
      true,
      description,
    );
    // The kept engine has the whole cache, whichever won.
    assertEquals(engine.kv, kv);
    const r = await engine.step({
      stepId: 0,
      seqs: [{
        seqId: 1,
        tokens: [1, 2],
        startPos: 0,
        blockTable: [15],
        sample: true,
        sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      }],
    });
    assertEquals(r.sampled.length, 1);
  } finally {
    engine.dispose();
  }
});

Deno.test("resolveBackend('auto') on a software adapter settles on the CPU engine without timing it, and leaves no graphics driver in the process", async () => {
  // The oracle: WebGPU's own word on the adapter, asked here.
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: "high-performance" });
  if (adapter === null) throw new Error("the GPU test group needs a WebGPU adapter");
  const software = (adapter.info as GPUAdapterInfo & { isFallbackAdapter?: boolean })
    .isFallbackAdapter === true;
  // In a fresh process, so that no earlier test has loaded the driver already.
  const code = `
    import { resolveBackend } from ${
    JSON.stringify(new URL("../lib/compose/engine_factory.ts", import.meta.url).href)
  };
    const r = await resolveBackend("auto");
    const maps = Deno.readTextFileSync("/proc/self/maps");
    console.log(JSON.stringify({ ...r, driver: /libvulkan|vulkan_lvp|libEGL|libGLX?\\.|swrast|llvmpipe/.test(maps) }));
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--config", new URL("../deno.json", import.meta.url).pathname, code],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  assertEquals(out.success, true);
  const r = JSON.parse(new TextDecoder().decode(out.stdout).trim().split("\n").at(-1)!);
  assertEquals(r.adapter.description, adapter.info.description);
  assertEquals(r.adapter.cpuRasterizer, software);
  if (software) {
    assertEquals(r.backend, "cpu");
    assertEquals(
      r.note.includes(`its adapter, ${adapter.info.description}, is a software rasterizer`),
      true,
      r.note,
    );
    assertEquals(r.driver, false, "the adapter was asked in this process, not in a child");
  } else {
    // A real GPU is timed against the CPU engine by createEngine('auto').
    assertEquals(r.backend, "auto");
  }
});

Deno.test("resolveBackend() passes every named backend through untouched", async () => {
  for (const b of ["cpu", "webgpu", "reference"] as const) {
    assertEquals(await resolveBackend(b), { backend: b });
  }
});

/** An OpenGL ES adapter as a fresh machine has one: no shader-f16, 128 MiB bindings. */
const GL_ADAPTER = {
  description: "llvmpipe (GL, test)",
  cpuRasterizer: true,
  bindingLimit: 128 * 2 ** 20,
  shaderF16: false,
};

Deno.test("planKv() counts 4 bytes an element for WebGPU on an adapter without shader-f16, so --kv-memory is honoured", async () => {
  const model = await loadModel(modelFile("stories260K.gguf"));
  const { nLayers, nKvHeads, headDim } = model.config;
  const req = { blockSize: 16, maxRunning: 4, kvMemory: 16 * 2 ** 20 };
  // K and V, every layer, 16 tokens of f32: what the engine will store on such an adapter.
  const f32Block = 2 * nLayers * 16 * nKvHeads * headDim * 4;
  const gl = await planKv(model, "webgpu", req, {}, GL_ADAPTER);
  assertEquals(gl.numBlocks, Math.floor(req.kvMemory / f32Block));
  // With shader-f16 the same budget holds twice the blocks.
  const f16 = await planKv(model, "webgpu", req, {}, { ...GL_ADAPTER, shaderF16: true });
  assertEquals(f16.numBlocks, Math.floor(req.kvMemory / (f32Block / 2)));
  // auto may pick WebGPU: its plan holds for the larger element.
  assertEquals((await planKv(model, "auto", req, {}, GL_ADAPTER)).numBlocks, gl.numBlocks);
});

Deno.test("planKv('webgpu') with default flags fits each layer's f32 pool in a 128 MiB binding (llama3-like)", async () => {
  const model = await loadModel(compatPath("llama3-like-q4_k_m"));
  const { nKvHeads, headDim } = model.config;
  const plan = await planKv(model, "webgpu", { blockSize: 16, maxRunning: 64 }, {}, GL_ADAPTER);
  const poolBytes = plan.numBlocks * 16 * nKvHeads * headDim * 4;
  assert(poolBytes <= GL_ADAPTER.bindingLimit, `${poolBytes} bytes > ${GL_ADAPTER.bindingLimit}`);
  assert(plan.numBlocks > 0);
});
