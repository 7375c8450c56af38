import { ApiError } from "../http/errors.ts";

export interface UploadBounds {
  /** Uploads streaming at once, over the whole server. */
  readonly perServer: number;
  /** Uploads streaming at once for one API key (with --cache-scope key). */
  readonly perKey: number;
}

/**
 * Counts uploads in progress, so that a few clients cannot hold every connection, file handle
 * and disk write of the server with slow uploads. Past a bound, 429 (with Retry-After).
 * Requests without a key scope share the server bound only.
 */
export class UploadSlots {
  readonly #bounds: UploadBounds;
  #server = 0;
  readonly #byKey = new Map<string, number>();

  constructor(bounds: UploadBounds) {
    this.#bounds = bounds;
  }

  /** Takes a slot or throws 429; call the returned function once the upload is over. */
  acquire(scope: string | undefined): () => void {
    const mine = scope === undefined ? 0 : this.#byKey.get(scope) ?? 0;
    if (scope !== undefined && mine >= this.#bounds.perKey) {
      throw new ApiError(
        "too_many_uploads",
        `This API key already has ${mine} uploads in progress, the most it may run at once ` +
          `(--batch-max-uploads-per-key ${this.#bounds.perKey}); retry when one has finished`,
      );
    }
    if (this.#server >= this.#bounds.perServer) {
      throw new ApiError(
        "too_many_uploads",
        `${this.#server} uploads are in progress, the most this server takes at once ` +
          `(--batch-max-uploads ${this.#bounds.perServer}); retry when one has finished`,
      );
    }
    this.#server++;
    if (scope !== undefined) this.#byKey.set(scope, mine + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#server--;
      if (scope === undefined) return;
      const left = this.#byKey.get(scope)! - 1;
      if (left === 0) this.#byKey.delete(scope);
      else this.#byKey.set(scope, left);
    };
  }
}
