import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { modelMirror } from "./harness/model_files.ts";
import { runtimeDirFor } from "../lib/util/runtime_dir.ts";
import { webgpuApi } from "../lib/util/gpu_api.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/** The environment the server gives itself: a runtime dir for Mesa, and which GPU API it uses. */

const ROOT = new URL("..", import.meta.url).pathname;
const envOf = (vars: Record<string, string>) => (name: string) => vars[name];

Deno.test("runtimeDirFor() makes a private directory when XDG_RUNTIME_DIR is unset, and refuses one it does not own privately", async () => {
  const tmp = await Deno.makeTempDir();
  try {
    assertEquals(runtimeDirFor(envOf({ XDG_RUNTIME_DIR: "/run/user/5", TMPDIR: tmp })), undefined);
    const dir = runtimeDirFor(envOf({ TMPDIR: tmp }))!;
    assertEquals(dir, `${tmp}/llmserve-runtime-${Deno.uid()}`);
    const st = Deno.statSync(dir);
    assertEquals([st.isDirectory, st.uid, st.mode! & 0o777], [true, Deno.uid(), 0o700]);
    // Reused on the next start.
    assertEquals(runtimeDirFor(envOf({ TMPDIR: tmp })), dir);
    // A directory others can enter (made by someone else in its place) is not used...
    Deno.chmodSync(dir, 0o755);
    assertEquals(runtimeDirFor(envOf({ TMPDIR: tmp })), undefined);
    // ...nor a link to a private directory elsewhere.
    Deno.removeSync(dir);
    const elsewhere = await Deno.makeTempDir();
    Deno.chmodSync(elsewhere, 0o700);
    Deno.symlinkSync(elsewhere, dir);
    assertEquals(runtimeDirFor(envOf({ TMPDIR: tmp })), undefined);
    Deno.removeSync(elsewhere);
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
});

Deno.test("`deno task start` without XDG_RUNTIME_DIR gives the server process a private one", async () => {
  const tmp = await Deno.makeTempDir();
  const marker = `xdg-${crypto.randomUUID().slice(0, 8)}`;
  const { child, base } = await spawnUntilListening(
    ["task", "start", "--port", "0", "--kv-memory", "1MiB", "--served-model-name", marker],
    {
      cwd: ROOT,
      clearEnv: true,
      env: {
        PATH: Deno.env.get("PATH") ?? "",
        HOME: Deno.env.get("HOME") ?? "/tmp",
        TMPDIR: tmp,
        MODEL_MIRROR: modelMirror(),
      },
    },
  );
  try {
    await (await fetch(`${base}/health`)).body?.cancel();
    // The server is the process running `main.ts serve` (the launcher runs `main.ts launch`).
    const server = [...Deno.readDirSync("/proc")].filter((e) => /^\d+$/.test(e.name)).map((e) => {
      try {
        const argv = Deno.readTextFileSync(`/proc/${e.name}/cmdline`).split("\0");
        return argv.includes(marker) && argv.includes("serve") && !argv.includes("launch")
          ? e.name
          : undefined;
      } catch {
        return undefined;
      }
    }).find((p) => p !== undefined);
    assert(server !== undefined, "the server process is running");
    const environ = Deno.readTextFileSync(`/proc/${server}/environ`).split("\0");
    const expected = `${tmp}/llmserve-runtime-${Deno.uid()}`;
    assertEquals(environ.filter((v) => v.startsWith("XDG_RUNTIME_DIR=")), [
      `XDG_RUNTIME_DIR=${expected}`,
    ]);
    assertEquals(Deno.statSync(expected).mode! & 0o777, 0o700);
  } finally {
    child.kill("SIGTERM");
    await child.status;
    await Deno.remove(tmp, { recursive: true });
  }
});

Deno.test("webgpuApi() says Vulkan when the loader has a driver manifest, OpenGL ES when none, and what DENO_WEBGPU_BACKEND forces", async () => {
  const manifest = await Deno.makeTempFile({ suffix: ".json" });
  try {
    assertEquals(webgpuApi(envOf({ VK_ICD_FILENAMES: manifest }), "linux"), "Vulkan");
    assertEquals(
      webgpuApi(envOf({ VK_DRIVER_FILES: `/nonexistent.json:${manifest}` }), "linux"),
      "Vulkan",
    );
    assertEquals(
      webgpuApi(envOf({ VK_ICD_FILENAMES: "/nonexistent.json" }), "linux"),
      "OpenGL ES (no Vulkan driver found)",
    );
    assertEquals(
      webgpuApi(envOf({ DENO_WEBGPU_BACKEND: "gl" }), "linux"),
      "gl (DENO_WEBGPU_BACKEND)",
    );
    assertEquals(webgpuApi(envOf({}), "darwin"), undefined);
  } finally {
    await Deno.remove(manifest);
  }
});

Deno.test("`deno task generate` on webgpu names OpenGL ES when the Vulkan loader has no driver (wgpu then uses GL)", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "generate", "-p", "Once", "-n", "2", "--backend", "webgpu", "--temp", "0"],
    cwd: ROOT,
    env: { MODEL_MIRROR: modelMirror(), VK_ICD_FILENAMES: "/nonexistent/icd.json" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const err = new TextDecoder().decode(out.stderr);
  assertEquals(out.code, 0, err);
  assertStringIncludes(err, " through OpenGL ES (no Vulkan driver found); memory");
});
