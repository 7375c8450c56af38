/**
 * The real server (`main.ts serve`) as a child process, for the benchmarks and the reliability
 * tests: started on a free loopback port, its log kept, its RSS readable, stopped by signal.
 */

export interface ServerOptions {
  /** Flags after `serve` (model, backend, limits...). --host and --port are set here. */
  readonly args: readonly string[];
  /** Extra environment variables (e.g. MODEL_MIRROR, LLMSERVE_FAULT_STEPS). */
  readonly env?: Record<string, string>;
  /** Give up when it does not listen within this time (default 60 s). */
  readonly startTimeoutMs?: number;
  /** Start it under `ulimit -n <n>` (a lowered open-file limit), through sh. */
  readonly openFileLimit?: number;
  /** Another checkout's main.ts (a benchmark's "before"); default this checkout's. */
  readonly main?: string;
  /**
   * Start it in a user and mount namespace of its own (`unshare -rm`, which any user may do,
   * root or not) with a tmpfs of `size` (e.g. "1m") mounted on `dir`: a small real disk that
   * only the server sees; the test reaches it at `/proc/<pid>/root<dir>` (namespaceView).
   */
  readonly tmpfs?: { readonly dir: string; readonly size: string };
}

/** Where a test sees `path` of a server started with `tmpfs`: through its mount namespace. */
export function namespaceView(server: Pick<ServerProcess, "pid">, path: string): string {
  return `/proc/${server.pid}/root${path}`;
}

export interface ServerProcess {
  /** http://127.0.0.1:port */
  readonly base: string;
  /** ws://127.0.0.1:port/v1/stream */
  readonly wsUrl: string;
  readonly pid: number;
  /** Everything it wrote to stderr so far. */
  log(): string;
  /** Resident set size in bytes (Linux /proc), undefined when unreadable. */
  rssBytes(): number | undefined;
  /**
   * The kernel's high-water mark of the resident set since start or the last resetPeakRss()
   * (VmHWM): every peak, where sampling VmRSS could miss a short one.
   */
  peakRssBytes(): number | undefined;
  /** Starts the high-water mark afresh from the resident set now (clear_refs 5). */
  resetPeakRss(): void;
  /** Sends `signal` and waits for the exit; returns the exit code and the whole log. */
  stop(signal?: Deno.Signal): Promise<{ code: number; log: string }>;
  /** Resolves when the process exits (whoever ended it). */
  readonly exited: Promise<{ code: number; log: string }>;
}

const MAIN = new URL("../../main.ts", import.meta.url).pathname;

/** Starts `deno run -A main.ts serve --host 127.0.0.1 --port 0 ...args` and waits for its URL. */
export async function startServer(opts: ServerOptions): Promise<ServerProcess> {
  const args = [
    "run",
    "-A",
    opts.main ?? MAIN,
    "serve",
    "--host",
    "127.0.0.1",
    "--port",
    "0",
    ...opts.args,
  ];
  // exec keeps the pid: signals and /proc/<pid> reach the server itself.
  const [cmd, cmdArgs] = opts.tmpfs !== undefined
    ? [
      "unshare",
      [
        "-rm",
        "sh",
        "-c",
        'mount -t tmpfs -o "size=$1" tmpfs "$2" && shift 2 && exec "$@"',
        "sh",
        opts.tmpfs.size,
        opts.tmpfs.dir,
        Deno.execPath(),
        ...args,
      ],
    ]
    : opts.openFileLimit === undefined
    ? [Deno.execPath(), args]
    : ["sh", ["-c", `ulimit -n ${opts.openFileLimit} && exec "$0" "$@"`, Deno.execPath(), ...args]];
  const child = new Deno.Command(cmd, {
    args: cmdArgs,
    env: opts.env,
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  let log = "";
  let onLog: (() => void) | undefined;
  const pump = (async () => {
    const decoder = new TextDecoder();
    for await (const bytes of child.stderr) {
      log += decoder.decode(bytes, { stream: true });
      onLog?.();
    }
  })();
  const exited = (async () => {
    const status = await child.status;
    await pump.catch(() => {});
    return { code: status.code, log };
  })();
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      try {
        child.kill("SIGKILL");
      } catch { /* already gone */ }
      reject(
        new Error(
          `The server did not listen within ${opts.startTimeoutMs ?? 60_000} ms; its log:\n${log}`,
        ),
      );
    }, opts.startTimeoutMs ?? 60_000);
    const check = () => {
      const m = /url\s+(http:\/\/\S+?)\/\s/.exec(log);
      if (m) {
        clearTimeout(timer);
        onLog = undefined;
        resolve(m[1]!);
      }
    };
    onLog = check;
    check();
    exited.then(({ code }) => {
      clearTimeout(timer);
      reject(new Error(`The server exited with code ${code} before listening; its log:\n${log}`));
    });
  });
  return {
    base: url,
    wsUrl: `${url.replace(/^http/, "ws")}/v1/stream`,
    pid: child.pid,
    log: () => log,
    rssBytes: () => readRss(child.pid),
    peakRssBytes: () => readRss(child.pid, "VmHWM"),
    resetPeakRss: () => Deno.writeTextFileSync(`/proc/${child.pid}/clear_refs`, "5"),
    async stop(signal: Deno.Signal = "SIGTERM") {
      try {
        child.kill(signal);
      } catch { /* already exited */ }
      return await exited;
    },
    exited,
  };
}

/** Open file descriptors of a process (Linux /proc/<pid>/fd), undefined when unreadable. */
export function openFds(pid: number): number | undefined {
  try {
    return [...Deno.readDirSync(`/proc/${pid}/fd`)].length;
  } catch {
    return undefined;
  }
}

/** VmRSS (or VmHWM, its high-water mark) of a process in bytes, from /proc/<pid>/status. */
export function readRss(pid: number, field: "VmRSS" | "VmHWM" = "VmRSS"): number | undefined {
  try {
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    const m = new RegExp(`${field}:\\s+(\\d+)\\s+kB`).exec(status);
    return m ? Number(m[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/** The models directory from MODEL_MIRROR; throws a clear error when it is unset. */
export function modelMirror(): string {
  const dir = Deno.env.get("MODEL_MIRROR");
  if (!dir) {
    throw new Error(
      "MODEL_MIRROR is unset: point it at the test models directory (e.g. MODEL_MIRROR=../shared/models)",
    );
  }
  return dir;
}

/** One value from Prometheus text (`series` is the name plus labels, as printed). */
export function metricValue(text: string, series: string): number | undefined {
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    if (at > 0 && line.slice(0, at) === series) return Number(line.slice(at + 1));
  }
  return undefined;
}

/** Fetches /metrics and returns one series' value. */
export async function scrapeMetric(base: string, series: string): Promise<number | undefined> {
  const res = await fetch(`${base}/metrics`);
  return metricValue(await res.text(), series);
}
