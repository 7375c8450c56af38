/**
 * Test helper: a real cluster on loopback as child processes: nats-server with authentication
 * on, replicas (`main.ts serve --nats`, CPU backend, stories260K) and routers
 * (`main.ts router`). Everything started is killed by dispose().
 */
import { metricValue, scrape } from "./_http_harness.ts";
import { type ServeChild, spawnServer, spawnUntilListening } from "./_serve_child.ts";

const NATS_USER = "llmserve";
const NATS_PASS = "s3cret-test-pass";

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

async function canConnect(port: number): Promise<boolean> {
  try {
    const c = await Deno.connect({ hostname: "127.0.0.1", port });
    c.close();
    return true;
  } catch {
    return false;
  }
}

/** Polls `cond` every 50 ms until it holds; throws with `what` after timeoutMs. */
export async function until(
  what: string,
  cond: () => boolean | Promise<boolean>,
  timeoutMs = 15_000,
): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await cond())) {
    if (performance.now() > end) {
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

export class NatsServer {
  child: Deno.ChildProcess | undefined;
  constructor(readonly port: number, readonly dir: string) {}

  /** URL with the credentials, as replicas and routers are given it. */
  get url(): string {
    return `nats://${NATS_USER}:${NATS_PASS}@127.0.0.1:${this.port}`;
  }

  static async start(): Promise<NatsServer> {
    const dir = await Deno.makeTempDir({ prefix: "llmserve_nats_" });
    const s = new NatsServer(freePort(), dir);
    await s.restart();
    return s;
  }

  /** Starts (again, on the same port) and waits until it accepts connections. */
  async restart(): Promise<void> {
    const conf = `${this.dir}/nats.conf`;
    await Deno.writeTextFile(
      conf,
      `listen: 127.0.0.1:${this.port}\nauthorization { user: "${NATS_USER}", password: "${NATS_PASS}" }\n` +
        // JetStream, as `deno task cluster` runs it: the shared result cache's bucket lives there.
        `jetstream { store_dir: "${this.dir}/jetstream" }\n`,
    );
    // NATS_SERVER: the path the test set-up found or installed (default: nats-server on PATH).
    const bin = Deno.env.get("NATS_SERVER") ?? "nats-server";
    this.child = new Deno.Command(bin, { args: ["-c", conf], stdout: "null", stderr: "null" })
      .spawn();
    await until("nats-server to listen", () => canConnect(this.port), 10_000);
  }

  async stop(): Promise<void> {
    const c = this.child;
    this.child = undefined;
    if (c === undefined) return;
    try {
      c.kill("SIGKILL");
    } catch { /* already gone */ }
    await c.status;
  }
}

export interface Member extends ServeChild {
  readonly role: "replica" | "router";
}

export class Cluster implements AsyncDisposable {
  readonly members = new Set<Member>();
  constructor(readonly nats: NatsServer) {}

  static async start(): Promise<Cluster> {
    return new Cluster(await NatsServer.start());
  }

  async replica(extra: string[] = []): Promise<Member> {
    const m = {
      ...(await spawnServer(["--nats", this.nats.url, ...extra])),
      role: "replica" as const,
    };
    this.members.add(m);
    return m;
  }

  /** A replica serving another model file (its whole command line after `serve`). */
  async replicaServing(args: string[]): Promise<Member> {
    return await this.#spawnMain("serve", "replica", args);
  }

  async router(extra: string[] = []): Promise<Member> {
    return await this.#spawnMain("router", "router", extra);
  }

  /** `main.ts <command> --nats <this cluster> --port 0 <args>`, once it listens. */
  async #spawnMain(command: string, role: Member["role"], args: string[]): Promise<Member> {
    const child = await spawnUntilListening([
      "run",
      "--allow-all",
      new URL("../main.ts", import.meta.url).pathname,
      command,
      "--nats",
      this.nats.url,
      "--port",
      "0",
      ...args,
    ]);
    const m = { ...child, role };
    this.members.add(m);
    return m;
  }

  /** Waits until the router counts `n` replicas ready (and none draining or stale if exact). */
  async routerSees(
    router: Member,
    n: number,
    timeoutMs = 15_000,
    headers: HeadersInit = {},
  ): Promise<void> {
    await until(`router to see ${n} ready replicas`, async () => {
      const text = await scrape(router.base, headers).catch(() => "");
      return metricValue(text, 'llm_router_replicas{state="ready"}') === n;
    }, timeoutMs);
  }

  async kill(m: Member, signal: Deno.Signal): Promise<Deno.CommandStatus> {
    try {
      m.child.kill(signal);
    } catch { /* already gone */ }
    const status = await m.child.status;
    this.members.delete(m);
    await m.log();
    return status;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const m of this.members) {
      try {
        m.child.kill("SIGKILL");
      } catch { /* already gone */ }
    }
    for (const m of this.members) {
      await m.child.status;
      const log = await m.log();
      // CLUSTER_LOGS=1 shows what every member wrote, for debugging a failure.
      if (Deno.env.get("CLUSTER_LOGS") === "1") console.error(`--- ${m.role} ${m.base}\n${log}`);
    }
    this.members.clear();
    await this.nats.stop();
    await Deno.remove(this.nats.dir, { recursive: true }).catch(() => {});
  }
}
