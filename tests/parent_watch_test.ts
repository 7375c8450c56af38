/**
 * A server started through the real launcher (`main.ts launch serve`) ends when the launcher is
 * killed without a word (SIGKILL), at every point of its life: still starting, loading its
 * model, serving, a replica connected to NATS, with NATS gone, mid-stream, and while draining
 * with NATS frozen; and a router (`main.ts launch router`) still waiting for a replica. Each case polls the server's /proc entry until it is gone, within the bound
 * the launcher promises (--drain-timeout + EXIT_GRACE_SECONDS, and start-up time), and reads
 * from its log that it drained rather than ran into that deadline.
 */
import { assert, assertStringIncludes } from "@std/assert";
import { LAUNCHER_GONE } from "../lib/cli/parent_watch.ts";
import { EXIT_GRACE_SECONDS, STOP_OVERRAN } from "../lib/cli/stop_deadline.ts";
import { NatsServer, until } from "./_cluster.ts";
import { modelFile } from "./harness/model_files.ts";

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const MODEL = "stories260K-q8_0.gguf";
const DRAIN_S = 2;
/** What the launcher promises after its death, plus a server's start-up on a loaded machine. */
const EXIT_BOUND_MS = (DRAIN_S + EXIT_GRACE_SECONDS + 5) * 1000;

/** pid, parent and start time of a process, from /proc/<pid>/stat; undefined once reaped. */
function procStat(pid: number): { ppid: number; state: string; start: string } | undefined {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return { state: f[0]!, ppid: Number(f[1]), start: f[19]! };
  } catch {
    return undefined;
  }
}

/** The process the launcher `pid` started (its only child), once there is one. */
async function childOf(pid: number): Promise<number> {
  let child: number | undefined;
  await until("the launcher to start the server", () => {
    for (const e of Deno.readDirSync("/proc")) {
      if (/^\d+$/.test(e.name) && procStat(Number(e.name))?.ppid === pid) child = Number(e.name);
    }
    return child !== undefined;
  });
  return child!;
}

/** A server through the launcher; its stderr (shared with the launcher) is read as it comes. */
interface Launched {
  readonly launcher: Deno.ChildProcess;
  /** The serve process. */
  readonly pid: number;
  /** Resolves with the first match of `re` in the log so far or to come. */
  line(re: RegExp, timeoutMs?: number): Promise<RegExpExecArray>;
  /** The log so far. */
  logged(): string;
  /** The whole log, once every writer (the server last) has exited. */
  readonly ended: Promise<string>;
}

/** `main.ts launch serve` on the cpu backend, a free port and a small KV pool, then `args`. */
function launch(args: string[], env: Record<string, string> = {}): Promise<Launched> {
  return launchCommand(
    ["serve", "--port", "0", "--backend", "cpu", "--kv-memory", "1MiB", ...args],
    env,
  );
}

async function launchCommand(
  argv: string[],
  env: Record<string, string> = {},
): Promise<Launched> {
  const launcher = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", MAIN, "launch", ...argv, "--drain-timeout", String(DRAIN_S)],
    env: { MODEL_MIRROR: "", ...env },
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  const ended = (async () => {
    for await (const chunk of launcher.stderr.pipeThrough(new TextDecoderStream())) log += chunk;
    return log;
  })();
  const pid = await childOf(launcher.pid);
  const line = async (re: RegExp, timeoutMs = 30_000) => {
    await until(`the log to show ${re}`, () => re.test(log), timeoutMs);
    return re.exec(log)!;
  };
  return { launcher, pid, line, logged: () => log, ended };
}

/** SIGKILLs the launcher, then waits for the server to be gone (exited: reaped or a zombie). */
async function killLauncherAndWait(s: Launched): Promise<{ log: string }> {
  const before = procStat(s.pid);
  if (before === undefined) {
    throw new Error("the server should be running when its launcher is killed");
  }
  s.launcher.kill("SIGKILL");
  await s.launcher.status;
  const exited = () => {
    const now = procStat(s.pid);
    return now === undefined || now.start !== before.start || now.state === "Z";
  };
  try {
    await until(`server ${s.pid} to exit after its launcher's SIGKILL`, exited, EXIT_BOUND_MS);
  } catch (e) {
    // Not left behind by a failing run.
    if (!exited()) Deno.kill(s.pid, "SIGKILL");
    throw e;
  }
  const log = await s.ended;
  // It stopped because it saw its launcher gone, and ended by draining, not by the deadline.
  assertStringIncludes(log, LAUNCHER_GONE);
  assert(!log.includes(STOP_OVERRAN), log);
  return { log };
}

async function withModelsDir<T>(f: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "parent_watch_test_" });
  try {
    return await f(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a launcher killed before its server has started: the server stops as soon as it is up", async () => {
  const s = await launch(["--model", modelFile(MODEL)]);
  // The server process exists, but Deno is still loading its modules: it has not bound yet.
  assert(!s.logged().includes("listening"), s.logged());
  const { log } = await killLauncherAndWait(s);
  assertStringIncludes(log, "llmserve listening on");
});

Deno.test("a launcher killed while its server downloads the model: the load is abandoned", async () => {
  const bytes = await Deno.readFile(modelFile(MODEL));
  // Sends the first 64 KiB of the file and then nothing: the download never finishes.
  let stall: ReadableStreamDefaultController<Uint8Array> | undefined;
  const files = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () =>
    new Response(
      new ReadableStream<Uint8Array>({
        start(c) {
          stall = c;
          c.enqueue(bytes.slice(0, 65536));
        },
      }),
      { headers: { "content-length": String(bytes.length) } },
    ));
  try {
    await withModelsDir(async (dir) => {
      const s = await launch(
        ["--model", `http://127.0.0.1:${files.addr.port}/files/slow.gguf`],
        { MODELS_DIR: dir },
      );
      const base = (await s.line(/listening on (http:\/\/\S+?)\//))[1]!;
      await until("the server to report the download under way", async () => {
        const h = await (await fetch(`${base}/health`)).json();
        return h.phase === "downloading" && h.bytes > 0;
      });
      const { log } = await killLauncherAndWait(s);
      assertStringIncludes(log, "stopped before the model finished loading");
    });
  } finally {
    try {
      stall?.close();
    } catch { /* the server's end already cancelled it */ }
    await files.shutdown();
  }
});

Deno.test("a launcher killed while its server is ready: the server drains and exits", async () => {
  const s = await launch(["--model", modelFile(MODEL)]);
  await s.line(/url\s+http/);
  const { log } = await killLauncherAndWait(s);
  assertStringIncludes(log, "drained: all in-flight generations finished");
});

Deno.test("a launcher killed while its server of several models is ready: the server drains and exits", async () => {
  const s = await launch(["--model", modelFile(MODEL), "--model", modelFile("stories260K.gguf")]);
  await s.line(/url\s+http/);
  const { log } = await killLauncherAndWait(s);
  assertStringIncludes(log, "drained: all in-flight generations finished");
});

/** A replica through the launcher on `nats`, once it is ready; its id from its start-up lines. */
async function replica(nats: NatsServer): Promise<Launched & { id: string }> {
  const s = await launch(["--model", modelFile(MODEL)], { LLMSERVE_NATS: nats.url });
  const id = (await s.line(/replica\s+(replica-\w+) on NATS/))[1]!;
  await s.line(/url\s+http/);
  return { ...s, id };
}

Deno.test("a launcher killed while its replica is connected to NATS: the replica drains and exits", async () => {
  const nats = await NatsServer.start();
  try {
    const s = await replica(nats);
    const { log } = await killLauncherAndWait(s);
    assertStringIncludes(log, "replica drained: all NATS streams finished");
    assertStringIncludes(log, "drained: all in-flight generations finished");
  } finally {
    await nats.stop();
  }
});

Deno.test("a launcher killed while its replica's NATS server is down: the replica drains and exits", async () => {
  const nats = await NatsServer.start();
  try {
    const s = await replica(nats);
    await nats.stop();
    await s.line(/nats disconnect/);
    const { log } = await killLauncherAndWait(s);
    assertStringIncludes(log, "replica drained: all NATS streams finished");
  } finally {
    await nats.stop();
  }
});

/**
 * Starts a stream on the replica as a router would, granting credit for two frames only: the
 * replica sends "started" and one token, then waits for more credit (up to 30 s).
 */
async function streamWaitingForCredit(nats: NatsServer, replicaId: string) {
  const { connectNats } = await import("../lib/cluster/nats_connection.ts");
  const nc = await connectNats({ url: nats.url, name: "router-stand-in" });
  const frames: { event: { type: string } }[] = [];
  nc.subscribe("parent-watch-test.frames", {
    callback: (_e, m) => void frames.push(m.json()),
  });
  nc.publish(
    `llmserve.replica.${replicaId}`,
    new TextEncoder().encode(JSON.stringify({
      type: "generate",
      stream: "s-held",
      replyTo: "parent-watch-test.frames",
      prompt: [1, 403],
      maxTokens: 100,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
      stop: [],
      priority: "interactive",
      requestId: "held",
      logprobs: false,
      credit: 2,
    })),
  );
  await until(
    "the replica to send its first token",
    () => frames.some((f) => f.event.type === "token"),
  );
  return nc;
}

Deno.test("a launcher killed mid-stream: the replica ends the stream at its drain deadline and exits", async () => {
  const nats = await NatsServer.start();
  try {
    const s = await replica(nats);
    const nc = await streamWaitingForCredit(nats, s.id);
    try {
      const { log } = await killLauncherAndWait(s);
      assertStringIncludes(log, "replica drained: 1 aborted");
    } finally {
      await nc.close();
    }
  } finally {
    await nats.stop();
  }
});

Deno.test("a launcher killed during the drain, with NATS frozen: the replica still exits", async () => {
  const nats = await NatsServer.start();
  try {
    const s = await replica(nats);
    const nc = await streamWaitingForCredit(nats, s.id);
    // The launcher passes SIGTERM on; the held stream keeps the drain going.
    s.launcher.kill("SIGTERM");
    await s.line(/SIGTERM: draining/);
    // A server that is up but answers nothing: the replica's goodbye is never acknowledged.
    Deno.kill(nats.child!.pid, "SIGSTOP");
    try {
      const { log } = await killLauncherAndWait(s);
      assertStringIncludes(log, "replica drained: 1 aborted");
    } finally {
      Deno.kill(nats.child!.pid, "SIGCONT");
      await nc.close();
    }
  } finally {
    await nats.stop();
  }
});

Deno.test("a launcher killed while its router waits for a replica: the router exits at once", async () => {
  const nats = await NatsServer.start();
  try {
    const s = await launchCommand(["router", "--port", "0"], { LLMSERVE_NATS: nats.url });
    await s.line(/waiting for a replica/);
    const { log } = await killLauncherAndWait(s);
    assertStringIncludes(log, "stopping before it listens");
  } finally {
    await nats.stop();
  }
});
