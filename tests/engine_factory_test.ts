import { assertEquals } from "@std/assert";
import { deadline } from "@std/async/deadline";
import { WebGpuEngine } from "../kernels/webgpu_engine.ts";
import { createEngine } from "../lib/serving/engine_factory.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { modelFile } from "./_model_files.ts";

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
