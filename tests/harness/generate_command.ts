const decoder = new TextDecoder();

/** The `generate` command (`main.ts generate`) as a child process, its output decoded. */
export async function runGenerate(
  args: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      new URL("../../main.ts", import.meta.url).pathname,
      "generate",
      ...args,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}
