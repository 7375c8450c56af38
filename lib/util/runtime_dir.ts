/**
 * A stand-in `XDG_RUNTIME_DIR` for processes started without one (su, cron, containers, CI
 * runners). Mesa's Vulkan device-select layer connects to Wayland on every Vulkan instance,
 * and libwayland prints "error: XDG_RUNTIME_DIR is invalid or not set in the environment."
 * each time the variable is missing: 3-4 lines per process that mean nothing to a server. A
 * directory that exists is enough to silence it (there is no compositor to find either way).
 *
 * The XDG spec asks for a directory owned by the user with mode 0700; one under the temp
 * directory is checked for exactly that, so a directory another user made in its place (or a
 * link) is never used.
 */

/** The directory to use, or undefined when the variable is set or no safe one can be made. */
export function runtimeDirFor(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): string | undefined {
  if ((env("XDG_RUNTIME_DIR") ?? "") !== "") return undefined;
  const uid = Deno.uid();
  if (uid === null) return undefined; // not a POSIX system: nothing reads it
  const dir = `${(env("TMPDIR") || "/tmp").replace(/\/+$/, "")}/llmserve-runtime-${uid}`;
  try {
    Deno.mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if (!(e instanceof Deno.errors.AlreadyExists)) return undefined;
  }
  try {
    const st = Deno.lstatSync(dir);
    const private_ = st.isDirectory && !st.isSymlink && st.uid === uid &&
      ((st.mode ?? 0) & 0o777) === 0o700;
    return private_ ? dir : undefined;
  } catch {
    return undefined;
  }
}

/** `{ XDG_RUNTIME_DIR }` for a child's environment when this process has none, else `{}`. */
export function runtimeDirEnv(
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Record<string, string> {
  const dir = runtimeDirFor(env);
  return dir === undefined ? {} : { XDG_RUNTIME_DIR: dir };
}
