/**
 * `deno task cluster` and `deno task router` go through the launcher like `start`: a SIGTERM to
 * `npx` (which passes no signal on) or a Ctrl-C at the terminal stops the router, drains every
 * replica once, stops nats-server last, and leaves no process behind.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { modelMirror } from "./harness/model_files.ts";
import { findNatsServer } from "../lib/cli/cluster.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const NATS = Deno.env.get("NATS_SERVER") ?? "nats-server";

function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Processes whose command line contains `marker`, but not this test runner itself. */
function processesWith(marker: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name) || Number(e.name) === Deno.pid) continue;
    try {
      const argv = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0").join(" ");
      if (argv.includes(marker)) out.push(`${e.name}: ${argv}`);
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch {
    return false;
  }
}

async function noneLeft(markers: string[]): Promise<void> {
  for (let i = 0; i < 200; i++) {
    if (markers.every((m) => processesWith(m).length === 0)) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  assertEquals(markers.flatMap(processesWith), [], "processes left behind");
}

/** stderr of `child` as it comes, and a way to wait for a line. */
function lines(child: Deno.ChildProcess) {
  let text = "";
  const waiters: (() => void)[] = [];
  const done = (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      text += chunk;
      for (const w of waiters.splice(0)) w();
    }
  })();
  return {
    get text() {
      return text;
    },
    done,
    async waitFor(re: RegExp, timeoutMs: number): Promise<RegExpExecArray> {
      const end = performance.now() + timeoutMs;
      for (;;) {
        const m = re.exec(text);
        if (m) return m;
        if (performance.now() > end) throw new Error(`no ${re} within ${timeoutMs} ms:\n${text}`);
        await new Promise<void>((r) => {
          waiters.push(r);
          setTimeout(r, 200);
        });
      }
    },
  };
}

for (const how of ["SIGTERM to npx", "Ctrl-C (SIGINT to the terminal's process group)"] as const) {
  Deno.test(`deno task cluster: ${how} lets a stream's generation finish (no password on a command line), drains each replica once, stops nats-server last, leaves nothing`, async () => {
    const natsPort = freePort();
    const marker = `cluster-test-${crypto.randomUUID().slice(0, 8)}`;
    const dataDir = await Deno.makeTempDir({ prefix: "cluster_launch_data_" });
    const child = new Deno.Command("npx", {
      args: [
        "-y",
        "deno@2.9.6",
        "task",
        "cluster",
        "--replicas",
        "2",
        "--port",
        "0",
        "--nats-port",
        String(natsPort),
        "--",
        "--backend",
        "cpu",
        "--kv-memory",
        "2MiB",
        "--served-model-name",
        marker,
        "--data-dir",
        dataDir,
      ],
      cwd: ROOT,
      env: { MODEL_MIRROR: modelMirror(), NATS_SERVER: NATS },
      stdout: "null",
      stderr: "piped",
      // Its own process group, as a shell gives a foreground job: the Ctrl-C case signals it.
      detached: true,
    }).spawn();
    const log = lines(child);
    let natsConf: string | undefined;
    try {
      const url = (await log.waitFor(/\[router\]\s+url\s+(http:\/\/\S+?)\//, 120_000))[1]!;
      const replicas = processesWith(marker).filter((p) => p.includes(" serve "));
      assertEquals(replicas.length, 2, `${processesWith(marker).join("\n")}\n${log.text}`);
      // This cluster's nats-server: the one whose generated config listens on natsPort.
      natsConf = processesWith("llmserve_cluster_").map((p) => /-c (\S+nats\.conf)/.exec(p)?.[1])
        .find((c) => {
          try {
            return c !== undefined && Deno.readTextFileSync(c).includes(`127.0.0.1:${natsPort}\n`);
          } catch {
            return false;
          }
        });
      assert(natsConf !== undefined, "the cluster's nats-server runs");
      // The generated password reaches the members in their environment, never on a command
      // line that `ps` shows every user.
      const password = /password: "([^"]+)"/.exec(Deno.readTextFileSync(natsConf!))![1]!;
      assertEquals(processesWith(password), [], "a command line holds the NATS password");
      // Both replicas serving, so that each has a drain to run: the router is up as soon as one
      // is, and a replica still loading when the signal comes stops without one.
      for (const r of [1, 2]) {
        await log.waitFor(new RegExp(`\\[replica ${r}\\] llmserve ready`), 120_000);
      }
      // One server per data directory: each replica has its own folder under the one given.
      for (const r of [1, 2]) {
        const m = await log.waitFor(new RegExp(`\\[replica ${r}\\]\\s+batches\\s+(\\S+)`), 10_000);
        assertEquals(m[1], `${dataDir}/replica-${r}`);
      }
      // A stream in flight when the signal comes: the router's drain lets it generate to its end.
      const res = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: "Once upon a time", max_tokens: 400, stream: true }),
      });
      assertEquals(res.status, 200);
      const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      let body = (await reader.read()).value ?? "";
      if (how === "SIGTERM to npx") child.kill("SIGTERM");
      else Deno.kill(-child.pid, "SIGINT");
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          body += value;
        }
      } catch {
        // serveService's drain closes the connection as soon as the generation has finished,
        // which can cut the stream's last chunks (issue 21's drain work); the log shows below
        // that the generation ran to its end (its length or the model's end of text).
      }
      assertStringIncludes(body, "data: {");
      await child.status;
      await log.done;
    } finally {
      try {
        Deno.kill(-child.pid, "SIGKILL");
      } catch { /* gone */ }
    }
    const out = log.text;
    await Deno.remove(dataDir, { recursive: true });
    await noneLeft([marker, `127.0.0.1:${natsPort}`, natsConf!]);
    assert(!(await exists(natsConf!)), "the cluster's temporary folder is removed");
    for (const r of ["replica 1", "replica 2"]) {
      const own = out.split("\n").filter((l) => l.startsWith(`[${r}]`));
      assertEquals(
        own.filter((l) => l.includes("drained: all in-flight generations finished")).length,
        1,
        own.join("\n"),
      );
      assert(
        !own.some((l) => l.includes("second signal")),
        `${r} was signalled twice:\n${own.join("\n")}`,
      );
    }
    // nats-server's exit comes after both replicas have drained.
    const lastDrain = Math.max(
      ...["replica 1", "replica 2"].map((r) => out.lastIndexOf(`[${r}] drained:`)),
    );
    const natsExit = out.search(/\[nats\].*(Server Exiting|Exiting)/);
    assert(natsExit > lastDrain, `nats-server stopped before a replica drained:\n${out}`);
    assertStringIncludes(out, "cluster: stopped");
    assert(/\[router\] \S+ POST \/v1\/completions 200 .*completion=[1-9]\d* /.test(out), out);
    assertStringIncludes(out, "[router] drained: all in-flight generations finished");
  });
}

Deno.test("the cluster's launcher killed outright (SIGKILL): cluster stops every member and leaves nothing", async () => {
  const natsPort = freePort();
  const marker = `cluster-test-${crypto.randomUUID().slice(0, 8)}`;
  // The launcher itself (what `deno task cluster` runs), so that SIGKILL reaches it alone.
  const launcher = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      `${ROOT}main.ts`,
      "launch",
      "cluster",
      "--replicas",
      "1",
      "--port",
      "0",
      "--nats-port",
      String(natsPort),
      "--",
      "--backend",
      "cpu",
      "--kv-memory",
      "2MiB",
      "--served-model-name",
      marker,
    ],
    cwd: ROOT,
    env: { MODEL_MIRROR: modelMirror(), NATS_SERVER: NATS },
    stdout: "null",
    stderr: "piped",
  }).spawn();
  // The cluster process holds the launcher's stderr: it ends once cluster has exited.
  const log = lines(launcher);
  try {
    await log.waitFor(/\[router\]\s+url\s+http/, 120_000);
    await log.waitFor(/\[replica 1\] llmserve ready/, 120_000);
    launcher.kill("SIGKILL");
    await launcher.status;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      log.done,
      new Promise((_, reject) => {
        timer = setTimeout(
          () =>
            reject(
              new Error(`cluster still running 60 s after its launcher's SIGKILL:\n${log.text}`),
            ),
          60_000,
        );
      }),
    ]).finally(() => clearTimeout(timer));
  } finally {
    try {
      launcher.kill("SIGKILL");
    } catch { /* gone */ }
    // A failing run leaves no cluster behind: SIGTERM stops it and its members.
    for (const p of processesWith(marker).filter((p) => / launch cluster | cluster /.test(p))) {
      try {
        Deno.kill(Number(p.split(":")[0]), "SIGTERM");
      } catch { /* gone */ }
    }
  }
  const out = log.text;
  assertStringIncludes(out, "cluster: launcher gone");
  assertStringIncludes(out, "[replica 1] replica drained: all NATS streams finished");
  assertStringIncludes(out, "[router] drained: all in-flight generations finished");
  assertStringIncludes(out, "cluster: stopped");
  await noneLeft([marker, `127.0.0.1:${natsPort}`]);
});

Deno.test("deno task router: a SIGTERM to npx leaves no router behind (the launcher stops it)", async () => {
  const natsPort = freePort();
  const nats = new Deno.Command(NATS, {
    args: ["-a", "127.0.0.1", "-p", String(natsPort)],
    stdout: "null",
    stderr: "null",
  }).spawn();
  try {
    const child = new Deno.Command("npx", {
      args: [
        "-y",
        "deno@2.9.6",
        "task",
        "router",
        "--nats",
        `nats://127.0.0.1:${natsPort}`,
        "--port",
        "0",
      ],
      cwd: ROOT,
      stdout: "null",
      stderr: "piped",
    }).spawn();
    const log = lines(child);
    // Connected and waiting for a replica: the router process (the launcher's child) runs.
    await log.waitFor(/router: connected to NATS/, 60_000);
    const router = processesWith(`nats://127.0.0.1:${natsPort}`).filter((p) =>
      p.includes("--no-prompt") && / router /.test(p)
    );
    assertEquals(router.length, 1, router.join("\n"));
    assertStringIncludes(router[0]!, "--allow-net=");
    child.kill("SIGTERM");
    await child.status;
    await log.done;
    await noneLeft([`nats://127.0.0.1:${natsPort}`]);
  } finally {
    nats.kill("SIGTERM");
    await nats.status;
  }
});

Deno.test("findNatsServer() takes $NATS_SERVER, then PATH, then the sbin folders a user's PATH lacks", async () => {
  const sbin = await Deno.makeTempDir();
  const onPath = await Deno.makeTempDir();
  try {
    const env = (vars: Record<string, string>) => (n: string) => vars[n];
    assertEquals(findNatsServer(env({ PATH: onPath }), [sbin]), undefined);
    await Deno.writeTextFile(`${sbin}/nats-server`, "#!/bin/sh\n", { mode: 0o755 });
    assertEquals(findNatsServer(env({ PATH: onPath }), [sbin]), `${sbin}/nats-server`);
    await Deno.writeTextFile(`${onPath}/nats-server`, "#!/bin/sh\n", { mode: 0o755 });
    assertEquals(findNatsServer(env({ PATH: onPath }), [sbin]), `${onPath}/nats-server`);
    assertEquals(findNatsServer(env({ PATH: onPath, NATS_SERVER: "/x/nats" }), [sbin]), "/x/nats");
    // A file that is not executable is not a program.
    await Deno.chmod(`${onPath}/nats-server`, 0o644);
    assertEquals(findNatsServer(env({ PATH: onPath }), [sbin]), `${sbin}/nats-server`);
  } finally {
    await Deno.remove(sbin, { recursive: true });
    await Deno.remove(onPath, { recursive: true });
  }
});
