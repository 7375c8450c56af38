/**
 * Uploads in progress are bounded per API key and per server, on the real server: past a
 * bound, 429 with Retry-After naming the flag; a finished upload frees its slot.
 */
import { assert, assertEquals } from "@std/assert";
import { startServer } from "./harness/server_process.ts";
import { modelFile } from "./harness/model_files.ts";
import { fileForm, filesIn, heldUpload, jsonlOf, postFile, until } from "./harness/uploads.ts";

const KEYS = ["key-aaaa-1111", "key-bbbb-2222", "key-cccc-3333"] as const;

Deno.test("past the per-key and the per-server bound an upload gets 429 with Retry-After; a finished one frees its slot", async () => {
  const dir = await Deno.makeTempDir({ prefix: "upload_slots_test_" });
  const srv = await startServer({
    args: [
      ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
      ...["--backend", "reference", "--kv-memory", "8MiB", "--log-format", "off"],
      ...["--data-dir", dir, "--batch-max-uploads", "2", "--batch-max-uploads-per-key", "1"],
      ...KEYS.flatMap((k) => ["--api-key", k]),
    ],
  });
  const [a, b, c] = KEYS;
  const content = jsonlOf(64 * 1024, 300);
  const small = () => fileForm(jsonlOf(1000, 200));
  const receiving = async (n: number) =>
    (await filesIn(dir)).filter((f) => f.endsWith(".tmp")).length === n;
  try {
    const heldA = heldUpload(srv.base, a, content);
    await until(() => receiving(1), "key a's upload to start");
    const perKey = await postFile(srv.base, small(), a);
    assertEquals(perKey.status, 429);
    assertEquals(perKey.body.error.code, "too_many_uploads");
    assert(
      perKey.body.error.message.includes("--batch-max-uploads-per-key 1"),
      perKey.body.error.message,
    );
    assert(Number(perKey.retryAfter) > 0, `Retry-After: ${perKey.retryAfter}`);

    const heldB = heldUpload(srv.base, b, content);
    await until(() => receiving(2), "key b's upload to start");
    const perServer = await postFile(srv.base, small(), c);
    assertEquals(perServer.status, 429);
    assert(
      perServer.body.error.message.includes("--batch-max-uploads 2"),
      perServer.body.error.message,
    );
    assert(Number(perServer.retryAfter) > 0, `Retry-After: ${perServer.retryAfter}`);

    const doneA = await heldA.finish();
    assertEquals(doneA.status, 200, JSON.stringify(doneA.body));
    assertEquals(doneA.body.bytes, content.length);
    assertEquals((await postFile(srv.base, small(), c)).status, 200);
    assertEquals((await postFile(srv.base, small(), a)).status, 200);
    assertEquals((await heldB.finish()).status, 200);
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
