import { assertEquals } from "@std/assert";
import { deadline } from "@std/async/deadline";
import { WebGpuEngine } from "../kernels/webgpu_engine.ts";
import { createEngine, resolveBackend } from "../lib/serving/engine_factory.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { modelFile } from "./harness/model_files.ts";

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
    assertEquals(description.startsWith(cpuMs <= gpuMs ? "cpu (WebAssembly" : "webgpu ("), true, description);
    // The kept engine has the whole cache, whichever won.
    assertEquals(engine.kv, kv);
    const r = await engine.step({
      stepId: 0,
      seqs: [{ seqId: 1, tokens: [1, 2], startPos: 0, blockTable: [15], sample: true, sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 } }],
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
    import { resolveBackend } from ${JSON.stringify(new URL("../lib/serving/engine_factory.ts", import.meta.url).href)};
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
    assertEquals(r.note.includes(`its adapter, ${adapter.info.description}, is a software rasterizer`), true, r.note);
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
