/** One open generation: aborting it cancels the core's work. */
export interface InFlightEntry {
  readonly signal: AbortSignal;
  abort(reason: string): void;
  /** Removes the entry; safe to call twice. */
  end(): void;
}

/**
 * The generations the HTTP layer has open, across HTTP and WebSocket, so drain() can wait for
 * them and abort the stragglers at its deadline.
 */
export class InFlightRegistry {
  #entries = new Set<AbortController>();
  #idleWaiters: Array<() => void> = [];

  get size(): number {
    return this.#entries.size;
  }

  /** Opens an entry whose signal also aborts when `parent` does. */
  begin(parent?: AbortSignal): InFlightEntry {
    const ctrl = new AbortController();
    const onParent = () => ctrl.abort(parent?.reason);
    if (parent?.aborted) ctrl.abort(parent.reason);
    else parent?.addEventListener("abort", onParent, { once: true });
    this.#entries.add(ctrl);
    return {
      signal: ctrl.signal,
      abort: (reason) => ctrl.abort(reason),
      end: () => {
        parent?.removeEventListener("abort", onParent);
        if (this.#entries.delete(ctrl) && this.#entries.size === 0) {
          for (const w of this.#idleWaiters.splice(0)) w();
        }
      },
    };
  }

  /** Resolves true when nothing is in flight, false if `timeoutMs` passes first. */
  whenIdle(timeoutMs: number): Promise<boolean> {
    if (this.#entries.size === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const waiter = () => {
        clearTimeout(timer);
        resolve(true);
      };
      const timer = setTimeout(() => {
        this.#idleWaiters = this.#idleWaiters.filter((w) => w !== waiter);
        resolve(false);
      }, timeoutMs);
      this.#idleWaiters.push(waiter);
    });
  }

  abortAll(reason: string): number {
    let n = 0;
    for (const ctrl of this.#entries) {
      if (!ctrl.signal.aborted) n++;
      ctrl.abort(reason);
    }
    return n;
  }
}
