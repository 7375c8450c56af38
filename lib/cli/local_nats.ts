import { findNatsServer } from "./cluster.ts";

/** A nats-server this process started on 127.0.0.1, with a generated password. */
export interface LocalNats {
  /** nats://llmserve:<password>@127.0.0.1:<port> */
  readonly url: string;
  stop(): Promise<void>;
  /** Signals it to stop, without waiting: for this process's exit. */
  kill(): void;
}

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Starts nats-server (as `deno task cluster` finds it) and waits until it listens. */
export async function startLocalNats(): Promise<LocalNats> {
  const bin = findNatsServer();
  if (bin === undefined) {
    throw new Error(
      "Cannot start the pipeline's nats-server: it is not on PATH nor in /usr/local/sbin, /usr/sbin or /sbin " +
        "(apt-get install nats-server, or set NATS_SERVER), and no --nats was given",
    );
  }
  const dir = await Deno.makeTempDir({ prefix: "llmserve_pipeline_nats_" });
  const port = freePort(), password = crypto.randomUUID();
  await Deno.writeTextFile(
    `${dir}/nats.conf`,
    `listen: 127.0.0.1:${port}\nauthorization { user: llmserve, password: "${password}" }\n`,
  );
  const child = new Deno.Command(bin, {
    args: ["-c", `${dir}/nats.conf`],
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
  const stop = async () => {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
    await child.status;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  for (let i = 0;; i++) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      break;
    } catch {
      if (i > 100) {
        await stop();
        throw new Error(`nats-server ${bin} did not listen on 127.0.0.1:${port} within 10 s`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const kill = () => {
    try {
      child.kill("SIGTERM");
    } catch { /* gone */ }
  };
  return { url: `nats://llmserve:${password}@127.0.0.1:${port}`, stop, kill };
}
