/** Where the batch queue keeps files and results without --data-dir. */
export function resolveDataDir(
  dataDir: string | undefined,
  env: (name: string) => string | undefined,
): string {
  if (dataDir !== undefined) return dataDir;
  const xdg = env("XDG_DATA_HOME");
  if (xdg !== undefined && xdg !== "") return `${xdg}/llmserve`;
  const home = env("HOME");
  if (home !== undefined && home !== "") return `${home}/.local/share/llmserve`;
  const local = env("LOCALAPPDATA");
  return local !== undefined && local !== "" ? `${local}/llmserve` : ".llmserve-data";
}
