/**
 * The batch runner over a fake line executor (no model): the bound on lines in flight, lines
 * answered 503 run again, seeds derived for lines without one, expiry, and resuming from the
 * results log.
 */
import { assert, assertEquals } from "@std/assert";
import { derivedSeed } from "../lib/batch/batch_lines.ts";
import { BatchRunner, type LineExecutor } from "../lib/batch/batch_runner.ts";
import { BatchStore } from "../lib/batch/batch_store.ts";
import type { BatchLine, BatchObject } from "../lib/batch/batch_types.ts";

function batchObject(id: string, total: number): BatchObject {
  const now = Math.floor(Date.now() / 1000);
  return {
    id,
    object: "batch",
    endpoint: "/v1/completions",
    errors: null,
    input_file_id: "file-x",
    completion_window: "24h",
    status: "in_progress",
    output_file_id: null,
    error_file_id: null,
    created_at: now,
    in_progress_at: now,
    expires_at: now + 24 * 3600,
    finalizing_at: null,
    completed_at: null,
    failed_at: null,
    expired_at: null,
    cancelling_at: null,
    cancelled_at: null,
    request_counts: { total, completed: 0, failed: 0 },
    metadata: null,
  };
}

const lines = (n: number): BatchLine[] =>
  Array.from({ length: n }, (_, i) => ({
    index: i,
    customId: `c${i}`,
    body: i % 2 === 0 ? { n: i } : { n: i, seed: 7 },
  }));

async function until(cond: () => boolean, what: string): Promise<void> {
  const end = performance.now() + 10_000;
  while (!cond()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function rows(store: BatchStore, id: string | null): Promise<any[]> {
  if (id === null) return [];
  const text = new TextDecoder().decode((await store.fileContent(id))!);
  return text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
}

Deno.test("the runner keeps at most maxInFlight lines running, runs a 503'd line again, and gives unseeded lines the derived seed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_runner_test_" });
  try {
    const store = new BatchStore(dir);
    let running = 0, peak = 0;
    const refusedOnce = new Set<number>();
    const calls: number[] = [];
    const exec: LineExecutor = async (_endpoint, body) => {
      const n = body.n as number;
      calls.push(n);
      running++;
      peak = Math.max(peak, running);
      await new Promise((r) => setTimeout(r, 3));
      running--;
      if (n === 5 && !refusedOnce.has(n)) {
        refusedOnce.add(n);
        return { status: 503, body: { error: { code: "overloaded", message: "full" } } };
      }
      if (n === 6) return { status: 400, body: { error: { code: "invalid_request" } } };
      return { status: 200, body: { id: `cmpl-${n}`, seed: body.seed } };
    };
    const runner = new BatchRunner(store, exec, { maxInFlight: 3, retryDelayMs: 5 });
    await runner.resume();
    const b = batchObject("batch_t1", 20);
    await runner.start(b, lines(20));
    await until(() => runner.get(b.id)!.status === "completed", "the batch to complete");
    assertEquals(peak, 3);
    assertEquals(calls.filter((n) => n === 5).length, 2, "line 5 ran again after its 503");
    assertEquals(calls.length, 21);
    assertEquals(runner.get(b.id)!.request_counts, { total: 20, completed: 19, failed: 1 });
    const out = await rows(store, b.output_file_id);
    assertEquals(
      out.map((o) => o.custom_id),
      lines(20).map((l) => l.customId).filter((c) => c !== "c6"),
    );
    for (const o of out) {
      const i = Number(o.custom_id.slice(1));
      assertEquals(o.response.body.seed, i % 2 === 0 ? derivedSeed(b.id, i) : 7, o.custom_id);
      assertEquals(o.response.request_id, `cmpl-${i}`);
    }
    const errs = await rows(store, b.error_file_id);
    assertEquals(errs.map((o) => [o.custom_id, o.response.status_code]), [["c6", 400]]);
    await runner.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a runner started on a stored batch runs only the lines its results log lacks; past its window a batch expires", async () => {
  const dir = await Deno.makeTempDir({ prefix: "batch_runner_test_" });
  try {
    const store = new BatchStore(dir);
    const input = lines(6).map((l) =>
      JSON.stringify({
        custom_id: l.customId,
        method: "POST",
        url: "/v1/completions",
        body: l.body,
      })
    ).join("\n");
    await store.putFile({
      id: "file-x",
      object: "file",
      bytes: input.length,
      created_at: 0,
      filename: "x.jsonl",
      purpose: "batch",
      status: "processed",
    }, new TextEncoder().encode(input));
    const b = batchObject("batch_t2", 6);
    await store.saveBatch(b);
    const log = await store.openResults(b.id);
    for (const i of [0, 3]) {
      await log.append(i, true, {
        id: `r${i}`,
        custom_id: `c${i}`,
        response: { status_code: 200, request_id: `before-${i}`, body: {} },
        error: null,
      });
    }
    await log.close();
    const ran: number[] = [];
    const exec: LineExecutor = (_e, body) => {
      ran.push(body.n as number);
      return Promise.resolve({ status: 200, body: { id: `after-${body.n}` } });
    };
    const runner = new BatchRunner(store, exec, { maxInFlight: 2 });
    assertEquals(await runner.resume(), 1);
    await until(() => runner.get(b.id)!.status === "completed", "the resumed batch");
    assertEquals(ran.sort(), [1, 2, 4, 5]);
    const out = await rows(store, runner.get(b.id)!.output_file_id);
    assertEquals(out.map((o) => o.response.request_id), [
      "before-0",
      "after-1",
      "after-2",
      "before-3",
      "after-4",
      "after-5",
    ]);
    await runner.close();

    // The same kind of batch, with a clock past its window: nothing runs, every line expires.
    const late = batchObject("batch_t3", 6);
    await store.saveBatch(late);
    const never: LineExecutor = () => {
      throw new Error("an expired batch ran a line");
    };
    const lateRunner = new BatchRunner(store, never, {
      maxInFlight: 2,
      now: () => late.expires_at + 1,
    });
    await lateRunner.resume();
    await until(() => lateRunner.get(late.id)!.status === "expired", "the batch to expire");
    const expired = lateRunner.get(late.id)!;
    assertEquals(expired.request_counts, { total: 6, completed: 0, failed: 6 });
    assertEquals(expired.output_file_id, null);
    const errs = await rows(store, expired.error_file_id);
    assertEquals(errs.length, 6);
    assert(errs.every((e) => e.response === null && e.error.code === "batch_expired"));
    await lateRunner.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
