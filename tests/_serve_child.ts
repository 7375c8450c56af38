/** Test helper: the real server (`main.ts serve`, or any deno command) as a child process. */
import { modelFile } from "./harness/model_files.ts";

export interface ServeChild {
  readonly child: Deno.ChildProcess;
  /** http://host:port of the listening server. */
  readonly base: string;
  /** Everything the process wrote on stderr, once it has exited. */
  log(): Promise<string>;
  /** The first match of `pattern` in stderr, once written (rejects if the process exits first). */
  logMatch(pattern: RegExp): Promise<RegExpExecArray>;
}

const LISTENING = /url\s+(http:\/\/\S+?)\//;

/**
 * Spawns `deno <args>` (or `opts.command <args>`) and resolves once its start-up line names the
 * URL it listens on.
 */
export async function spawnUntilListening(
  args: string[],
  opts: { env?: Record<string, string>; cwd?: string; command?: string; clearEnv?: boolean } = {},
): Promise<ServeChild> {
  const child = new Deno.Command(opts.command ?? Deno.execPath(), {
    args,
    env: opts.env,
    clearEnv: opts.clearEnv ?? false,
    cwd: opts.cwd,
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  while (!LISTENING.test(log)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`server exited before listening:\n${log}`);
    log += value;
  }
  const base = LISTENING.exec(log)![1]!;
  const waiters = new Set<() => boolean>();
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return log;
      log += value;
      for (const w of waiters) if (w()) waiters.delete(w);
    }
  })();
  const logMatch = (pattern: RegExp) =>
    new Promise<RegExpExecArray>((resolve, reject) => {
      const check = () => {
        const m = pattern.exec(log);
        if (m) resolve(m);
        return m !== null;
      };
      if (check()) return;
      waiters.add(check);
      rest.then(() => reject(new Error(`the server exited without writing ${pattern}:\n${log}`)));
    });
  return { child, base, log: () => rest, logMatch };
}

/** `main.ts serve` with `backend` on a free port and a small KV pool, then `extra` flags. */
function serveArgs(backend: string, extra: string[]): string[] {
  const main = new URL("../main.ts", import.meta.url).pathname;
  return [
    "run",
    "--allow-all",
    main,
    "serve",
    "--port",
    "0",
    "--backend",
    backend,
    "--kv-memory",
    "2MiB",
    ...extra,
  ];
}

/** `main.ts serve` on stories260K (llama2.c files from the mirror), a free port, a small KV pool. */
export function spawnServer(
  extra: string[] = [],
  opts: { backend?: string; env?: Record<string, string> } = {},
): Promise<ServeChild> {
  return spawnUntilListening(
    serveArgs(opts.backend ?? "reference", [
      "--model",
      modelFile("stories260K.bin"),
      "--tokenizer",
      modelFile("tok512.bin"),
      ...extra,
    ]),
    { env: opts.env },
  );
}

/**
 * `main.ts serve` on the cpu engine, a free port and a small KV pool; `flags` name the models
 * (`--model` repeated, `--models-dir`) and the rest.
 */
export function spawnCpuServer(
  flags: string[],
  opts: { env?: Record<string, string> } = {},
): Promise<ServeChild> {
  return spawnUntilListening(serveArgs("cpu", flags), opts);
}
