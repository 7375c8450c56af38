import { assert, assertEquals, assertMatch } from "@std/assert";
import { debCacheDir, onPath, program, unpackDebian } from "../.ci/needs.ts";

/**
 * The test command's set-up meets its program needs without root: Debian's package is fetched
 * and unpacked into a cache (never installed), also on a machine whose package lists are empty.
 */

/**
 * Runs f with a cache root of its own, passed as a parameter: setting XDG_CACHE_HOME would
 * reach the servers other test files spawn meanwhile (one process environment for all).
 */
async function withCache<T>(f: (cache: string) => Promise<T>): Promise<T> {
  const cache = await Deno.makeTempDir({ prefix: "ci_needs_test_" });
  const envBefore = Deno.env.get("XDG_CACHE_HOME");
  try {
    return await f(cache);
  } finally {
    assertEquals(Deno.env.get("XDG_CACHE_HOME"), envBefore, "XDG_CACHE_HOME was changed");
    await removeSettled(cache);
  }
}

/**
 * Removes the cache, again if something still wrote into it meanwhile: apt's fetch methods are
 * child processes that may finish writing a partial file just after apt-get itself has exited.
 */
async function removeSettled(dir: string): Promise<void> {
  for (let attempt = 1;; attempt++) {
    try {
      return await Deno.remove(dir, { recursive: true });
    } catch (e) {
      if (attempt === 5 || !(e instanceof Error && /not empty/i.test(e.message))) throw e;
      await new Promise((r) => setTimeout(r, 200 * attempt));
    }
  }
}

Deno.test("unpackDebian() fetches nats-server with empty package lists and the binary runs", async () => {
  await withCache(async (cache) => {
    const empty = `${cache}/empty-lists`;
    await Deno.mkdir(`${empty}/partial`, { recursive: true });
    // A fresh image: the machine's lists hold nothing, so apt must use lists of its own.
    const path = await unpackDebian(
      "nats-server",
      "nats-server",
      ["-o", `Dir::State::Lists=${empty}`],
      cache,
    );
    assertEquals(path, `${debCacheDir("nats-server", cache)}/usr/sbin/nats-server`);
    assertEquals(path, `${cache}/llmserve/debs/nats-server/usr/sbin/nats-server`);
    assert(path.startsWith(cache));
    const out = await new Deno.Command(path, { args: ["--version"], stdout: "piped" }).output();
    assertEquals(out.code, 0);
    assertMatch(new TextDecoder().decode(out.stdout), /^nats-server: v\d+\.\d+\.\d+/);
    // Nothing half-unpacked is left beside it.
    const left = [...Deno.readDirSync(`${cache}/llmserve/debs`)].map((e) => e.name).sort();
    assertEquals(left.filter((n) => !n.startsWith(".apt")), ["nats-server"]);
  });
});

Deno.test("program() takes a program missing from PATH from Debian's package, then from the cache", async () => {
  await withCache(async (cache) => {
    const need = program({
      name: "promtool",
      apt: "prometheus",
      env: "LLMSERVE_TEST_PROMTOOL",
      why: "test",
      cacheHome: cache,
    });
    // provide() puts an unpacked program's folder on PATH, for the runs the set-up starts.
    const pathBefore = Deno.env.get("PATH") ?? "";
    try {
      // Only when promtool is not installed is the fetch path exercised; where it is, PATH wins.
      const installed = onPath("promtool");
      const first = await need.provide();
      const second = await need.provide();
      const path = first.env["LLMSERVE_TEST_PROMTOOL"]!;
      if (installed === undefined) {
        assertMatch(first.how, /^Debian's prometheus unpacked \(no install\): /);
        assertMatch(second.how, /^(unpacked earlier|found) /);
      } else {
        assertEquals(path, installed);
      }
      const out = await new Deno.Command(path, {
        args: ["--version"],
        stdout: "piped",
        stderr: "piped",
      })
        .output();
      assertEquals(out.code, 0);
      assertMatch(
        new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr),
        /promtool, version \d/,
      );
    } finally {
      Deno.env.set("PATH", pathBefore);
    }
  });
});
