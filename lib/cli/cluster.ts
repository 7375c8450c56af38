import { childArgs } from "./launch.ts";
import { LAUNCHER_GONE, PARENT_PIPE_ENV, whenLauncherGone } from "./parent_watch.ts";
import { STOP_SIGNALS } from "./stop_deadline.ts";
import { parseRouterArgs, routerNeeds } from "./router.ts";
import { parseServeArgs, serveNeeds } from "./serve_args.ts";
import { runtimeDirEnv } from "../util/runtime_dir.ts";
import { resolveDataDir } from "../batch/data_dir.ts";
import { parseSettings } from "./flag_parser.ts";
import { printInfo } from "./help.ts";

/** A process of the cluster, its stderr prefixed with its name on ours. */
interface Member {
  readonly name: string;
  readonly child: Deno.ChildProcess;
  readonly status: Promise<Deno.CommandStatus>;
  /** Resolves once its stderr has ended (all its lines are out). */
  readonly logged: Promise<void>;
  /** Its stdin is a pipe from here (a Deno member). */
  readonly piped: boolean;
}

/**
 * Each member runs in its own session (`detached`), so a Ctrl-C at the terminal reaches only
 * this process, which stops the members once each and in order; the terminal's SIGINT would
 * otherwise reach nats-server and every replica at once, and the SIGTERM after it would be a
 * replica's second signal, which cuts its drain short. The Deno members read a pipe from here
 * as stdin (`PARENT_PIPE_ENV`): should this process die without a word, they drain and exit.
 */
function spawnMember(
  name: string,
  cmd: string,
  args: string[],
  deno: boolean,
  env: Record<string, string> = {},
): Member {
  const child = new Deno.Command(cmd, {
    args,
    stdin: deno ? "piped" : "null",
    stdout: "null",
    stderr: "piped",
    detached: true,
    env: { ...runtimeDirEnv(), ...(deno ? { [PARENT_PIPE_ENV]: "1" } : {}), ...env },
  }).spawn();
  const logged = (async () => {
    const lines = child.stderr.pipeThrough(new TextDecoderStream());
    let rest = "";
    for await (const chunk of lines) {
      const parts = (rest + chunk).split("\n");
      rest = parts.pop()!;
      for (const line of parts) if (line !== "") console.error(`[${name}] ${line}`);
    }
    if (rest !== "") console.error(`[${name}] ${rest}`);
  })().catch(() => {});
  return { name, child, status: child.status, logged, piped: deno };
}

/** nats-server: `$NATS_SERVER`, else on PATH, else in the sbin folders a user's PATH often lacks. */
export function findNatsServer(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
  sbin: readonly string[] = ["/usr/local/sbin", "/usr/sbin", "/sbin"],
): string | undefined {
  const given = env("NATS_SERVER");
  if (given) return given;
  const dirs = [...(env("PATH") ?? "").split(":"), ...sbin];
  for (const dir of dirs) {
    if (dir === "") continue;
    try {
      const st = Deno.statSync(`${dir}/nats-server`);
      if (st.isFile && ((st.mode ?? 0o111) & 0o111) !== 0) return `${dir}/nats-server`;
    } catch {
      // not here
    }
  }
  return undefined;
}

async function waitForPort(port: number, ms: number, exited: Promise<unknown>): Promise<void> {
  let gone = false;
  exited.then(() => gone = true);
  const end = performance.now() + ms;
  for (;;) {
    try {
      (await Deno.connect({ hostname: "127.0.0.1", port })).close();
      return;
    } catch {
      if (gone) throw new Error(`nats-server exited before listening on 127.0.0.1:${port}`);
      if (performance.now() > end) {
        throw new Error(`nats-server did not listen on 127.0.0.1:${port} within ${ms} ms`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

async function stop(m: Member): Promise<void> {
  try {
    m.child.kill("SIGTERM");
  } catch { /* already gone */ }
  await m.status;
  await m.logged;
  if (m.piped) await m.child.stdin.close().catch(() => {});
}

/** Replica `i`'s (from 0) own data folder under the cluster's. */
export function replicaDataDir(dataRoot: string, i: number): string {
  return `${dataRoot}/replica-${i + 1}`;
}

/** `cluster` command: nats-server, N replicas and a router on this machine. */
export async function clusterCommand(argv: string[]): Promise<number> {
  const dash = argv.indexOf("--");
  const own = dash < 0 ? argv : argv.slice(0, dash);
  const serveFlags = dash < 0 ? [] : argv.slice(dash + 1);
  if (printInfo("cluster", own)) return 0;
  const { replicas, port, natsPort } = parseSettings("cluster", own);
  const bin = findNatsServer();
  if (bin === undefined) {
    throw new Error(
      "Cannot start the cluster: nats-server is not on PATH nor in /usr/local/sbin, /usr/sbin " +
        "or /sbin. Install Debian's nats-server (apt-get install nats-server), or without root: " +
        '(cd "$(mktemp -d)" && apt-get download nats-server && dpkg-deb -x nats-server_*.deb ~/nats), then ' +
        "NATS_SERVER=~/nats/usr/sbin/nats-server",
    );
  }
  const dir = await Deno.makeTempDir({ prefix: "llmserve_cluster_" });
  const password = crypto.randomUUID();
  await Deno.writeTextFile(
    `${dir}/nats.conf`,
    `listen: 127.0.0.1:${natsPort}\nauthorization { user: llmserve, password: "${password}" }\n` +
      // JetStream holds the replicas' shared result cache (a key-value bucket).
      `jetstream { store_dir: "${dir}/jetstream" }\n`,
  );
  const url = `nats://llmserve:${password}@127.0.0.1:${natsPort}`;
  const env = (n: string) => Deno.env.get(n);
  // The URL, password and all, reaches the replicas and the router in their environment
  // (LLMSERVE_NATS): every user of the machine can read a process's command line, not its
  // environment. The flags are validated here with it, so a bad replica flag is one error
  // rather than N replicas failing, and the permissions cover the NATS address.
  // The shared result cache's secret likewise (one per cluster run, unless the user set one).
  const childEnv = {
    LLMSERVE_NATS: url,
    LLMSERVE_SHARED_CACHE_SECRET: env("LLMSERVE_SHARED_CACHE_SECRET") ?? crypto.randomUUID(),
  };
  const served = parseServeArgs(["--port", "0", "--nats", url, ...serveFlags]);
  // One server per data directory: each replica keeps its files and batches in its own
  // folder under the one given (or the default), the same one on every run so batches resume.
  const dataRoot = resolveDataDir(served.dataDir, env);
  const replicaArgs = Array.from({ length: replicas }, (_, i) => {
    const argv = ["--port", "0", ...serveFlags, "--data-dir", replicaDataDir(dataRoot, i)];
    return childArgs("serve", argv, serveNeeds(parseServeArgs([...argv, "--nats", url])), env);
  });
  // The router keeps the Batch API's files and batches in its own folder beside the replicas'.
  const routerArgv = ["--port", String(port), "--data-dir", `${dataRoot}/router`];
  const routerArgs = childArgs(
    "router",
    routerArgv,
    routerNeeds(parseRouterArgs([...routerArgv, "--nats", url])),
    env,
  );
  let nats: Member | undefined;
  const replicaMembers: Member[] = [];
  let router: Member | undefined;
  let signalled = false;
  const stopped = new Promise<void>((resolve) => {
    const onSignal = () => {
      signalled = true;
      resolve();
    };
    for (const s of STOP_SIGNALS) Deno.addSignalListener(s, onSignal);
    // Its launcher killed without a word: stop every member as on SIGTERM, rather than leave
    // nats-server, the replicas and the router running with nobody to stop them.
    whenLauncherGone(() => {
      console.error(`cluster: ${LAUNCHER_GONE}; stopping as on SIGTERM`);
      onSignal();
    });
  });
  try {
    try {
      nats = spawnMember("nats", bin, ["-c", `${dir}/nats.conf`], false);
    } catch (e) {
      throw new Error(`Cannot start nats-server ${bin}: ${(e as Error).message}`);
    }
    await waitForPort(natsPort, 10_000, nats.status);
    for (let i = 0; i < replicas; i++) {
      replicaMembers.push(
        spawnMember(`replica ${i + 1}`, Deno.execPath(), replicaArgs[i]!, true, childEnv),
      );
    }
    router = spawnMember("router", Deno.execPath(), routerArgs, true, childEnv);
    const members = [nats, ...replicaMembers, router];
    const ended = await Promise.race([
      stopped.then(() => undefined),
      ...members.map((m) => m.status.then(() => m)),
    ]);
    if (ended !== undefined && !signalled) {
      console.error(`cluster: ${ended.name} exited on its own; stopping the others`);
      return 1;
    }
    return 0;
  } finally {
    // The router first (its streams need the replicas), then every replica at once (each
    // drains its in-flight work), then NATS, which the draining replicas still talk to.
    if (router) await stop(router);
    await Promise.all(replicaMembers.map(stop));
    if (nats) await stop(nats);
    console.error("cluster: stopped");
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
