/**
 * Every compat file loads in `generate` and `start` (`main.ts serve`) on both backends, and
 * both print llama.cpp's greedy text for a fixture prompt (the one whose first steps all have
 * margins over 0.5 nats, so the tokens are facts; the stories260K carriers have near-ties).
 * `generate` sizes its KV cache automatically (one full context: 128k tokens for llama3-like);
 * `start` runs with a short context and a small cache to keep 18 servers cheap.
 */
import { assert, assertEquals } from "@std/assert";
import {
  assertGreedyCompletion,
  clearPrompt,
  COMPAT_FILES,
  compatPath,
  generateGreedy,
  readFixture,
} from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;

for (const stem of COMPAT_FILES) {
  for (const backend of ["cpu", "webgpu"]) {
    Deno.test(`generate --backend ${backend} loads ${stem} and prints llama.cpp's greedy text`, async () => {
      const fx = await readFixture(stem);
      const { prompt, text, n } = await clearPrompt(fx, stem);
      const out = await generateGreedy(stem, prompt, n, backend);
      const stderr = out.stderr;
      assertEquals(out.code, 0, stderr);
      // generate ends its text with one newline of its own.
      assertEquals(out.stdout, `${text}\n`, stderr);
      assert(stderr.includes(`on ${backend}`), stderr);
      assert(/memory: weights [\d.]+ [KMG]iB, kv cache/.test(stderr), stderr);
    });

    Deno.test(`start --backend ${backend} serves ${stem} with llama.cpp's greedy text`, async () => {
      const fx = await readFixture(stem);
      const { prompt, text, n } = await clearPrompt(fx, stem);
      const server = await spawnUntilListening([
        "run",
        "--allow-all",
        MAIN,
        "serve",
        "--model",
        compatPath(stem),
        "--port",
        "0",
        "--backend",
        backend,
        "--context-length",
        "256",
        "--kv-memory",
        "16MiB",
        "--max-running",
        "4",
      ]);
      try {
        await assertGreedyCompletion(server.base, stem, prompt, n, text);
      } finally {
        server.child.kill("SIGTERM");
        await server.child.status;
      }
      const log = await server.log();
      assert(log.includes(`backend   ${backend}`), log);
      assert(/memory {4}weights [\d.]+ [KMG]iB, kv cache 16\.0 MiB/.test(log), log);
    });
  }
}
