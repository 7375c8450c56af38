/**
 * A replica's heartbeat, sent from a worker thread with its own NATS connection. On the CPU
 * backend an engine step runs on the main thread and blocks its event loop for as long as it
 * takes (seconds on a contended machine); heartbeats sent from there would stop, and routers
 * would take a busy replica for a dead one. The worker keeps beating while the process lives,
 * repeating the main thread's latest snapshot and saying how old it is (`stalledMs`), so a
 * main thread that hangs for good still gets noticed.
 *
 * Messages from the main thread: {type: "start", nats, snapshot, intervalMs},
 * {type: "snapshot", snapshot} (a heartbeat without beat and stalledMs), {type: "beat"} (send
 * one now, e.g. on drain), {type: "stop"}.
 */
/// <reference lib="deno.worker" />
import { connectNats, type NatsOptions } from "./nats_connection.ts";
import { encodeMessage, type Heartbeat } from "./messages.ts";
import { subjects } from "./subjects.ts";

type Snapshot = Omit<Heartbeat, "beat" | "stalledMs">;

let snapshot: Snapshot | undefined;
let snapshotAt = 0;
let beat = 0;
let timer: ReturnType<typeof setInterval> | undefined;
let send: (() => void) | undefined;
let closeNats: (() => Promise<void>) | undefined;

self.onmessage = async (e: MessageEvent) => {
  const msg = e.data as
    | { type: "start"; nats: NatsOptions; snapshot: Snapshot; intervalMs: number }
    | { type: "snapshot"; snapshot: Snapshot }
    | { type: "beat" }
    | { type: "stop" };
  switch (msg.type) {
    case "start": {
      snapshot = msg.snapshot;
      snapshotAt = performance.now();
      const nc = await connectNats({ ...msg.nats, name: `${msg.nats.name}-heartbeat` });
      send = () => {
        if (snapshot === undefined || nc.isClosed()) return;
        const hb: Heartbeat = {
          ...snapshot,
          beat: beat++,
          stalledMs: Math.round(performance.now() - snapshotAt),
        };
        try {
          nc.publish(subjects.announce, encodeMessage(hb));
        } catch (e) {
          // A throw from this timer would end the worker, and its error the whole process.
          console.error(`heartbeat not sent: ${(e as Error).message}`);
        }
      };
      closeNats = async () => {
        await nc.flush().catch(() => {});
        await nc.close();
      };
      send();
      timer = setInterval(send, msg.intervalMs);
      self.postMessage({ type: "started" });
      return;
    }
    case "snapshot":
      snapshot = msg.snapshot;
      snapshotAt = performance.now();
      return;
    case "beat":
      send?.();
      return;
    case "stop":
      if (timer !== undefined) clearInterval(timer);
      await closeNats?.();
      self.postMessage({ type: "stopped" });
      return;
  }
};
