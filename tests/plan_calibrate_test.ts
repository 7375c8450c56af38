/**
 * `deno task plan --calibrate` on a real (tiny) model and a real nats-server: it writes a
 * calibration the planner reads back, with the bytes it timed taken from the file.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { calibrate } from "../lib/cli/plan_calibrate.ts";
import { parseCalibration } from "../lib/cluster/plan_calibration.ts";
import { modelFile } from "./harness/model_files.ts";

Deno.test("calibrating on stories260K writes a calibration of its layers, classifier and NATS", async () => {
  const dir = await Deno.makeTempDir({ prefix: "plan_calibrate_test_" });
  try {
    const path = `${dir}/cal.json`;
    const written = await calibrate(modelFile("stories260K.gguf"), path);
    const read = parseCalibration(JSON.parse(await Deno.readTextFile(path)), path);
    assertEquals(read, written);
    // A layer's matrices: q, o 64×64; k, v 64×32; gate, up, down 64×172; f32. The classifier
    // 512 × 64 f32.
    assertEquals(read.layerBytes, 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172));
    assertEquals(read.classifierBytes, 4 * 512 * 64);
    assertEquals(read.model, "stories260K.gguf");
    assertStringIncludes(read.how, "1 thread");
    assertStringIncludes(read.transport.how, "nats-server on 127.0.0.1");
    // Timed, not assumed: 32 rows cost more than 1 of the same layer.
    assert(read.layerSeconds.rows32 > read.layerSeconds.rows1);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
