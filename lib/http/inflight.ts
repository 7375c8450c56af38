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

  /**
   * Resolves true when nothing is in flight, false if `timeoutMs` passes or `cut` aborts
   * first.
   */
  whenIdle(timeoutMs: number, cut?: AbortSignal): Promise<boolean> {
    if (this.#entries.size === 0) return Promise.resolve(true);
    if (cut?.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      const settle = (idle: boolean) => {
        clearTimeout(timer);
        cut?.removeEventListener("abort", onCut);
        this.#idleWaiters = this.#idleWaiters.filter((w) => w !== waiter);
        resolve(idle);
      };
      const waiter = () => settle(true);
      const onCut = () => settle(false);
      const timer = setTimeout(() => settle(false), timeoutMs);
      cut?.addEventListener("abort", onCut, { once: true });
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
