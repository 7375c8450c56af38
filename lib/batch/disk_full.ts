import { ApiError } from "../http/errors.ts";

/** Whether a file-system error means the disk (or the user's disk quota) is full. */
export function isDiskFull(e: unknown): boolean {
  const code = (e as { code?: unknown } | null)?.code;
  return code === "ENOSPC" || code === "EDQUOT";
}

/** The 507 a request gets when the data folder has no room for what it would store. */
export function insufficientStorage(dataDir: string, e: unknown, what: string): ApiError {
  return new ApiError(
    "insufficient_storage",
    `The server's data folder ${dataDir} is full (${
      (e as Error).message ?? e
    }); ${what}. Try again once space is freed`,
  );
}

/** Runs a step that writes to the data folder; a full disk becomes the 507 naming it. */
export async function storing<T>(dataDir: string, what: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (e) {
    if (isDiskFull(e)) throw insufficientStorage(dataDir, e, what);
    throw e;
  }
}

/** Why a batch waits: the `errors` entry it shows until its results can be written again. */
export function diskErrorMessage(dataDir: string, e: unknown): string {
  const detail = (e as Error).message ?? String(e);
  return isDiskFull(e)
    ? `Cannot record results: the server's data folder ${dataDir} is full (${detail}); ` +
      `the batch waits and resumes when space is freed`
    : `Cannot record results in ${dataDir} (${detail}); the batch retries`;
}
