/**
 * The launcher behind `deno task start|generate|models|router|cluster`. It reads the
 * configuration (flags and environment), works out the permissions the command needs from it
 * (`permissions.ts`) and runs the command in a child Deno with exactly those (`cluster`, which
 * starts processes of its own, with all). The launcher itself runs with
 * --allow-all: starting a process (--allow-run) is all the power there is anyway, and Deno
 * lets only --allow-all read /proc/<pid>; the sandbox that matters is the command's. The
 * launcher stays as the child's parent so that signals reach the server however it was
 * started:
 *
 * - SIGTERM and SIGINT sent to the launcher are forwarded to the child, and
 *   the launcher exits with the child's exit code (128 + the signal's number when it was killed).
 * - The child runs in its own session, so a Ctrl-C at a terminal reaches it once, through the
 *   launcher, rather than twice.
 * - `npx` and `deno task` start the launcher through a shell and do not pass a SIGTERM on:
 *   on Linux the launcher watches those wrapper processes above it and, when one of them
 *   exits, stops the child as if it had been sent SIGTERM.
 * - The child's stdin is a pipe from the launcher: if the launcher dies without a word
 *   (SIGKILL), the child reads end-of-file and stops as on SIGTERM (see `parent_watch.ts`),
 *   and however its stop began it exits within --drain-timeout + EXIT_GRACE_SECONDS
 *   (`stop_deadline.ts`).
 */
import { fileURLToPath } from "node:url";
import {
  derivePermissions,
  ENV_READ,
  gpuApiReads,
  permissionFlags,
  type RunNeeds,
} from "./permissions.ts";
import { PARENT_PIPE_ENV } from "./parent_watch.ts";
import { runtimeDirEnv } from "../util/runtime_dir.ts";
import type { CommandName } from "./commands.ts";

/** The commands the launcher can run: every command of the table (commands.ts). */
export type LaunchedCommand = CommandName;

/**
 * `cluster` starts nats-server and Deno processes of its own (each of those gets its own
 * derived permissions), which is all the power there is: it runs with --allow-all.
 */
export const ALL_PERMISSIONS = "all";

// Other signals end the launcher by their default action; the child then reads end-of-file on
// its stdin and stops as on SIGTERM.
const FORWARDED: readonly Deno.Signal[] = ["SIGTERM", "SIGINT"];
const SIGNAL_NUMBERS: Partial<Record<Deno.Signal, number>> = {
  SIGHUP: 1,
  SIGINT: 2,
  SIGQUIT: 3,
  SIGKILL: 9,
  SIGTERM: 15,
};

/** The `deno run` arguments that run `command argv` with `needs`' permissions. */
export function childArgs(
  command: LaunchedCommand,
  argv: readonly string[],
  needs: RunNeeds | typeof ALL_PERMISSIONS | undefined,
  env: (name: string) => string | undefined,
): string[] {
  if (needs === ALL_PERMISSIONS) {
    return ["run", "--no-prompt", "--allow-all", ...configAndMain(), command, ...argv];
  }
  const derived = needs === undefined
    ? { read: [], write: [], net: [], env: [...ENV_READ] }
    : derivePermissions(needs, env);
  const usesGpu = command === "serve" || command === "generate";
  const reads = usesGpu ? [...derived.read, ...gpuApiReads(env)] : derived.read;
  const p = {
    ...derived,
    read: withRealPaths(reads),
    write: withRealPaths(derived.write),
    // `--backend auto` asks a child Deno what the WebGPU adapter is (kernels/webgpu/adapter.ts).
    ...(usesGpu ? { run: [Deno.execPath()] } : {}),
  };
  return [
    "run",
    "--no-prompt",
    ...permissionFlags(p),
    ...configAndMain(),
    command,
    ...argv,
  ];
}

function configAndMain(): string[] {
  return [
    "--config",
    fileURLToPath(new URL("../../deno.json", import.meta.url)),
    fileURLToPath(new URL("../../main.ts", import.meta.url)),
  ];
}

/**
 * Each path and, where it differs, the path with symlinks resolved: Deno checks a file's access
 * against its canonical path, so a mirror reached through a link (`../shared` -> `/work/shared`)
 * needs both. A path that does not exist yet (a models directory to create) is resolved through
 * its nearest existing parent.
 */
export function withRealPaths(paths: readonly string[]): string[] {
  const out = new Set<string>();
  for (const path of paths) {
    out.add(path);
    const real = realPathOfNearest(path);
    if (real !== undefined) out.add(real);
  }
  return [...out];
}

function realPathOfNearest(path: string): string | undefined {
  const rest: string[] = [];
  let p = path.replace(/\/+$/, "") || "/";
  for (let i = 0; i < 64; i++) {
    try {
      const real = Deno.realPathSync(p);
      return [real.replace(/\/+$/, ""), ...rest].join("/") || "/";
    } catch {
      const cut = p.lastIndexOf("/");
      if (cut <= 0) return undefined;
      rest.unshift(p.slice(cut + 1));
      p = p.slice(0, cut);
    }
  }
  return undefined;
}

/**
 * Runs `command argv` in a child Deno with the permissions its settings need; `needs` is
 * undefined for a run that only prints (`--help`, `--version`). Returns the exit code.
 */
export async function launch(
  command: LaunchedCommand,
  argv: readonly string[],
  needs: RunNeeds | typeof ALL_PERMISSIONS | undefined,
): Promise<number> {
  const args = childArgs(command, argv, needs, (n) => Deno.env.get(n));
  const child = new Deno.Command(Deno.execPath(), {
    args,
    // Set only when missing: Mesa's Vulkan layer prints an error per instance without it.
    env: { [PARENT_PIPE_ENV]: "1", ...runtimeDirEnv() },
    stdin: "piped",
    stdout: "inherit",
    stderr: "inherit",
    detached: true,
  }).spawn();
  let stopping = false;
  const forward = (signal: Deno.Signal) => {
    stopping = true;
    try {
      child.kill(signal);
    } catch {
      // already exited
    }
  };
  const listeners = FORWARDED.map((s) => {
    const l = () => forward(s);
    Deno.addSignalListener(s, l);
    return [s, l] as const;
  });
  const wrappers = wrapperAncestors();
  const timer = wrappers.length === 0 ? undefined : setInterval(() => {
    const gone = wrappers.find((w) => !sameProcess(w));
    if (gone === undefined || stopping) return;
    console.error(
      `launcher: ${gone.command} (pid ${gone.pid}) exited without passing a signal on; ` +
        "stopping the server as on SIGTERM",
    );
    forward("SIGTERM");
  }, 500);
  try {
    const status = await child.status;
    return status.signal === null ? status.code : 128 + (SIGNAL_NUMBERS[status.signal] ?? 0);
  } finally {
    if (timer !== undefined) clearInterval(timer);
    for (const [s, l] of listeners) Deno.removeSignalListener(s, l);
    await child.stdin.close().catch(() => {});
  }
}

interface ProcessId {
  readonly pid: number;
  readonly startTime: string;
  readonly command: string;
}

/**
 * The processes above this one that only wrap it (`deno task`, `sh -c`, `npm exec`, `npx`),
 * up to the first that does not; empty where /proc cannot be read (not Linux).
 */
function wrapperAncestors(): ProcessId[] {
  const out: ProcessId[] = [];
  let pid = Deno.ppid;
  while (pid > 1 && out.length < 8) {
    const proc = readProc(pid);
    if (proc === undefined || !isWrapper(proc.argv)) break;
    out.push({ pid, startTime: proc.startTime, command: proc.argv.join(" ").slice(0, 80) });
    pid = proc.ppid;
  }
  return out;
}

function readProc(
  pid: number,
): { ppid: number; startTime: string; argv: string[] } | undefined {
  try {
    const stat = Deno.readTextFileSync(`/proc/${pid}/stat`);
    // "pid (comm) state ppid ... starttime": comm may hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const argv = Deno.readTextFileSync(`/proc/${pid}/cmdline`).split("\0").filter(Boolean);
    return { ppid: Number(fields[1]), startTime: fields[19] ?? "", argv };
  } catch {
    return undefined;
  }
}

function sameProcess(p: ProcessId): boolean {
  return readProc(p.pid)?.startTime === p.startTime;
}

/** A process that only runs the one below it: `deno task`, `sh -c`, `npm exec`, `npx`. */
export function isWrapper(argv: readonly string[]): boolean {
  const base = (s: string | undefined) => (s ?? "").split("/").pop() ?? "";
  const [first, second] = argv;
  const name = base(first);
  if (name === "deno") return second === "task";
  if (["sh", "bash", "dash", "zsh"].includes(name)) return argv.includes("-c");
  if (name === "npm" || name === "npx") return name === "npx" || second === "exec";
  if (name === "node") return /np[mx]-cli\.js$/.test(second ?? "");
  return false;
}
