import { parseArgs } from "@std/cli/parse-args";

const USAGE =
  `Usage: deno task cluster [--replicas N] [--port P] [--nats-port Q] [-- serve flags...]
  Starts, for a local try: nats-server with a generated password on 127.0.0.1:Q (default
  4222), N replicas (default 2; each also on its own free HTTP port) and a router on P
  (default 8000). Flags after -- go to every replica (e.g. -- --backend cpu). Ctrl-C drains
  and stops everything.`;

function spawnLogged(name: string, cmd: string, args: string[]): Deno.ChildProcess {
  const child = new Deno.Command(cmd, { args, stdout: "null", stderr: "piped" }).spawn();
  (async () => {
    const lines = child.stderr.pipeThrough(new TextDecoderStream());
    for await (const chunk of lines) {
      for (const line of chunk.split("\n")) if (line !== "") console.error(`[${name}] ${line}`);
    }
  })().catch(() => {});
  return child;
}

async function waitForPort(port: number, ms: number): Promise<void> {
  const end = performance.now() + ms;
  for (;;) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      return;
    } catch {
      if (performance.now() > end) {
        throw new Error(`nats-server did not listen on 127.0.0.1:${port} within ${ms} ms`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** `cluster` command: nats-server, N replicas and a router on this machine. */
export async function clusterCommand(argv: string[]): Promise<number> {
  const dash = argv.indexOf("--");
  const own = dash < 0 ? argv : argv.slice(0, dash);
  const serveFlags = dash < 0 ? [] : argv.slice(dash + 1);
  const flags = parseArgs(own, {
    string: ["replicas", "port", "nats-port"],
    boolean: ["help"],
    default: { replicas: "2", port: "8000", "nats-port": "4222" },
  });
  if (flags.help) {
    console.log(USAGE);
    return 0;
  }
  const replicas = Number(flags.replicas);
  if (!Number.isInteger(replicas) || replicas < 1) {
    throw new Error(`--replicas must be a positive integer, received ${flags.replicas}\n${USAGE}`);
  }
  const natsPort = Number(flags["nats-port"]);
  const dir = await Deno.makeTempDir({ prefix: "llmserve_cluster_" });
  const password = crypto.randomUUID();
  await Deno.writeTextFile(
    `${dir}/nats.conf`,
    `listen: 127.0.0.1:${natsPort}\nauthorization { user: llmserve, password: "${password}" }\n`,
  );
  const children: Deno.ChildProcess[] = [];
  try {
    try {
      const bin = Deno.env.get("NATS_SERVER") ?? "nats-server";
      children.push(spawnLogged("nats", bin, ["-c", `${dir}/nats.conf`]));
    } catch (e) {
      throw new Error(
        `Cannot start nats-server (${
          (e as Error).message
        }); install it (Debian: apt-get install nats-server)`,
      );
    }
    await waitForPort(natsPort, 10_000);
    const url = `nats://llmserve:${password}@127.0.0.1:${natsPort}`;
    const main = new URL("../../main.ts", import.meta.url).pathname;
    for (let i = 0; i < replicas; i++) {
      children.push(spawnLogged(`replica ${i + 1}`, Deno.execPath(), [
        "run",
        "-A",
        main,
        "serve",
        "--port",
        "0",
        "--nats",
        url,
        ...serveFlags,
      ]));
    }
    children.push(spawnLogged("router", Deno.execPath(), [
      "run",
      "-A",
      main,
      "router",
      "--port",
      String(flags.port),
      "--nats",
      url,
    ]));
    const stop = new Promise<void>((resolve) => {
      for (const s of ["SIGINT", "SIGTERM"] as const) Deno.addSignalListener(s, () => resolve());
    });
    await Promise.race([stop, ...children.map((c) => c.status)]);
    return 0;
  } finally {
    // Router first, then replicas (they drain), then NATS.
    for (const c of [...children].reverse()) {
      try {
        c.kill("SIGTERM");
      } catch { /* gone */ }
      await c.status;
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
