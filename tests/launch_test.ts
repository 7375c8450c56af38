/**
 * The README's start and generate commands (`deno task start|generate`) under the permissions
 * the launcher derives from the configuration, and signals reaching the server through it.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";
import { type ServeChild, spawnUntilListening } from "./_serve_child.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const MODEL = "stories260K-q8_0.gguf";

/** Greedy text of the CPU reference on the q8_0 GGUF: the oracle for what the server says. */
async function expectedGreedy(prompt: string, n: number): Promise<string> {
  const model = await loadModel(modelFile(MODEL));
  const tok = new Tokenizer(model.tokenizer!);
  const engine = new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const { tokens } = await referenceGenerate(engine, tok.encode(prompt), n, GREEDY);
  return tok.decode(tokens);
}

/** A temp dir holding a copy of the q8_0 model under `sub`. */
async function dirWithModel(sub = ""): Promise<{ root: string; dir: string }> {
  const root = await Deno.makeTempDir({ prefix: "launch_test_" });
  const dir = sub === "" ? root : `${root}/${sub}`;
  await Deno.mkdir(dir, { recursive: true });
  await Deno.copyFile(modelFile(MODEL), `${dir}/${MODEL}`);
  return { root, dir };
}

/** `deno task start <args>` from the repository root, with no mirror unless `env` names one. */
function start(args: string[], env: Record<string, string>, command?: string): Promise<ServeChild> {
  const taskArgs = ["task", "start", "--port", "0", "--backend", "cpu", "--kv-memory", "1MiB"];
  return spawnUntilListening(
    command === undefined ? [...taskArgs, ...args] : ["-y", "deno@2.9.6", ...taskArgs, ...args],
    { cwd: ROOT, env: { MODEL_MIRROR: "", MODELS_DIR: "", ...env }, command },
  );
}

async function completion(base: string, prompt: string, n: number): Promise<string> {
  const res = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: n, temperature: 0 }),
  });
  assertEquals(res.status, 200);
  return (await res.json()).choices[0].text;
}

async function stopAndLog(s: ServeChild): Promise<string> {
  s.child.kill("SIGTERM");
  const status = await s.child.status;
  const log = await s.log();
  assertEquals(status.code, 0, log);
  return log;
}

const settings: {
  name: string;
  sub: string;
  env: (root: string) => Record<string, string>;
  args: (root: string, dir: string) => string[];
}[] = [
  {
    name: "MODELS_DIR",
    sub: "",
    env: (root) => ({ MODELS_DIR: root }),
    args: () => ["--model", "stories260K-q8_0"],
  },
  {
    name: "XDG_CACHE_HOME",
    sub: "llmserve/models",
    env: (root) => ({ XDG_CACHE_HOME: root }),
    args: () => ["--model", "stories260K-q8_0"],
  },
  {
    name: "--models-dir",
    sub: "elsewhere",
    env: () => ({}),
    args: (_root, dir) => ["--models-dir", dir, "--model", "stories260K-q8_0"],
  },
  {
    name: "--model /any/path.gguf",
    sub: "any/path",
    env: () => ({}),
    args: (_root, dir) => ["--model", `${dir}/${MODEL}`],
  },
  {
    // Another listen address than the default; 127.0.0.2 is on the loopback, like 10.x would
    // be on a LAN interface, and needs its own --allow-net entry all the same.
    name: "--host 127.0.0.2",
    sub: "",
    env: (root) => ({ MODELS_DIR: root }),
    args: () => ["--model", "stories260K-q8_0", "--host", "127.0.0.2"],
  },
];

for (const s of settings) {
  Deno.test(`deno task start works with ${s.name} under the permissions derived from it`, async () => {
    const { root, dir } = await dirWithModel(s.sub);
    try {
      const server = await start(s.args(root, dir), s.env(root));
      const text = await completion(server.base, "Once upon a time", 8);
      const log = await stopAndLog(server);
      assertStringIncludes(log, `model     ${dir}/${MODEL}`);
      if (s.name.startsWith("--host")) assert(server.base.startsWith("http://127.0.0.2:"));
      assertEquals(text, await expectedGreedy("Once upon a time", 8));
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  });
}

Deno.test("deno task start serves constrained output under the derived permissions (it reads XGrammar's bundle)", async () => {
  const { root } = await dirWithModel();
  try {
    const server = await start(["--model", "stories260K-q8_0"], { MODELS_DIR: root });
    const res = await fetch(`${server.base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: "A point:",
        max_tokens: 40,
        seed: 1,
        json_schema: {
          type: "object",
          properties: { x: { type: "integer", minimum: 0, maximum: 9 } },
          required: ["x"],
          additionalProperties: false,
        },
      }),
    });
    const body = await res.json();
    await stopAndLog(server);
    assertEquals(res.status, 200, JSON.stringify(body));
    const x = JSON.parse(body.choices[0].text).x;
    assert(Number.isInteger(x) && x >= 0 && x <= 9, body.choices[0].text);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("deno task generate downloads from a host other than Hugging Face into MODELS_DIR", async () => {
  const bytes = await Deno.readFile(modelFile(MODEL));
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response(bytes, { headers: { "content-length": String(bytes.length) } }),
  );
  const modelsDir = await Deno.makeTempDir({ prefix: "launch_test_" });
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "task",
        "generate",
        "--model",
        `http://127.0.0.1:${server.addr.port}/files/tiny.gguf`,
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--backend",
        "cpu",
      ],
      cwd: ROOT,
      env: { MODELS_DIR: modelsDir, MODEL_MIRROR: "" },
      stdin: "null",
    }).output();
    const err = new TextDecoder().decode(out.stderr);
    assertEquals(out.code, 0, err);
    assertEquals(
      new TextDecoder().decode(out.stdout),
      (await expectedGreedy("Once upon a time", 8)) + "\n",
    );
    assertEquals(await Deno.readFile(`${modelsDir}/tiny.gguf`), bytes);
  } finally {
    await server.shutdown();
    await Deno.remove(modelsDir, { recursive: true });
  }
});

/**
 * Resolves once /proc/<pid>/status satisfies `cond`: a barrier on what the kernel says of the
 * process (its state, its pending signals), polled every 10 ms.
 */
async function procStatus(pid: number, what: string, cond: (status: string) => boolean) {
  for (let polls = 0;; polls++) {
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    if (cond(status)) return;
    // A hang guard (each takes milliseconds), not a speed bound.
    if (polls === 3000) throw new Error(`process ${pid} never ${what}:\n${status}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Whether SIGTERM (signal 15) waits, undelivered, in the process's pending set. */
const sigtermPending = (status: string) =>
  (BigInt("0x" + /ShdPnd:\s+([0-9a-f]+)/.exec(status)![1]) & (1n << 14n)) !== 0n;

/** The pids of running processes whose command line contains `marker`. */
function processesWith(marker: string): { pid: number; argv: string[] }[] {
  const out: { pid: number; argv: string[] }[] = [];
  for (const e of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(e.name)) continue;
    try {
      const argv = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0").filter(Boolean);
      if (argv.some((a) => a.includes(marker))) out.push({ pid: Number(e.name), argv });
    } catch {
      // exited meanwhile
    }
  }
  return out;
}

Deno.test("the server cannot read or write a file outside what its configuration names", async () => {
  const { root } = await dirWithModel();
  const outside = await Deno.makeTempDir({ prefix: "launch_test_outside_" });
  await Deno.writeTextFile(`${outside}/secret.txt`, "secret");
  try {
    const server = await start(["--model", "stories260K-q8_0"], { MODELS_DIR: root });
    try {
      // The server is the `main.ts serve` child of the launcher; take its exact permissions.
      const serving = processesWith(root).find((p) => p.argv.includes("serve"));
      if (serving === undefined) throw new Error("the server process should be found");
      const flags = serving.argv.filter((a) => a.startsWith("--allow-"));
      assertEquals(serving.argv.includes("--allow-all") || serving.argv.includes("-A"), false);
      const probe = `
        const tryIt = async (f) => { try { await f(); return "ok"; } catch (e) { return e.name; } };
        console.log(JSON.stringify({
          model: await tryIt(() => Deno.readFile(${JSON.stringify(`${root}/${MODEL}`)})),
          secret: await tryIt(() => Deno.readTextFile(${JSON.stringify(`${outside}/secret.txt`)})),
          passwd: await tryIt(() => Deno.readTextFile("/etc/passwd")),
          write: await tryIt(() => Deno.writeTextFile(${JSON.stringify(`${outside}/x`)}, "x")),
          net: await tryIt(() => Deno.connect({ hostname: "127.0.0.3", port: 9 })),
        }));`;
      const probeFile = `${outside}/probe.js`;
      await Deno.writeTextFile(probeFile, probe);
      const out = await new Deno.Command(Deno.execPath(), {
        // The probe file itself is read by Deno's module loader, not under the sandbox.
        args: ["run", "--no-prompt", ...flags, probeFile],
        stdout: "piped",
        stderr: "piped",
      }).output();
      const result = JSON.parse(new TextDecoder().decode(out.stdout));
      assertEquals(result, {
        model: "ok",
        secret: "NotCapable",
        passwd: "NotCapable",
        write: "NotCapable",
        net: "NotCapable",
      }, new TextDecoder().decode(out.stderr));
    } finally {
      await stopAndLog(server);
    }
  } finally {
    await Deno.remove(root, { recursive: true });
    await Deno.remove(outside, { recursive: true });
  }
});

/**
 * Starts `n` long generations on one WebSocket and resolves once all have started and tokens
 * are flowing; `ended`
 * resolves when every one has its `done` (or an error, or the socket closed).
 */
async function longGenerations(base: string, n: number) {
  const ws = new WebSocket(`${base.replace("http", "ws")}/v1/stream`);
  await new Promise((r) => ws.onopen = r);
  const last = new Map<string, { type: string; finish_reason?: string }>();
  const startedIds = new Set<string>();
  let allStarted!: () => void;
  const started = new Promise<void>((r) => allStarted = r);
  const ended = new Promise<void>((resolve) => {
    ws.onmessage = (e) => {
      const f = JSON.parse(e.data);
      last.set(f.id, f);
      if (f.type === "started") startedIds.add(f.id);
      if (f.type === "token") {
        if (startedIds.size === n) allStarted();
      }
      if ([...last.values()].filter((x) => x.type === "done" || x.type === "error").length === n) {
        resolve();
      }
    };
    ws.onclose = () => resolve();
  });
  for (let i = 0; i < n; i++) {
    ws.send(JSON.stringify({
      type: "generate",
      id: `g${i}`,
      prompt: `Once upon a time ${i}`,
      max_tokens: 480,
      temperature: 0,
    }));
  }
  await started;
  return { last, ended, ws };
}

for (const via of ["npx", "deno task"] as const) {
  Deno.test(`SIGTERM to the launching process (${via}) drains the server and leaves no process behind`, async () => {
    const { root } = await dirWithModel();
    try {
      const server = await start(
        ["--model", "stories260K-q8_0", "--context-length", "512", "--kv-memory", "8MiB"],
        { MODELS_DIR: root },
        via === "npx" ? "npx" : undefined,
      );
      const gen = await longGenerations(server.base, 8);
      // The server is frozen while the signal travels through the launcher, so the signal
      // finds the generations running however fast the machine: none can end before it.
      const serving = processesWith(root).find((p) => p.argv.includes("serve"));
      if (serving === undefined) throw new Error("the server process should be found");
      Deno.kill(serving.pid, "SIGSTOP");
      try {
        // Stopped for sure before the signal is sent, or the signal could still be handled.
        await procStatus(serving.pid, "stopped", (st) => /^State:\s+T/m.test(st));
        server.child.kill("SIGTERM");
        await procStatus(serving.pid, "got SIGTERM", sigtermPending);
      } finally {
        Deno.kill(serving.pid, "SIGCONT");
      }
      await gen.ended;
      gen.ws.close();
      const status = await server.child.status;
      const log = await server.log();
      // The signal came while generations ran (the server counts them), and every one ran to
      // its end (its length or the model's end of text), none cut off.
      const inFlight = Number(
        /SIGTERM: draining .*; (\d+) generation\(s\) in flight/.exec(log)?.[1],
      );
      assert(inFlight >= 1 && inFlight <= 8, `in flight at the signal: ${inFlight}\n${log}`);
      console.log(`SIGTERM via ${via}: ${inFlight} of 8 generations in flight at the signal`);
      const ends = [...gen.last.values()].map((f) =>
        `${f.type}:${f.finish_reason ?? JSON.stringify(f)}`
      );
      assertEquals(ends.length, 8);
      assert(ends.every((e) => e === "done:length" || e === "done:stop"), ends.join());
      assertStringIncludes(log, "drained: all in-flight generations finished");
      if (via === "deno task") assertEquals(status.code, 0, log);
      // The server is gone too, not serving on as an orphan.
      for (let i = 0; i < 100 && processesWith(root).length > 0; i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
      assertEquals(processesWith(root), []);
    } finally {
      await Deno.remove(root, { recursive: true });
    }
  });
}

Deno.test("a launcher killed without a word (SIGKILL) makes the server drain instead of serving on", async () => {
  const { root } = await dirWithModel();
  try {
    const server = await spawnUntilListening([
      "run",
      "--allow-all",
      `${ROOT}main.ts`,
      "launch",
      "serve",
      "--port",
      "0",
      "--backend",
      "cpu",
      "--kv-memory",
      "1MiB",
      "--model",
      "stories260K-q8_0",
    ], { cwd: ROOT, env: { MODELS_DIR: root, MODEL_MIRROR: "" } });
    server.child.kill("SIGKILL");
    await server.child.status;
    // The server still holds our stderr pipe; it ends once the server has exited.
    const log = await server.log();
    assertStringIncludes(log, "drained: all in-flight generations finished");
    assertEquals(processesWith(root), []);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});
