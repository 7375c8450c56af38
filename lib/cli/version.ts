/** The release of llmserve, printed by `--version` with the runtime's versions. */
export const VERSION = "0.1.0";

/** `llmserve 0.1.0 (deno 2.9.6, v8 …, typescript …)`. */
export function versionLine(): string {
  const v = Deno.version;
  return `llmserve ${VERSION} (deno ${v.deno}, v8 ${v.v8}, typescript ${v.typescript})`;
}
