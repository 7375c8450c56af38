import { ApiError } from "../http/errors.ts";

export interface StorageLimits {
  /** Bytes one key's files (inputs and outputs) may take. */
  readonly maxBytes: number;
  /** Files one key may keep. */
  readonly maxFiles: number;
}

/** What one key's stored files take. */
export interface StorageUse {
  readonly files: number;
  readonly bytes: number;
}

/**
 * Each key's share of the data folder: an upload is refused (400 naming the quota, the use and
 * the request) when the key's stored files plus its uploads in progress would pass
 * --batch-max-storage bytes or --batch-max-files files. Without key scopes, the server is one
 * tenant and the quota bounds the whole folder. A batch's output and error files count once
 * written; they are never refused, so a batch always finishes.
 */
export class StorageQuota {
  readonly #limits: StorageLimits;
  readonly #usage: (scope: string | undefined) => Promise<StorageUse>;
  /** Bytes of uploads in progress, by scope ("" for none). */
  readonly #receiving = new Map<string, number>();

  constructor(
    limits: StorageLimits,
    usage: (scope: string | undefined) => Promise<StorageUse>,
  ) {
    this.#limits = limits;
    this.#usage = usage;
  }

  /**
   * Starts an upload of `declared` bytes at most (the body's Content-Length, if any): throws
   * when it cannot fit. The reservation's add() counts bytes as they arrive and throws once
   * they pass the quota; end() gives the reservation back.
   */
  async begin(
    scope: string | undefined,
    declared: number | undefined,
  ): Promise<{ add(n: number): void; end(): void }> {
    const key = scope ?? "";
    const use = await this.#usage(scope);
    if (use.files >= this.#limits.maxFiles) {
      throw new ApiError(
        "storage_quota_exceeded",
        `Storage quota exceeded: ${use.files} files are stored, the most one key may keep ` +
          `(--batch-max-files ${this.#limits.maxFiles}); this upload would add 1. ` +
          `Delete files with DELETE /v1/files/{id}`,
        "file",
      );
    }
    let mine = 0;
    const check = (needed: number, what: string) => {
      const used = use.bytes + (this.#receiving.get(key) ?? 0) - mine;
      if (used + needed > this.#limits.maxBytes) {
        throw new ApiError(
          "storage_quota_exceeded",
          `Storage quota exceeded: this key's files use ${used} of ${this.#limits.maxBytes} ` +
            `bytes (--batch-max-storage) and this upload requests ${what}. ` +
            `Delete files with DELETE /v1/files/{id}`,
          "file",
        );
      }
    };
    if (declared !== undefined) check(declared, `${declared} (its body's length)`);
    let ended = false;
    return {
      add: (n: number) => {
        check(mine + n, `${mine + n} (the bytes received so far)`);
        mine += n;
        this.#receiving.set(key, (this.#receiving.get(key) ?? 0) + n);
      },
      end: () => {
        if (ended) return;
        ended = true;
        const left = (this.#receiving.get(key) ?? 0) - mine;
        if (left <= 0) this.#receiving.delete(key);
        else this.#receiving.set(key, left);
      },
    };
  }
}
