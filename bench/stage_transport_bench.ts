/**
 * What one hop between pipeline stages costs on loopback, for the two transports issue 41
 * names: over NATS (request/reply, chunked at the server's max_payload) and over a direct TCP
 * link (length-prefixed frames, lib/cluster/frame_stream.ts). Each round trip sends a payload
 * of residual rows (rows × 2048 f32, the Llama-3.2-1B width) and gets a 16-byte answer, as a
 * stage does when it hands rows on. The variants alternate, A B A B, and medians are reported.
 *
 *   deno run --allow-all bench/stage_transport_bench.ts [--iterations 40]
 */
import { parseArgs } from "@std/cli/parse-args";
import { connectNats } from "../lib/cluster/nats_connection.ts";
import { findNatsServer } from "../lib/cli/cluster.ts";
import { FrameReader, writeFrame } from "../lib/cluster/frame_stream.ts";
import { fmt, summarize, table } from "./stats.ts";

const DIM = 2048;
const ROWS = [1, 32, 512];

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

async function startNats(): Promise<{ url: string; stop: () => Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "stage_bench_nats_" });
  const port = freePort(), pass = crypto.randomUUID();
  await Deno.writeTextFile(
    `${dir}/nats.conf`,
    `listen: 127.0.0.1:${port}\nauthorization { user: bench, password: "${pass}" }\n`,
  );
  const child = new Deno.Command(findNatsServer()!, {
    args: ["-c", `${dir}/nats.conf`],
    stdout: "null",
    stderr: "null",
  }).spawn();
  for (let i = 0; i < 100; i++) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return {
    url: `nats://bench:${pass}@127.0.0.1:${port}`,
    stop: async () => {
      child.kill("SIGTERM");
      await child.status;
    },
  };
}

/** A NATS round trip: the payload in max_payload chunks, the answer after the last. */
async function natsHop(
  url: string,
): Promise<{ send: (b: Uint8Array) => Promise<void>; close: () => Promise<void> }> {
  const server = await connectNats({ url, name: "bench-stage" });
  const client = await connectNats({ url, name: "bench-head" });
  const max = client.info!.max_payload - 64;
  server.subscribe("bench.stage", {
    callback: (_e, m) => {
      if (m.reply) m.respond(new Uint8Array(16));
    },
  });
  await server.flush();
  return {
    send: async (b) => {
      for (let at = 0; at + max < b.length; at += max) {
        client.publish("bench.stage", b.subarray(at, at + max));
      }
      const last = b.subarray(Math.floor((b.length - 1) / max) * max);
      await client.request("bench.stage", last, { timeout: 10_000 });
    },
    close: async () => {
      await client.close();
      await server.close();
    },
  };
}

/** A TCP round trip: one frame out, a 16-byte frame back. */
async function tcpHop(): Promise<
  { send: (b: Uint8Array) => Promise<void>; close: () => Promise<void> }
> {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const served = (async () => {
    const conn = await listener.accept();
    conn.setNoDelay(true);
    const r = new FrameReader(conn, 1 << 30);
    while (await r.next()) await writeFrame(conn, new Uint8Array(16));
    conn.close();
  })();
  const conn = await Deno.connect({
    hostname: "127.0.0.1",
    port: (listener.addr as Deno.NetAddr).port,
  });
  conn.setNoDelay(true);
  const r = new FrameReader(conn, 1 << 20);
  return {
    send: async (b) => {
      await writeFrame(conn, b);
      await r.next();
    },
    close: async () => {
      conn.close();
      await served.catch(() => {});
      listener.close();
    },
  };
}

const args = parseArgs(Deno.args, { string: ["iterations"] });
const iterations = Number(args.iterations ?? 40);
const nats = await startNats();
const hops = { nats: await natsHop(nats.url), tcp: await tcpHop() };
const rows: string[][] = [];
for (const n of ROWS) {
  const payload = new Uint8Array(n * DIM * 4).map((_, i) => i);
  const ms: Record<string, number[]> = { nats: [], tcp: [] };
  for (let i = 0; i < iterations + 3; i++) {
    for (const [name, hop] of Object.entries(hops)) {
      const t0 = performance.now();
      await hop.send(payload);
      if (i >= 3) ms[name]!.push(performance.now() - t0);
    }
  }
  for (const name of ["nats", "tcp"]) {
    const med = summarize(ms[name]!).p50;
    rows.push([
      `${n} × ${DIM} f32 (${payload.length / 1024} KiB)`,
      name,
      fmt(med, 3),
      fmt(payload.length / 1e6 / (med / 1000), 0),
    ]);
  }
}
await hops.nats.close();
await hops.tcp.close();
await nats.stop();
console.log(
  `load average ${
    Deno.loadavg().map((l) => l.toFixed(2)).join(" ")
  }, ${iterations} round trips each, alternating`,
);
console.log(table(["payload", "transport", "round trip ms (median)", "MB/s"], rows));
