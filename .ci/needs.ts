/**
 * What the test suite needs from the machine, and how each need is met on a fresh one (only
 * Node.js, maybe not root: nothing here needs root, though as root the WebGPU need installs
 * Mesa's Vulkan driver). This is the one place such needs are declared: `.ci/test.ts` meets
 * every entry of {@linkcode NEEDS} before any test runs, and hands the tests the environment
 * each one returns. A need that cannot be met is an error naming what is missing; nothing is
 * skipped silently.
 *
 * To add a program the tests run (a server, a checker), append one entry to NEEDS:
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const needs: Need[] = [
 *   ...NEEDS,
 *   program({ name: "redis-server", apt: "redis-server", env: "REDIS_SERVER", why: "the cache tests" }),
 * ];
 * assertEquals(needs.at(-1)?.name, "redis-server"); // nothing is installed until provide()
 * ```
 *
 * The tests then read the program's path from that environment variable.
 */

import { vulkanDriverPresent } from "../lib/util/gpu_api.ts";

/** One thing the tests need. */
export interface Need {
  readonly name: string;
  /** Which tests need it, for the set-up log. */
  readonly why: string;
  /**
   * Makes the need available, installing it when that is possible, and returns the
   * environment variables the tests read it from plus a line saying how it was met.
   */
  provide(): Promise<Provided>;
}

export interface Provided {
  readonly env: Record<string, string>;
  readonly how: string;
}

/** Whether this process may install Debian packages. */
export function isRoot(): boolean {
  return Deno.uid() === 0;
}

/**
 * The first executable called `name` on PATH, then in the sbin folders (Debian puts servers
 * such as nats-server in /usr/sbin, which a user's PATH often lacks), or undefined.
 */
export function onPath(name: string): string | undefined {
  const dirs = [
    ...(Deno.env.get("PATH") ?? "").split(":"),
    "/usr/local/sbin",
    "/usr/sbin",
    "/sbin",
  ];
  for (const dir of dirs) {
    if (dir === "") continue;
    const path = `${dir}/${name}`;
    try {
      const info = Deno.statSync(path);
      if (info.isFile && ((info.mode ?? 0o111) & 0o111) !== 0) return path;
    } catch {
      // not in this directory
    }
  }
  return undefined;
}

async function run(cmd: string, args: string[], env?: Record<string, string>, cwd?: string) {
  const out = await new Deno.Command(cmd, { args, env, cwd, stdout: "piped", stderr: "piped" })
    .output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b);
  return { ok: out.success, code: out.code, stdout: text(out.stdout), stderr: text(out.stderr) };
}

let aptUpdated = false;

/** `apt-get install` as root (Debian's packages are reachable); throws with apt's own words. */
export async function aptInstall(packages: string[]): Promise<void> {
  if (!isRoot()) {
    throw new Error(`installing ${packages.join(" ")} needs root (apt-get install)`);
  }
  const env = { DEBIAN_FRONTEND: "noninteractive" };
  if (!aptUpdated) {
    const u = await run("apt-get", ["update", "-qq"], env);
    if (!u.ok) throw new Error(`apt-get update failed (exit ${u.code}): ${u.stderr.trim()}`);
    aptUpdated = true;
  }
  const r = await run(
    "apt-get",
    ["install", "-y", "-qq", "--no-install-recommends", ...packages],
    env,
  );
  if (!r.ok) {
    throw new Error(
      `apt-get install ${packages.join(" ")} failed (exit ${r.code}): ${r.stderr.trim()}`,
    );
  }
}

/**
 * A program the tests run: taken from `$<env>` when set, else from PATH (and the sbin folders),
 * else from Debian's package `apt`, unpacked into a cache folder without installing it
 * (`apt-get download` and `dpkg-deb -x` need no root, so a newcomer's account gets it as CI
 * does, and the machine is left as it was). The tests read its path from `$<env>`.
 */
export function program(p: {
  name: string;
  apt: string;
  env: string;
  why: string;
  /** The cache root instead of {@linkcode cacheHome}'s (the tests' own, never the env's). */
  cacheHome?: string;
}): Need {
  return {
    name: p.name,
    why: p.why,
    async provide() {
      const given = Deno.env.get(p.env);
      if (given) return { env: { [p.env]: given }, how: `${p.env}=${given}` };
      const found = onPath(p.name);
      // The tests run it by the path in $<env>, or by name: put its folder on PATH too.
      if (found) return { env: withFolderOnPath(p.env, found), how: `found ${found}` };
      const home = p.cacheHome ?? cacheHome();
      const cached = inUnpacked(debCacheDir(p.apt, home), p.name);
      if (cached) {
        return { env: withFolderOnPath(p.env, cached), how: `unpacked earlier: ${cached}` };
      }
      let unpacked: string;
      try {
        unpacked = await unpackDebian(p.apt, p.name, [], home);
      } catch (e) {
        throw new Error(
          `${p.name} is not on PATH and Debian's ${p.apt} could not be fetched: ` +
            `${(e as Error).message}; install it or set ${p.env} to its path`,
        );
      }
      return {
        env: withFolderOnPath(p.env, unpacked),
        how: `Debian's ${p.apt} unpacked (no install): ${unpacked}`,
      };
    },
  };
}

/** The user's cache root: `$XDG_CACHE_HOME`, else `~/.cache`. */
export function cacheHome(): string {
  return Deno.env.get("XDG_CACHE_HOME") ||
    `${Deno.env.get("HOME") || `${tmpDir()}/llmserve-${Deno.uid() ?? "u"}`}/.cache`;
}

/**
 * Where Debian packages are unpacked for the tests: `<cache root>/llmserve/debs/<package>`.
 * The root is a parameter, not set through XDG_CACHE_HOME, because test files running in
 * parallel share one process environment: a root set there for one test became every spawned
 * server's Deno cache meanwhile, and one of them failed fetching npm packages into it as the test
 * removed it.
 */
export function debCacheDir(pkg: string, home: string = cacheHome()): string {
  return `${home}/llmserve/debs/${pkg}`;
}

/** The executable `name` inside an unpacked package tree, or undefined. */
function inUnpacked(root: string, name: string): string | undefined {
  for (const dir of ["usr/bin", "usr/sbin", "bin", "sbin"]) {
    const path = `${root}/${dir}/${name}`;
    try {
      const info = Deno.statSync(path);
      if (info.isFile && ((info.mode ?? 0) & 0o111) !== 0) return path;
    } catch {
      // not here
    }
  }
  return undefined;
}

/**
 * Fetches Debian's `pkg` with `apt-get download` and unpacks it with `dpkg-deb -x` into
 * {@linkcode debCacheDir}; returns the path of `name` in it. When the machine's package lists
 * are missing or unreadable (a fresh image, before anyone ran `apt-get update`), apt is pointed
 * at lists of its own under the cache, which a user may update without root.
 */
export async function unpackDebian(
  pkg: string,
  name: string,
  /** apt options for the first try (tests point it at empty lists, as on a fresh image). */
  systemApt: readonly string[] = [],
  home: string = cacheHome(),
): Promise<string> {
  const root = debCacheDir(pkg, home);
  const base = root.slice(0, root.lastIndexOf("/"));
  await Deno.mkdir(base, { recursive: true });
  const work = await Deno.makeTempDir({ dir: base, prefix: `.${pkg}-` });
  try {
    let r = await run("apt-get", ["-q", ...systemApt, "download", pkg], undefined, work);
    if (!r.ok) {
      const own = `${base}/.apt`;
      for (const d of ["lists/partial", "cache/archives/partial"]) {
        await Deno.mkdir(`${own}/${d}`, { recursive: true });
      }
      const opts = [
        "-q",
        "-o",
        `Dir::State::Lists=${own}/lists`,
        "-o",
        `Dir::Cache=${own}/cache`,
        "-o",
        "Debug::NoLocking=true",
      ];
      const u = await run("apt-get", [...opts, "update"], undefined, work);
      if (!u.ok) throw new Error(`apt-get update (own lists) failed: ${lastLine(u.stderr)}`);
      r = await run("apt-get", [...opts, "download", pkg], undefined, work);
    }
    if (!r.ok) throw new Error(`apt-get download ${pkg} failed: ${lastLine(r.stderr)}`);
    const deb = [...Deno.readDirSync(work)].find((e) => e.name.endsWith(".deb"));
    if (deb === undefined) throw new Error(`apt-get download ${pkg} left no .deb`);
    const tree = `${work}/tree`;
    const x = await run("dpkg-deb", ["-x", `${work}/${deb.name}`, tree]);
    if (!x.ok) throw new Error(`dpkg-deb -x ${deb.name} failed: ${lastLine(x.stderr)}`);
    if (inUnpacked(tree, name) === undefined) throw new Error(`${deb.name} holds no ${name}`);
    // Renamed into place whole, so a run cut off midway leaves no half-unpacked tree behind.
    await Deno.remove(root, { recursive: true }).catch(() => {});
    await Deno.rename(tree, root);
    return inUnpacked(root, name)!;
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
}

function lastLine(text: string): string {
  return text.trim().split("\n").at(-1) ?? "";
}

/** `{ [envName]: path }`, with the program's folder added to this process's PATH (which the
 * test runs inherit). */
function withFolderOnPath(envName: string, path: string): Record<string, string> {
  const folder = path.slice(0, path.lastIndexOf("/"));
  const current = Deno.env.get("PATH") ?? "";
  if (!current.split(":").includes(folder)) Deno.env.set("PATH", `${current}:${folder}`);
  return { [envName]: path };
}

/**
 * Chromium for the playground's browser test, from the npm registry: @sparticuz/chromium ships
 * a brotli-compressed headless Chromium inside its tarball, so no browser download from
 * elsewhere (which fails on a closed network) and no root are needed. `CHROMIUM_PATH` overrides.
 */
export const chromiumNeed: Need = {
  name: "chromium",
  why: "the playground test (tests/http_playground_test.ts)",
  async provide() {
    const given = Deno.env.get("CHROMIUM_PATH");
    if (given) return { env: { CHROMIUM_PATH: given }, how: `CHROMIUM_PATH=${given}` };
    // The package unpacks into os.tmpdir(); a folder of our own keeps it apart from another
    // user's /tmp/chromium, and is reused by the next run.
    const dir = `${tmpDir()}/llmserve-chromium-${CHROMIUM_VERSION}-${Deno.uid() ?? "u"}`;
    await Deno.mkdir(dir, { recursive: true });
    const before = Deno.env.get("TMPDIR");
    Deno.env.set("TMPDIR", dir);
    try {
      const { default: chromium } = await import(`npm:@sparticuz/chromium@${CHROMIUM_VERSION}`);
      const path: string = await chromium.executablePath();
      return {
        env: { CHROMIUM_PATH: path },
        how: `npm @sparticuz/chromium@${CHROMIUM_VERSION} unpacked at ${path}`,
      };
    } finally {
      if (before === undefined) Deno.env.delete("TMPDIR");
      else Deno.env.set("TMPDIR", before);
    }
  },
};

const CHROMIUM_VERSION = "153.0.0";

function tmpDir(): string {
  return Deno.env.get("TMPDIR") || "/tmp";
}

/** What Deno's WebGPU finds, asked in a child process (as the tests will). */
async function probeAdapter(): Promise<
  { description: string; features: string[] } | undefined
> {
  const code = `const a = await navigator.gpu?.requestAdapter();
console.log(JSON.stringify(a ? { description: a.info.description || a.info.vendor, features: [...a.features] } : null));`;
  const r = await run(Deno.execPath(), ["eval", "--unstable-webgpu", code]);
  const line = r.stdout.trim().split("\n").at(-1) ?? "null";
  try {
    return JSON.parse(line) ?? undefined;
  } catch {
    return undefined;
  }
}

/**
 * A WebGPU adapter for the GPU tests. A real GPU or Mesa's Vulkan driver (lavapipe: shader-f16,
 * 32 storage buffers per stage) is used when present; as root, Mesa's Vulkan driver is
 * installed when no Vulkan driver is. Without root wgpu falls back to OpenGL ES through Mesa's
 * EGL (llvmpipe), which a fresh image already has: no shader-f16 and 16 storage buffers per
 * stage, both of which the engine adapts to.
 */
export const webgpuNeed: Need = {
  name: "webgpu",
  why: "the WebGPU kernel and engine tests",
  async provide() {
    let installed = "";
    if (!vulkanDriverPresent() && isRoot()) {
      await aptInstall(["mesa-vulkan-drivers"]);
      installed = "installed Debian's mesa-vulkan-drivers; ";
    }
    const adapter = await probeAdapter();
    if (adapter === undefined) {
      throw new Error(
        "no WebGPU adapter: Deno found neither a Vulkan driver nor OpenGL ES through EGL; " +
          "as root this script installs mesa-vulkan-drivers, otherwise install it (or libegl-mesa0)",
      );
    }
    const f16 = adapter.features.includes("shader-f16") ? "shader-f16" : "no shader-f16";
    const via = vulkanDriverPresent() ? "Vulkan" : "OpenGL ES via EGL";
    return { env: {}, how: `${installed}${adapter.description} through ${via} (${f16})` };
  },
};

/** Every need, met in this order. */
export const NEEDS: readonly Need[] = [
  chromiumNeed,
  webgpuNeed,
  program({
    name: "nats-server",
    apt: "nats-server",
    env: "NATS_SERVER",
    why: "the cluster tests (tests/_cluster.ts starts its own)",
  }),
  program({
    name: "promtool",
    apt: "prometheus",
    env: "PROMTOOL",
    why: "the /metrics lint (tests/serve_command_test.ts)",
  }),
];
