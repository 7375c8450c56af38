import { assertEquals } from "@std/assert";
import { defaultMaxConnections, openFileLimit } from "../lib/util/fd_limit.ts";

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            1024                 1048576              files
Max locked memory         8388608              8388608              bytes
`;

Deno.test("openFileLimit() reads the soft open-file limit from /proc/self/limits", () => {
  assertEquals(openFileLimit(() => LIMITS), 1024);
  assertEquals(openFileLimit(() => LIMITS.replace("1024 ", "unlimited")), Number.MAX_SAFE_INTEGER);
  assertEquals(openFileLimit(() => "no such line"), undefined);
  assertEquals(
    openFileLimit(() => {
      throw new Error("not Linux");
    }),
    undefined,
  );
  // This process's own limit, as `ulimit -n` in a shell started like it reports it.
  const shell = new Deno.Command("sh", { args: ["-c", "ulimit -n"] }).outputSync();
  assertEquals(openFileLimit(), Number(new TextDecoder().decode(shell.stdout).trim()));
});

Deno.test("defaultMaxConnections() leaves a reserve of descriptors below the limit", () => {
  assertEquals(defaultMaxConnections(1024), 1024 - 64 - 256);
  assertEquals(defaultMaxConnections(undefined), defaultMaxConnections(1024));
  assertEquals(defaultMaxConnections(200), 200 - 64 - 50);
  assertEquals(defaultMaxConnections(20), 16);
  assertEquals(defaultMaxConnections(10_000_000), 65_536);
});
