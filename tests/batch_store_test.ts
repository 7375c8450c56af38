/** The batch store's results log: what a crash can leave behind, and what a reopen keeps. */
import { assertEquals } from "@std/assert";
import { BatchStore, ResultLog } from "../lib/batch/batch_store.ts";
import type { OutputLine } from "../lib/batch/batch_types.ts";

const line = (custom_id: string): OutputLine => ({
  id: `batch_req_${custom_id}`,
  custom_id,
  response: { status_code: 200, request_id: custom_id, body: { text: custom_id } },
  error: null,
});

Deno.test("a results log reopened keeps whole records, drops a record cut short at the end, and never writes an index twice", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_store_test_" });
  try {
    const store = new BatchStore(dir);
    const log = await store.openResults("batch_x");
    await Promise.all([log.append(0, true, line("a")), log.append(2, false, line("c"))]);
    await log.append(0, true, line("a-again"));
    await log.close();
    const path = `${dir}/batches/batch_x.results.jsonl`;
    const whole = await Deno.readTextFile(path);
    assertEquals(whole.split("\n").filter(Boolean).length, 2);
    // A crash in the middle of the next append: half a record, no newline.
    const half = JSON.stringify({ index: 1, ok: true, line: line("b") }).slice(0, 30);
    await Deno.writeTextFile(path, half, { append: true });
    const reopened = await store.openResults("batch_x");
    assertEquals(reopened.records.map((r) => [r.index, r.ok, r.line.custom_id]), [
      [0, true, "a"],
      [2, false, "c"],
    ]);
    assertEquals(reopened.has(1), false);
    await reopened.append(1, true, line("b"));
    await reopened.close();
    const after = (await Deno.readTextFile(path)).split("\n").filter(Boolean).map((r) =>
      JSON.parse(r).index
    );
    assertEquals(after, [0, 2, 1]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a store that never took a batch leaves no directory behind, and ids outside the id spelling are never looked up", async () => {
  const dir = `${await Deno.makeTempDir({ prefix: "batch_store_test_" })}/data`;
  try {
    const store = new BatchStore(dir);
    assertEquals(await store.listBatches(), []);
    assertEquals(await store.getFile("file-missing"), undefined);
    assertEquals(await store.getFile("../../etc/passwd"), undefined);
    assertEquals(await store.fileContent("file-../x"), undefined);
    let exists = true;
    await Deno.stat(dir).catch(() => exists = false);
    assertEquals(exists, false);
  } finally {
    await Deno.remove(dir.slice(0, -"/data".length), { recursive: true });
  }
});

Deno.test("a record the disk refuses is not kept: not in the records the output files are built from, and it may be appended again", async () => {
  // /dev/full refuses every write with ENOSPC, as a full disk does (any user may open it).
  const log = await ResultLog.open("/dev/full");
  try {
    const refused = await log.append(0, true, line("a")).then(() => undefined, (e) => e);
    assertEquals((refused as { code?: string }).code, "ENOSPC");
    assertEquals(log.records, []);
    assertEquals(log.has(0), false);
    const again = await log.append(0, true, line("a")).then(() => undefined, (e) => e);
    assertEquals((again as { code?: string }).code, "ENOSPC");
    assertEquals(log.records, []);
  } finally {
    await log.close();
  }
});
