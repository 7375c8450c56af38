import { assertEquals } from "@std/assert";
import { CLOSE_TOO_SLOW, type FrameSocket, FrameWriter } from "../lib/http/frame_writer.ts";
import { type ServerFrame, statsFrame } from "../lib/http/protocol.ts";

/** An error frame whose JSON text is exactly `bytes` long (at least 40). */
function frame(bytes: number): ServerFrame {
  const f: ServerFrame = { type: "error", code: "t", message: "m".repeat(bytes - 40) };
  assertEquals(JSON.stringify(f).length, bytes);
  return f;
}

const STATS = statsFrame({
  running: 0,
  waiting: 0,
  kvBlocksUsed: 0,
  kvBlocksTotal: 1,
  prefixCacheHitRate: 0,
  steps: 0,
  lastBatchSize: 0,
  executorHealthy: true,
}, 0);

/** A socket whose buffer only drains when the test says so. */
class HeldSocket implements FrameSocket {
  bufferedAmount = 0;
  isOpen = true;
  sent: string[] = [];
  closedWith: [number, string] | undefined;
  send(text: string): void {
    this.sent.push(text);
    this.bufferedAmount += text.length;
  }
  close(code: number, reason: string): void {
    this.closedWith = [code, reason];
    this.isOpen = false;
  }
}

const tick = (ms = 15) => new Promise((r) => setTimeout(r, ms));

Deno.test("FrameWriter.send() waits while the buffer is above the high-water mark", async () => {
  const sock = new HeldSocket();
  const w = new FrameWriter(sock, {
    highWaterBytes: 100,
    lowWaterBytes: 20,
    stallTimeoutMs: 10_000,
    pollMs: 1,
  });
  assertEquals(await w.send(frame(52)), true); // 52 bytes: under the mark
  let resolved: boolean | undefined;
  w.send(frame(114)).then((v) => resolved = v); // 114 bytes: congested
  await tick();
  assertEquals(resolved, undefined);
  assertEquals(w.trySend(STATS), false, "droppable frames are dropped while congested");
  sock.bufferedAmount = 50; // drained some, still above the low-water mark
  await tick();
  assertEquals(resolved, undefined);
  sock.bufferedAmount = 10;
  await tick();
  assertEquals(resolved, true);
  assertEquals(w.trySend(STATS), true);
  assertEquals(sock.sent.length, 3);
  w.dispose();
});

Deno.test("FrameWriter disconnects a client that stays congested past the stall timeout", async () => {
  const sock = new HeldSocket();
  const w = new FrameWriter(sock, {
    highWaterBytes: 10,
    lowWaterBytes: 5,
    stallTimeoutMs: 40,
    pollMs: 2,
  });
  const t0 = performance.now();
  assertEquals(await w.send(frame(40)), false);
  const waited = performance.now() - t0;
  assertEquals(waited >= 40, true, `gave up after ${waited} ms`);
  assertEquals(sock.closedWith?.[0], CLOSE_TOO_SLOW);
  assertEquals(await w.send(frame(40)), false);
});

Deno.test("FrameWriter disconnects when unawaited sends pile up past four high-water marks", async () => {
  const sock = new HeldSocket();
  const w = new FrameWriter(sock, {
    highWaterBytes: 10,
    lowWaterBytes: 5,
    stallTimeoutMs: 10_000,
    pollMs: 2,
  });
  const pending = [w.send(frame(40)), w.send(frame(40))]; // 80 bytes > 40
  assertEquals(sock.closedWith?.[0], CLOSE_TOO_SLOW);
  assertEquals(await Promise.all(pending), [false, false]);
  w.dispose();
});
