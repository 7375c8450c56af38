/**
 * Each key's share of the data dir, on the real server: an upload that would pass
 * --batch-max-storage or --batch-max-files is refused with 400 naming the quota, the use and
 * the request, and stores nothing; DELETE /v1/files/{id} gives the room back; another key's
 * quota is its own.
 */
import { assert, assertEquals } from "@std/assert";
import { startServer } from "./harness/server_process.ts";
import { modelFile } from "./harness/model_files.ts";
import { fileForm, filesIn, jsonlOf, postFile } from "./harness/uploads.ts";

const ONE = "key-one-123456";
const TWO = "key-two-654321";

Deno.test("uploads past a key's storage or file quota get 400 naming it; DELETE frees the room; keys do not share", async () => {
  const dir = await Deno.makeTempDir({ prefix: "storage_quota_test_" });
  const srv = await startServer({
    args: [
      ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
      ...["--backend", "reference", "--kv-memory", "8MiB", "--log-format", "off"],
      ...["--data-dir", dir, "--batch-max-storage", "100KiB", "--batch-max-files", "3"],
      ...["--api-key", ONE, "--api-key", TWO],
    ],
  });
  const del = async (id: string, key: string) => {
    const res = await fetch(`${srv.base}/v1/files/${id}`, {
      method: "DELETE",
      headers: { authorization: `Bearer ${key}` },
    });
    return { status: res.status, body: await res.json() };
  };
  try {
    const f60 = jsonlOf(60 * 1024, 500);
    const first = await postFile(srv.base, fileForm(f60), ONE);
    assertEquals(first.status, 200);
    const stored = await filesIn(dir);

    // 60 KiB stored + another 60 KiB > 100 KiB: refused, naming the use and the request.
    const over = await postFile(srv.base, fileForm(f60), ONE);
    assertEquals(over.status, 400);
    assertEquals(over.body.error.code, "storage_quota_exceeded");
    const m = over.body.error.message as string;
    assert(m.includes("--batch-max-storage"), m);
    assert(m.includes(`use ${f60.length} of ${100 * 1024} bytes`), m);
    assert(/requests \d+/.exec(m) !== null && Number(/requests (\d+)/.exec(m)![1]) > 40 * 1024, m);
    assertEquals(await filesIn(dir), stored);

    // The other key has its own 100 KiB.
    assertEquals((await postFile(srv.base, fileForm(f60), TWO)).status, 200);

    // DELETE gives the room back: OpenAI's answer, then the file is gone for good.
    const gone = await del(first.body.id, ONE);
    assertEquals(gone, { status: 200, body: { id: first.body.id, object: "file", deleted: true } });
    assertEquals((await del(first.body.id, ONE)).status, 404);
    const again = await fetch(`${srv.base}/v1/files/${first.body.id}`, {
      headers: { authorization: `Bearer ${ONE}` },
    });
    assertEquals(again.status, 404);
    await again.body?.cancel();
    assertEquals((await postFile(srv.base, fileForm(f60), ONE)).status, 200);

    // Three files is the count quota.
    const tiny = () => fileForm(jsonlOf(500, 200));
    assertEquals((await postFile(srv.base, tiny(), ONE)).status, 200);
    assertEquals((await postFile(srv.base, tiny(), ONE)).status, 200);
    const fourth = await postFile(srv.base, tiny(), ONE);
    assertEquals(fourth.status, 400);
    assert(fourth.body.error.message.includes("3 files are stored"), fourth.body.error.message);
    assert(fourth.body.error.message.includes("--batch-max-files 3"), fourth.body.error.message);
    // A key cannot delete another key's file (it does not see it).
    const twos = await (await fetch(`${srv.base}/v1/files`, {
      headers: { authorization: `Bearer ${TWO}` },
    })).json();
    assertEquals((await del(twos.data[0].id, ONE)).status, 404);
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
});
