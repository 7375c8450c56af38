/**
 * exitDeadline() in a real process: once a stop is asked for (the launcher's end, SIGTERM), a
 * stop that waits for ever still ends the process at the deadline, saying what it waited on;
 * a stop that finishes is not held up by it.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { PARENT_PIPE_ENV } from "../lib/cli/parent_watch.ts";
import { DEADLINE_EXIT_CODE, STOP_OVERRAN } from "../lib/cli/stop_deadline.ts";

const MODULE = new URL("../lib/cli/stop_deadline.ts", import.meta.url).href;

/**
 * A process that arms the deadline (`drain` s + `grace` s) and then, on SIGTERM, either waits
 * on nothing that will ever come (a timer that keeps the event loop alive) or ends its stop.
 */
async function stopper(
  opts: { drain: number; grace: number; stopEnds: boolean; launched?: boolean },
) {
  const dir = await Deno.makeTempDir({ prefix: "stop_deadline_test_" });
  const script = `${dir}/stopper.ts`;
  await Deno.writeTextFile(
    script,
    `import { exitDeadline } from ${JSON.stringify(MODULE)};
const deadline = exitDeadline(${opts.drain}, (l) => console.error(l), ${opts.grace});
deadline.waitingOn("a NATS server that never answers");
const forever = setInterval(() => {}, 1000);
const stop = () => { if (${opts.stopEnds}) clearInterval(forever); };
Deno.addSignalListener("SIGTERM", stop);
console.error("armed");
`,
  );
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", script],
    // Without the launcher's pipe nothing reads stdin, which would hold the process too.
    env: { [PARENT_PIPE_ENV]: opts.launched === false ? "" : "1" },
    stdin: "piped",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const reader = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
  let log = "";
  while (!log.includes("armed")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`the stopper exited before arming:\n${log}`);
    log += value;
  }
  const rest = (async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return log;
      log += value;
    }
  })();
  return {
    child,
    log: () => rest,
    cleanup: () => Deno.remove(dir, { recursive: true }),
  };
}

/** The child's exit status, or a failure (and the child killed) past `ms`. */
async function exitWithin(child: Deno.ChildProcess, ms: number): Promise<Deno.CommandStatus> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`the process did not exit within ${ms} ms`));
    }, ms);
  });
  try {
    return await Promise.race([child.status, late]);
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("a stop that never finishes after the launcher's end exits at the deadline, naming what it waited on", async () => {
  const s = await stopper({ drain: 0, grace: 1, stopEnds: false });
  try {
    const t0 = performance.now();
    await s.child.stdin.close();
    const status = await exitWithin(s.child, 10_000);
    const ms = performance.now() - t0;
    const log = await s.log();
    assertEquals(status.code, DEADLINE_EXIT_CODE, log);
    assert(ms >= 1000, `it exited ${ms} ms after the launcher's end, before its deadline`);
    assertStringIncludes(log, `${STOP_OVERRAN}: 1 s after the launcher's end`);
    assertStringIncludes(log, "it still waits on a NATS server that never answers");
  } finally {
    await s.cleanup();
  }
});

Deno.test("a stop that never finishes after SIGTERM exits at the deadline", async () => {
  const s = await stopper({ drain: 1, grace: 1, stopEnds: false });
  try {
    s.child.kill("SIGTERM");
    const status = await exitWithin(s.child, 10_000);
    const log = await s.log();
    assertEquals(status.code, DEADLINE_EXIT_CODE, log);
    assertStringIncludes(log, `${STOP_OVERRAN}: 2 s after SIGTERM (--drain-timeout 1 s + 1 s)`);
    await s.child.stdin.close();
  } finally {
    await s.cleanup();
  }
});

Deno.test("a stop that finishes exits on its own, long before the deadline", async () => {
  const s = await stopper({ drain: 0, grace: 60, stopEnds: true, launched: false });
  try {
    s.child.kill("SIGTERM");
    const status = await exitWithin(s.child, 10_000);
    const log = await s.log();
    assertEquals(status.code, 0, log);
    assert(!log.includes(STOP_OVERRAN), log);
    await s.child.stdin.close();
  } finally {
    await s.cleanup();
  }
});
