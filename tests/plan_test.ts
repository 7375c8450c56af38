/** `deno task plan` as a user runs it: a table best first, and clear refusals of bad flags. */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";

const ROOT = new URL("..", import.meta.url).pathname;

async function plan(...args: string[]) {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--allow-all", "main.ts", "plan", ...args],
    cwd: ROOT,
    stdin: "null",
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

Deno.test("a 40 GB model on four 16 GB hosts: the layouts that fit first, the others with why", async () => {
  const r = await plan(
    "--model",
    "llama31_70b",
    "--hosts",
    "4x16GB@4thr",
    "--bandwidth",
    "1Gbit/s",
    "--context",
    "1024",
  );
  assertEquals(r.code, 0, r.stderr);
  assertStringIncludes(r.stdout, "model llama31_70b: 80 layers, 39.6 GiB of weights; 4 hosts");
  const rows = r.stdout.split("\n").filter((l) => /^\| \d+×\d+×\d+ /.test(l))
    .map((l) => l.split("|").slice(1, -1).map((c) => c.trim()));
  assertEquals(rows.length, 7);
  assert(rows[0]![7]!.startsWith("best"), rows[0]!.join(" | "));
  // One replica of the whole model per host needs the whole 39.6 GiB and more on host 1.
  const whole = rows.find((c) => c[0] === "1×1×4")!;
  assert(whole[7]!.startsWith("does not fit: needs 42."), whole[7]);
  assertStringIncludes(whole[7]!, "on host 1 (has 14.9 GiB)");
  // Those that fit come first, best by tokens/s at 32 sequences.
  const fit = rows.filter((c) => c[4] !== "");
  assertEquals(rows.slice(0, fit.length), fit);
  const at32 = fit.map((c) => Number(c[4]));
  assertEquals(at32, [...at32].sort((a, b) => b - a));
});

Deno.test("bad plan flags and hosts files are refused naming the flag, the field and the value", async () => {
  const bandwidth = await plan("--model", "llama32_1b", "--hosts", "2x8GiB", "--bandwidth", "fast");
  assertEquals(bandwidth.code, 2);
  assertStringIncludes(bandwidth.stderr, '--bandwidth: "fast" is not a bandwidth');
  const none = await plan("--model", "llama32_1b");
  assertEquals(none.code, 2);
  assertStringIncludes(none.stderr, "--hosts is required");
  const dir = await Deno.makeTempDir({ prefix: "plan_test_" });
  try {
    await Deno.writeTextFile(`${dir}/h.json`, JSON.stringify({ hosts: [{ memory: "lots" }] }));
    const file = await plan("--model", "llama32_1b", "--hosts", `${dir}/h.json`);
    assertEquals(file.code, 2);
    assertStringIncludes(file.stderr, `Hosts file ${dir}/h.json is invalid:\n  hosts[0].memory:`);
    assertStringIncludes(file.stderr, 'received "lots"');
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
