/**
 * A full data disk, for real: the server runs in a mount namespace of its own with a 1 MiB
 * tmpfs as its data dir (`unshare -rm`, which any user may do, root or not), which the test
 * fills and empties through /proc/<pid>/root. An upload that does not fit gets 507 naming the
 * folder and leaves nothing; a batch whose results the disk refuses says so in `errors`, waits,
 * and completes once space is freed, each line recorded once and counted once.
 */
import { assert, assertEquals } from "@std/assert";
import { namespaceView, type ServerProcess, startServer } from "./harness/server_process.ts";
import { modelFile } from "./harness/model_files.ts";
import { fileForm, filesIn, jsonlOf, postFile, until } from "./harness/uploads.ts";

/** Writes a file in `dir` until the disk refuses more; returns its path. */
async function fill(dir: string): Promise<string> {
  const path = `${dir}/filler`;
  const f = await Deno.open(path, { write: true, create: true });
  const block = new Uint8Array(4096);
  try {
    for (;;) await f.write(block);
  } catch (e) {
    if ((e as { code?: string }).code !== "ENOSPC") throw e;
  } finally {
    f.close();
  }
  return path;
}

/** A server whose data dir is a fresh 1 MiB tmpfs, and the test's view of that disk. */
async function server(
  extra: string[] = [],
): Promise<{ srv: ServerProcess; dir: string; view: string; remove(): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "disk_full_test_" });
  const srv = await startServer({
    args: [
      ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
      ...["--backend", "reference", "--kv-memory", "8MiB", "--log-format", "off"],
      ...["--data-dir", dir, ...extra],
    ],
    tmpfs: { dir, size: "1m" },
  });
  return {
    srv,
    dir,
    view: namespaceView(srv, dir),
    // The tmpfs goes with the server's namespace; the folder under it was always empty.
    remove: () => Deno.remove(dir, { recursive: true }),
  };
}

Deno.test("an upload that does not fit the data disk gets 507 naming the folder and leaves nothing; so does a batch", async () => {
  const disk = await server();
  const { srv } = disk;
  try {
    const r = await postFile(srv.base, fileForm(jsonlOf(2 * 1024 * 1024, 1000)));
    assertEquals(r.status, 507, JSON.stringify(r.body));
    assertEquals(r.body.error.code, "insufficient_storage");
    assert(r.body.error.message.includes(`data folder ${disk.dir} is full`), r.body.error.message);
    assertEquals(await filesIn(disk.view), []);
    // The refused upload's bytes are gone: a file that fits is taken.
    const ok = await postFile(srv.base, fileForm(jsonlOf(600 * 1024, 1000)));
    assertEquals(ok.status, 200, JSON.stringify(ok.body));
    // A batch the full disk cannot store is a 507 too, and does not exist.
    const filler = await fill(disk.view);
    const batch = await fetch(`${srv.base}/v1/batches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        input_file_id: ok.body.id,
        endpoint: "/v1/completions",
        completion_window: "24h",
      }),
    });
    const refused = await batch.json();
    assertEquals(batch.status, 507, JSON.stringify(refused));
    assert(refused.error.message.includes("the batch was not created"), refused.error.message);
    assertEquals((await (await fetch(`${srv.base}/v1/batches`)).json()).data, []);
    await Deno.remove(filler);
  } finally {
    await srv.stop();
    await disk.remove();
  }
});

Deno.test("a batch whose results the full disk refuses says why in errors, and completes once space is freed, each line once", async () => {
  const disk = await server(["--batch-concurrency", "1"]);
  const { srv } = disk;
  const get = async (path: string) => await (await fetch(`${srv.base}${path}`)).json();
  try {
    const n = 30;
    const input = new TextEncoder().encode(
      Array.from({ length: n }, (_, i) =>
        JSON.stringify({
          custom_id: `r${i}`,
          method: "POST",
          url: "/v1/completions",
          body: { prompt: "Once upon a time", max_tokens: 200, temperature: 0 },
        }) + "\n").join(""),
    );
    const file = await postFile(srv.base, fileForm(input));
    assertEquals(file.status, 200);
    const created = await fetch(`${srv.base}/v1/batches`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        input_file_id: file.body.id,
        endpoint: "/v1/completions",
        completion_window: "24h",
      }),
    }).then((r) => r.json());
    const batch = () => get(`/v1/batches/${created.id}`);
    await until(async () => (await batch()).request_counts.completed >= 1, "a first line");
    const filler = await fill(disk.view);

    let waiting: any;
    await until(
      async () => {
        waiting = await batch();
        return waiting.errors !== null;
      },
      "the batch to report the full disk",
      60_000,
    );
    assert(["in_progress", "finalizing"].includes(waiting.status), waiting.status);
    assertEquals(waiting.errors.data[0].code, "insufficient_storage");
    assert(
      waiting.errors.data[0].message.includes(`data folder ${disk.dir} is full`),
      waiting.errors.data[0].message,
    );

    await Deno.remove(filler);
    let done: any;
    await until(
      async () => {
        done = await batch();
        return done.status === "completed";
      },
      "the batch to complete after space was freed",
      120_000,
    );
    assertEquals(done.errors, null);
    assertEquals(done.request_counts, { total: n, completed: n, failed: 0 });
    const rows = (await (await fetch(`${srv.base}/v1/files/${done.output_file_id}/content`)).text())
      .split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assertEquals(rows.map((r) => r.custom_id), Array.from({ length: n }, (_, i) => `r${i}`));
    // Greedy lines with one prompt: every answer the same, none cut by the refused writes.
    assertEquals(new Set(rows.map((r) => r.response.body.choices[0].text)).size, 1);
  } finally {
    await srv.stop();
    await disk.remove();
  }
});
