/**
 * A restart storm on the real server (main.ts serve, CPU engine): 30 injected engine faults.
 * Every generation still gets the reference tokens, and memory after the storm stays within
 * one engine's worth of what it was before.
 */
import { assertEquals, assertLess } from "@std/assert";
import { metricValue, startServer } from "./harness/server_process.ts";
import { modelFile } from "./harness/model_files.ts";
import { FrameClient, type GenParams, MODEL_NAME, Reference } from "./_reliability_harness.ts";

Deno.test("restart storm: 30 injected faults, every generation matches the reference, RSS grows by less than one KV pool", async () => {
  const ref = await Reference.load();
  const kvMiB = 32;
  const faults = Array.from({ length: 30 }, (_, i) => 20 + i * 12);
  const server = await startServer({
    args: [
      "--model",
      modelFile(MODEL_NAME),
      "--backend",
      "reference",
      "--kv-memory",
      `${kvMiB}MiB`,
      "--log-format",
      "off",
    ],
    env: { LLMSERVE_FAULT_STEPS: faults.join(",") },
  });
  try {
    const ws = await FrameClient.open(server.wsUrl);
    const p = (i: number): GenParams => ({
      prompt: ["Once upon a time", "Tom and his dog", "The little cat"][i % 3]!,
      max_tokens: 48,
      temperature: 0,
    });
    // One round before measuring: the first restart and the pools' first touch are in it.
    let round = 0;
    const runRound = async () => {
      const ids = [0, 1, 2, 3].map((k) => `r${round}-${k}`);
      ids.forEach((id, k) => ws.generate(id, p(k)));
      await ws.finished(ids, 30_000);
      for (const [k, id] of ids.entries()) {
        assertEquals(ws.final(id)!.type, "done", JSON.stringify(ws.final(id)));
        assertEquals(ws.tokens(id), await ref.tokens(p(k)), id);
      }
      round++;
    };
    await runRound();
    const restarts = async () =>
      metricValue(
        await (await fetch(`${server.base}/metrics`)).text(),
        "llm_executor_restarts_total",
      ) ??
        0;
    const before = server.rssBytes()!;
    const restartsBefore = await restarts();
    while ((await restarts()) < faults.length && round < 200) await runRound();
    const after = server.rssBytes()!;
    const n = (await restarts()) - restartsBefore;
    console.log(
      `restart storm: ${n} restarts measured (30 in all), RSS ${(before / 2 ** 20).toFixed(0)} -> ${
        (after / 2 ** 20).toFixed(0)
      } MiB with a ${kvMiB} MiB KV pool`,
    );
    assertEquals(await restarts(), faults.length);
    assertLess(after - before, kvMiB * 2 ** 20, "within one engine's worth");
    ws.close();
  } finally {
    const { code, log } = await server.stop("SIGTERM");
    assertEquals(code, 0, log);
  }
});
