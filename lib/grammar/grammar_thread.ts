import { Worker } from "node:worker_threads";
import { ConstraintError } from "./constraint_error.ts";
import type { GrammarVocabulary } from "./grammar_vocabulary.ts";
import type { GrammarReply, GrammarRequest, MaskAnswer, MaskItem } from "./grammar_worker.ts";

/** Why a grammar worker was ended: the label of llm_grammar_worker_restarts_total. */
export type GrammarRestartReason = "trap" | "budget" | "cancelled" | "crash";

/**
 * The worker a call was waiting on was ended (another request's trap or budget, or a crash):
 * the call itself was not at fault and may be tried again on a fresh worker.
 */
export class ThreadGoneError extends Error {
  override readonly name = "ThreadGoneError";
}

/** How one call may end its worker: a time budget, and the client leaving. */
export interface CallBudget {
  readonly ms?: number;
  /** Text of the 400 when `ms` runs out ("the 10000 ms compile budget"). */
  readonly what?: string;
  readonly signal?: AbortSignal;
}

interface Waiting {
  resolve: (r: GrammarReply) => void;
  reject: (e: Error) => void;
}

/**
 * One grammar worker (grammar_worker.ts) and its calls. XGrammar's WebAssembly cannot be
 * interrupted and is left half-unwound by a trap, so a call over its budget, a cancelled one,
 * or a trap ends the worker (`terminate`): that call fails alone, every other call waiting on
 * it gets ThreadGoneError (its caller retries elsewhere), and `onDeath` lets the pool start a
 * fresh one. The worker keeps the process alive only while a call waits for its answer. Mask
 * requests made in the same turn of the event loop go in one message.
 */
export class GrammarThread {
  /** Settles once the worker has the vocabulary; rejects when it could not start. */
  readonly ready: Promise<void>;
  #worker: Worker;
  #calls = new Map<number, Waiting>();
  #nextCall = 1;
  #batch: { item: MaskItem; resolve: (a: MaskAnswer) => void; reject: (e: Error) => void }[] = [];
  #dead: Error | undefined;
  #onDeath: (reason: GrammarRestartReason, why: string) => void;

  constructor(
    vocab: GrammarVocabulary,
    engine: { readonly memoryBytes: number; readonly bundle?: string | undefined },
    onDeath: (reason: GrammarRestartReason, why: string) => void,
  ) {
    this.#onDeath = onDeath;
    this.#worker = new Worker(new URL("./grammar_worker.ts", import.meta.url), {
      workerData: engine,
    });
    this.#worker.unref();
    this.#worker.on("message", (reply: GrammarReply) => this.#answer(reply));
    this.#worker.on("error", (e: Error) => this.#end("crash", `it failed: ${e.message}`));
    this.#worker.on("exit", () => this.#end("crash", "it exited"));
    this.ready = this.call({ op: "init", call: 0, vocab }).then((r) => {
      if (r.ok) this.heapBytes = r.heapBytes ?? 0;
    }, (e) => {
      this.#end("crash", `it could not start: ${e instanceof Error ? e.message : e}`);
      throw e;
    });
    this.ready.catch(() => {});
  }

  /** XGrammar's WebAssembly heap once the worker held the vocabulary (0 before). */
  heapBytes = 0;

  get alive(): boolean {
    return this.#dead === undefined;
  }

  /**
   * Compiles sent here or on their way (counted from the moment the pool chose this worker, so
   * two compiles asked for in the same turn go to different workers), then calls waiting for an
   * answer: what the pool balances on.
   */
  compiling = 0;

  get load(): number {
    return this.compiling * 1_000_000 + this.#calls.size;
  }

  #answer(reply: GrammarReply): void {
    const waiting = this.#calls.get(reply.call);
    this.#calls.delete(reply.call);
    if (this.#calls.size === 0) this.#worker.unref();
    if (!waiting) return;
    if (reply.ok) return waiting.resolve(reply);
    if (reply.trapped) {
      waiting.reject(
        new ConstraintError(
          `${reply.message} (XGrammar's WebAssembly trapped on it; its worker was restarted)`,
        ),
      );
      this.#end("trap", reply.message);
      return;
    }
    waiting.reject(
      reply.constraint ? new ConstraintError(reply.message) : new Error(reply.message),
    );
  }

  /** Sends a request (its `call` is filled in) and waits for its answer, within `budget`. */
  call(req: GrammarRequest & { call: number }, budget: CallBudget = {}): Promise<GrammarReply> {
    if (this.#dead) return Promise.reject(this.#dead);
    const call = this.#nextCall++;
    return new Promise<GrammarReply>((resolve, reject) => {
      const { ms, signal } = budget;
      const timer = ms === undefined ? undefined : setTimeout(() => {
        reject(
          new ConstraintError(
            `Output constraint over a limit: compiling it took longer than ${budget.what}`,
          ),
        );
        this.#end("budget", `a call ran past ${budget.what}`);
      }, ms);
      const onAbort = () => {
        reject(signal!.reason instanceof Error ? signal!.reason : new Error("cancelled"));
        this.#end("cancelled", "its client left during a compile");
      };
      const settle = () => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      if (this.#calls.size === 0) this.#worker.ref();
      this.#calls.set(call, {
        resolve: (r) => (settle(), resolve(r)),
        reject: (e) => (settle(), reject(e)),
      });
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#worker.postMessage({ ...req, call });
    });
  }

  /** Sends a request that has no answer. */
  post(req: GrammarRequest): void {
    if (!this.#dead) this.#worker.postMessage(req);
  }

  /** The next mask of a matcher after `tokens`, batched with the others asked for meanwhile. */
  mask(item: MaskItem): Promise<MaskAnswer> {
    if (this.#dead) return Promise.reject(this.#dead);
    return new Promise((resolve, reject) => {
      if (this.#batch.length === 0) queueMicrotask(() => this.#flush());
      this.#batch.push({ item, resolve, reject });
    });
  }

  #flush(): void {
    const batch = this.#batch;
    this.#batch = [];
    this.call({ op: "masks", call: 0, items: batch.map((b) => b.item) }).then(
      (reply) => {
        const masks = reply.ok ? reply.masks ?? [] : [];
        batch.forEach((b, i) => {
          const m = masks[i];
          if (m) b.resolve(m);
          else b.reject(new Error("the grammar thread gave no mask"));
        });
      },
      // A trap while masking is no request's fault: every matcher moves to a fresh worker.
      (e) => batch.forEach((b) => b.reject(e instanceof ConstraintError ? this.#dead ?? e : e)),
    );
  }

  /** Ends the worker: every waiting call fails with ThreadGoneError; `onDeath` is told once. */
  #end(reason: GrammarRestartReason, why: string): void {
    if (this.#dead) return;
    this.#dead = new ThreadGoneError(`The grammar worker was ended: ${why}`);
    for (const w of this.#calls.values()) w.reject(this.#dead);
    this.#calls.clear();
    for (const b of this.#batch) b.reject(this.#dead);
    this.#batch = [];
    this.#worker.terminate();
    this.#onDeath(reason, why);
  }

  /** Ends the worker without counting a restart (the service is closing). */
  close(): void {
    this.#dead ??= new ThreadGoneError("The grammar service was closed");
    for (const w of this.#calls.values()) w.reject(this.#dead);
    this.#calls.clear();
    this.#worker.terminate();
  }
}
