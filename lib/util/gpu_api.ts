/**
 * Which graphics API Deno's WebGPU (wgpu) runs on, for the start-up lines: on Linux it takes
 * Vulkan when a Vulkan driver is installed and otherwise falls back to OpenGL ES through EGL
 * (Mesa's llvmpipe on a machine without a GPU), which is slower and lacks shader-f16. The
 * adapter itself does not say which (its info has no backend field), so this reads what wgpu
 * reads: `DENO_WEBGPU_BACKEND` when set, else the Vulkan loader's driver manifests.
 */

/** Where the Vulkan loader looks for driver manifests when no variable names them. */
export const VULKAN_DRIVER_DIRS = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"] as const;

/** The variables that decide it (the launcher lets the server read them). */
export const GPU_API_ENV = ["DENO_WEBGPU_BACKEND", "VK_ICD_FILENAMES", "VK_DRIVER_FILES"] as const;

/** True when a Vulkan driver manifest exists where the loader looks. */
export function vulkanDriverPresent(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): boolean {
  const listed = env("VK_ICD_FILENAMES") ?? env("VK_DRIVER_FILES");
  const files = listed !== undefined
    ? listed.split(":").filter(Boolean)
    : VULKAN_DRIVER_DIRS.flatMap((d) => {
      try {
        return [...Deno.readDirSync(d)].filter((e) => e.name.endsWith(".json")).map((e) =>
          `${d}/${e.name}`
        );
      } catch {
        return [];
      }
    });
  return files.some((f) => {
    try {
      return Deno.statSync(f).isFile;
    } catch {
      return false;
    }
  });
}

/** "Vulkan", "OpenGL ES (no Vulkan driver found)", what DENO_WEBGPU_BACKEND names, or undefined off Linux. */
export function webgpuApi(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
  os: string = Deno.build.os,
): string | undefined {
  const forced = env("DENO_WEBGPU_BACKEND");
  if (forced !== undefined && forced !== "") return `${forced} (DENO_WEBGPU_BACKEND)`;
  if (os !== "linux") return undefined;
  return vulkanDriverPresent(env) ? "Vulkan" : "OpenGL ES (no Vulkan driver found)";
}

/** An engine description with the graphics API added for WebGPU: "webgpu (llvmpipe …) through Vulkan". */
export function describeWithGpuApi(
  description: string,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): string {
  if (!description.startsWith("webgpu")) return description;
  const api = webgpuApi(env);
  return api === undefined ? description : `${description} through ${api}`;
}
