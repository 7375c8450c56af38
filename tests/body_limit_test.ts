import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { drainRefusedBody } from "../lib/http/body.ts";
import { startService } from "./_http_harness.ts";

const enc = new TextEncoder();

/** One HTTP/1.1 response read off a raw connection: status, headers, body by Content-Length. */
async function readResponse(conn: Deno.Conn): Promise<{ status: number; body: string }> {
  let bytes = new Uint8Array(0);
  const buf = new Uint8Array(65536);
  for (;;) {
    const text = new TextDecoder().decode(bytes);
    const end = text.indexOf("\r\n\r\n");
    if (end >= 0) {
      const length = Number(/content-length: (\d+)/i.exec(text.slice(0, end))?.[1] ?? "0");
      if (bytes.length >= end + 4 + length) {
        return {
          status: Number(text.slice(9, 12)),
          body: text.slice(end + 4, end + 4 + length),
        };
      }
    }
    const n = await conn.read(buf);
    if (n === null) throw new Error(`the connection ended after ${JSON.stringify(text)}`);
    bytes = new Uint8Array([...bytes, ...buf.subarray(0, n)]);
  }
}

Deno.test("a JSON body refused from its declared length is read to its end, so the client that sends all of it gets the 413 and its connection serves the next request", async () => {
  await using svc = await startService();
  const url = new URL(svc.base);
  using conn = await Deno.connect({ hostname: url.hostname, port: Number(url.port) });
  // 20 MB: more than the socket buffers hold, so a server that stopped reading would reset the
  // connection under the client's writes (it did: "Broken pipe" after ~5.6 MB).
  const body = enc.encode(`{"prompt":"${"a".repeat(20_000_000)}"}`);
  await conn.write(enc.encode(
    `POST /v1/completions HTTP/1.1\r\nHost: ${url.host}\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\n\r\n`,
  ));
  const reply = readResponse(conn);
  // A write may take part of what it is given: each continues where the last one stopped.
  for (let i = 0; i < body.length;) i += await conn.write(body.subarray(i, i + (1 << 16)));
  const refused = await reply;
  assertEquals(refused.status, 413, refused.body);
  assertStringIncludes(JSON.parse(refused.body).error.message, `${body.length} bytes`);
  await conn.write(enc.encode(`GET /health HTTP/1.1\r\nHost: ${url.host}\r\n\r\n`));
  assertEquals((await readResponse(conn)).status, 200);
});

/** A body of `chunks` chunks of `size` bytes that counts how many were pulled. */
function countedBody(chunks: number, size: number) {
  const state = { pulled: 0 };
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      if (state.pulled === chunks) return c.close();
      state.pulled++;
      c.enqueue(new Uint8Array(size));
    },
  }, { highWaterMark: 0 });
  return { stream, state };
}

Deno.test("draining a refused body stops past its byte bound, and at its time bound when the client stalls", async () => {
  const all = countedBody(10, 1000);
  await drainRefusedBody(all.stream, 100_000, 60_000);
  assertEquals(all.state.pulled, 10, "a body under the bound is read to its end");

  const big = countedBody(1000, 1000);
  await drainRefusedBody(big.stream, 4_500, 60_000);
  // Chunks of 1000 bytes: the fifth passes 4,500, and nothing more is read.
  assertEquals(big.state.pulled, 5);

  let cancelled = false;
  const stalled = new ReadableStream<Uint8Array>({
    pull: () => new Promise(() => {}),
    cancel: () => {
      cancelled = true;
    },
  });
  await drainRefusedBody(stalled, 1 << 20, 50);
  assert(cancelled, "a stalled body is cancelled when the drain gives up");
});
