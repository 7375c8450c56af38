import { ConstraintError, GrammarUnavailableError } from "./constraint_error.ts";
import { checkConstraintBounds, checkRoom, type ConstraintNeeds } from "./constraint_bounds.ts";
import { GRAMMAR_LIMITS, type GrammarLimits } from "./grammar_limits.ts";
import { type GrammarRestartReason, GrammarThread, ThreadGoneError } from "./grammar_thread.ts";
import {
  type GrammarVocabulary,
  grammarVocabularyInSlices,
  longestToken,
} from "./grammar_vocabulary.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { constraintKey, type OutputConstraint } from "./output_constraint.ts";
import type { TokenConstraint } from "./token_constraint.ts";
import { tokenAllowed } from "../engine/token_mask.ts";
import { sha256OfText } from "../util/sha256.ts";

/** Compiled grammars kept (least recently used dropped first). */
const DEFAULT_CACHE_ENTRIES = 64;

/** Fresh workers a call may be moved to when the one it waited on was ended under it. */
const MOVES = 2;

export interface GrammarServiceStats {
  readonly compiles: number;
  readonly hits: number;
  readonly entries: number;
  /** Workers ended and started afresh, by why. */
  readonly restarts: Readonly<Record<GrammarRestartReason, number>>;
}

export interface GrammarServiceOptions {
  readonly cacheEntries?: number;
  /** Bounds and budgets (default GRAMMAR_LIMITS); tests lift one to reach XGrammar with it. */
  readonly limits?: GrammarLimits;
  /** Told of each worker ended (trap, budget, cancelled compile, crash): log and count it. */
  readonly onRestart?: (reason: GrammarRestartReason, why: string) => void;
  /** XGrammar's bundle (default: the npm package's, xgrammar.ts's XGRAMMAR_BUNDLE). */
  readonly bundle?: string;
}

/** What a request brings to a compile: its room for output and its client's going away. */
export interface ConstraintRequest {
  /** Tokens the request may generate: a schema whose minimum cannot fit is refused. */
  readonly maxTokens?: number;
  /** Aborted when the client leaves: a compile only it waits for is ended. */
  readonly signal?: AbortSignal;
}

/** A grammar compiled in a grammar worker, named by its id there. */
export class CompiledGrammarHandle {
  constructor(readonly gid: number, readonly thread: GrammarThread) {}
}

export { ConstraintError };

/**
 * Compiles output constraints against one vocabulary, once per distinct constraint (an LRU keyed
 * by the SHA-256 of its text), and starts a matcher per sequence. XGrammar runs on a small pool
 * of workers (grammar_worker.ts), off the thread that streams every generation; a compile goes
 * to the least busy one, so one slow compile does not hold up another request's.
 *
 * Nothing a request sends can break it for the others: a constraint is checked against
 * GRAMMAR_LIMITS first (constraint_bounds.ts), each compile runs within a time budget and each
 * worker within a memory budget, and a compile over budget, a cancelled one or a WebAssembly
 * trap ends its worker and starts a fresh one (the vocabulary sent again). That request gets
 * the 400; the grammars cached there are forgotten, and the matchers that lived there move to a
 * fresh worker, replaying the tokens they had accepted.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { loadModel } from "../model/load_model.ts";
 * import { Tokenizer } from "../tokenizer/tokenizer.ts";
 * import { grammarVocabulary } from "./grammar_vocabulary.ts";
 *
 * const { config, tokenizer: data } = await loadModel("stories260K.bin", { tokenizerPath: "tok512.bin" });
 * const tokenizer = new Tokenizer(data!);
 * const grammars = await GrammarService.create(grammarVocabulary(tokenizer, config.vocabSize));
 * const c = await grammars.constraint({ type: "json_object" });
 * const mask = await c.nextMask();
 * const allowed = (id: number) => ((mask[id >>> 5]! >>> (id & 31)) & 1) === 1;
 * // A JSON object opens with "{", which tok512 spells only as its byte token <0x7B>: id 126.
 * const first = Array.from({ length: config.vocabSize }, (_, id) => id).filter(allowed);
 * assertEquals(first, [126]);
 * assertEquals(c.accept(126), true);
 * c.dispose();
 * grammars.close();
 * ```
 */
export class GrammarService {
  readonly vocabSize: number;
  readonly stopIds: readonly number[];
  readonly limits: GrammarLimits;
  /** Bytes of the vocabulary's longest token: what one token can write at most. */
  readonly longestToken: number;
  #vocab: GrammarVocabulary;
  #threads: GrammarThread[] = [];
  #cache = new Map<string, CacheEntry>();
  #capacity: number;
  #compiles = 0;
  #hits = 0;
  #restarts: Record<GrammarRestartReason, number> = { trap: 0, budget: 0, cancelled: 0, crash: 0 };
  #onRestart: GrammarServiceOptions["onRestart"];
  #bundle: string | undefined;
  #closed = false;
  #nextGid = 1;
  #nextMid = 1;

  private constructor(vocab: GrammarVocabulary, opts: GrammarServiceOptions) {
    this.#vocab = vocab;
    this.vocabSize = vocab.vocabSize;
    this.stopIds = vocab.stopIds;
    this.limits = opts.limits ?? GRAMMAR_LIMITS;
    this.longestToken = longestToken(vocab);
    this.#capacity = opts.cacheEntries ?? DEFAULT_CACHE_ENTRIES;
    this.#onRestart = opts.onRestart;
    this.#bundle = opts.bundle;
  }

  /**
   * Starts the pool's first worker; rejects when XGrammar cannot be started. The others start
   * only when a compile would otherwise wait behind a busy one (#pick): each holds its own
   * XGrammar tokenizer data and runtime (~60-90 MiB on a 150k vocabulary), which a server
   * constraining one request at a time never needs twice.
   */
  static async create(
    vocab: GrammarVocabulary,
    opts: GrammarServiceOptions = {},
  ): Promise<GrammarService> {
    const service = new GrammarService(vocab, opts);
    const first = service.#start();
    service.#threads.push(first);
    try {
      await first.ready;
    } catch (e) {
      service.close();
      throw e;
    }
    return service;
  }

  /** Bytes of XGrammar's WebAssembly heap in each live worker that has started. */
  heapBytes(): number[] {
    return this.#threads.flatMap((t) => t.alive && t.heapBytes > 0 ? [t.heapBytes] : []);
  }

  stats(): GrammarServiceStats {
    return {
      compiles: this.#compiles,
      hits: this.#hits,
      entries: this.#cache.size,
      restarts: { ...this.#restarts },
    };
  }

  /** Ends the grammar workers; every constraint made here is unusable afterwards. */
  close(): void {
    this.#closed = true;
    for (const t of this.#threads) t.close();
  }

  #start(): GrammarThread {
    const thread: GrammarThread = new GrammarThread(
      this.#vocab,
      { memoryBytes: this.limits.workerMemoryBytes, bundle: this.#bundle },
      (reason, why) => this.#died(thread, reason, why),
    );
    return thread;
  }

  /**
   * A worker was ended: forget what it held. It is replaced when next needed (#pick), so an
   * engine that cannot start is tried again per request, never in a loop.
   */
  #died(thread: GrammarThread, reason: GrammarRestartReason, why: string): void {
    for (const [key, entry] of this.#cache) {
      if (entry.handle?.thread === thread) this.#cache.delete(key);
    }
    if (this.#closed) return;
    this.#restarts[reason]++;
    (this.#onRestart ?? ((r, w) => console.error(`grammar worker ended (${r}): ${w}`)))(
      reason,
      why,
    );
  }

  /**
   * The least busy worker that has its vocabulary, its `compiling` counted up before anything
   * is awaited (the caller counts it down); a 503 when none can start.
   */
  async #pick(): Promise<GrammarThread> {
    if (this.#closed) throw new GrammarUnavailableError("The grammar service was closed");
    this.#threads = this.#threads.map((t) => t.alive ? t : this.#start());
    const idle = this.#threads.some((t) => t.compiling === 0);
    if (!idle && this.#threads.length < this.limits.workers) this.#threads.push(this.#start());
    let failure: unknown;
    for (const thread of [...this.#threads].sort((a, b) => a.load - b.load)) {
      thread.compiling++;
      try {
        await thread.ready;
        if (thread.alive) return thread;
      } catch (e) {
        failure = e;
      }
      thread.compiling--;
    }
    throw new GrammarUnavailableError(
      `Cannot constrain the output: the grammar engine could not be started (${
        failure instanceof Error ? failure.message : failure ?? "its workers were ended"
      }); retry later`,
    );
  }

  /**
   * The compiled grammar of a constraint, from the cache when it was compiled before. Throws
   * ConstraintError with the bound it breaks or XGrammar's reason when it cannot be compiled.
   */
  async compile(c: OutputConstraint, req: ConstraintRequest = {}): Promise<CompiledGrammarHandle> {
    const entry = this.#entry(c);
    try {
      if (req.maxTokens !== undefined) checkRoom(entry.needs, req.maxTokens, this.longestToken);
      return await waitFor(entry, req.signal);
    } finally {
      this.#unpin(entry);
    }
  }

  /**
   * The cache entry of a constraint, pinned: it is not disposed before #unpin. Synchronous up to
   * the worker's choice, so compiles asked for in one turn are counted on different workers.
   */
  #entry(c: OutputConstraint): CacheEntry {
    const key = sha256OfText(constraintKey(c));
    const hit = this.#cache.get(key);
    if (hit) {
      this.#hits++;
      this.#cache.delete(key);
      this.#cache.set(key, hit);
      hit.pins++;
      return hit;
    }
    const needs = checkConstraintBounds(c, this.limits);
    this.#compiles++;
    const cancel = new AbortController();
    const entry: CacheEntry = {
      grammar: undefined as unknown as Promise<CompiledGrammarHandle>,
      pins: 1,
      waiting: 0,
      cancel,
      evicted: false,
      needs,
    };
    entry.grammar = this.#compileSomewhere(c, cancel.signal).then((h) => entry.handle = h);
    this.#cache.set(key, entry);
    entry.grammar.catch(() => {
      if (this.#cache.get(key) === entry) this.#cache.delete(key);
    });
    while (this.#cache.size > this.#capacity) {
      const [oldest, old] = this.#cache.entries().next().value!;
      this.#cache.delete(oldest);
      old.evicted = true;
      if (old.pins === 0) this.#dispose(old);
    }
    return entry;
  }

  /** Compiles on the least busy worker, within the budget; again elsewhere if that one ended. */
  async #compileSomewhere(
    c: OutputConstraint,
    signal: AbortSignal,
  ): Promise<CompiledGrammarHandle> {
    const gid = this.#nextGid++;
    const budget = {
      ms: this.limits.compileMs,
      what: `the ${this.limits.compileMs} ms compile budget`,
      signal,
    };
    for (let move = 0;; move++) {
      const thread = await this.#pick();
      try {
        await thread.call({ op: "compile", call: 0, gid, constraint: c }, budget);
        return new CompiledGrammarHandle(gid, thread);
      } catch (e) {
        if (!(e instanceof ThreadGoneError) || move >= MOVES || signal.aborted) throw e;
      } finally {
        thread.compiling--;
      }
    }
  }

  #unpin(entry: CacheEntry): void {
    if (--entry.pins === 0 && entry.evicted) this.#dispose(entry);
  }

  #dispose(entry: CacheEntry): void {
    entry.grammar.then((g) => g.thread.post({ op: "drop", gid: g.gid }), () => {});
  }

  /**
   * A fresh matcher for a sequence, advanced over `replay` (tokens an earlier attempt already
   * generated under this constraint: a failover resubmission).
   */
  async constraint(
    c: OutputConstraint,
    replay: readonly number[] = [],
    req: ConstraintRequest = {},
  ): Promise<TokenConstraint> {
    const { thread, mid } = await this.matcher(c, replay, req);
    return new WorkerConstraint(this, c, thread, mid, replay);
  }

  /** A matcher in some worker, advanced over `replay`; moves on when its worker is ended. */
  async matcher(
    c: OutputConstraint,
    replay: readonly number[],
    req: ConstraintRequest = {},
  ): Promise<{ thread: GrammarThread; mid: number }> {
    for (let move = 0;; move++) {
      const entry = this.#entry(c);
      const mid = this.#nextMid++;
      try {
        if (req.maxTokens !== undefined) checkRoom(entry.needs, req.maxTokens, this.longestToken);
        // Pinned until the matcher holds its own reference (XGrammar shares the grammar).
        const { gid, thread } = await waitFor(entry, req.signal);
        const reply = await thread.call({ op: "matcher", call: 0, mid, gid, replay: [...replay] });
        const at = reply.ok ? reply.refusedAt : undefined;
        if (at !== undefined) {
          throw new ConstraintError(
            `Cannot resume the constrained output: generated token ${at} (id ${
              replay[at]
            }) does not fit the grammar`,
          );
        }
        return { thread, mid };
      } catch (e) {
        if (!(e instanceof ThreadGoneError) || move >= MOVES) throw e;
      } finally {
        this.#unpin(entry);
      }
    }
  }
}

/** A compiled grammar in the LRU, and how many callers are using or awaiting it right now. */
interface CacheEntry {
  grammar: Promise<CompiledGrammarHandle>;
  /** The grammar once compiled: which worker holds it. */
  handle?: CompiledGrammarHandle;
  pins: number;
  /** Callers awaiting the compile with a signal; it is cancelled once all of them left. */
  waiting: number;
  readonly cancel: AbortController;
  evicted: boolean;
  readonly needs: ConstraintNeeds;
}

/** The entry's grammar; a caller whose signal fires stops waiting, the last one ends the compile. */
function waitFor(
  entry: CacheEntry,
  signal: AbortSignal | undefined,
): Promise<CompiledGrammarHandle> {
  if (entry.handle) return entry.grammar;
  if (signal?.aborted) return Promise.reject(signal.reason);
  entry.waiting++;
  return new Promise((resolve, reject) => {
    let left = false;
    const onAbort = () => {
      left = true;
      reject(signal!.reason);
      if (--entry.waiting === 0 && !entry.handle) entry.cancel.abort(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    entry.grammar.then(resolve, reject).finally(() => {
      if (!left) entry.waiting--;
      signal?.removeEventListener("abort", onAbort);
    });
  });
}

/**
 * A matcher in a grammar worker behind the TokenConstraint interface. A token is checked
 * against the mask it was sampled under at once (XGrammar accepts exactly the tokens its mask
 * allows), and fed to the matcher with the next mask's request. It keeps every token it
 * accepted, so when its worker is ended under it (another request's trap or budget) it starts
 * again on a fresh worker, replaying them.
 */
class WorkerConstraint implements TokenConstraint {
  #service: GrammarService;
  #constraint: OutputConstraint;
  #thread: GrammarThread;
  #mid: number;
  #mask: Uint32Array | undefined;
  #accepted: number[];
  #unsent: number[] = [];
  #disposed = false;

  constructor(
    service: GrammarService,
    constraint: OutputConstraint,
    thread: GrammarThread,
    mid: number,
    replay: readonly number[],
  ) {
    this.#service = service;
    this.#constraint = constraint;
    this.#thread = thread;
    this.#mid = mid;
    this.#accepted = [...replay];
    this.stopIds = service.stopIds;
  }

  readonly stopIds: readonly number[];

  accept(token: number): boolean {
    if (this.#mask && !tokenAllowed(this.#mask, token)) return false;
    this.#unsent.push(token);
    this.#accepted.push(token);
    this.#mask = undefined;
    return true;
  }

  async nextMask(): Promise<Uint32Array> {
    if (this.#disposed) throw new Error("the constraint was disposed");
    const tokens = this.#unsent;
    this.#unsent = [];
    let answer;
    for (let move = 0;; move++) {
      try {
        answer = await this.#thread.mask({ mid: this.#mid, tokens: move === 0 ? tokens : [] });
        break;
      } catch (e) {
        if (!(e instanceof ThreadGoneError) || move >= MOVES) throw e;
        const moved = await this.#service.matcher(this.#constraint, this.#accepted);
        [this.#thread, this.#mid] = [moved.thread, moved.mid];
      }
    }
    if ("refused" in answer) {
      throw new Error(`the grammar refused token ${tokens[answer.refused]}`);
    }
    if ("error" in answer) throw new Error(answer.error);
    this.#mask = answer.mask;
    return answer.mask;
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#thread.post({ op: "free", mid: this.#mid });
  }
}

/**
 * A GrammarService made on the first constrained request: building XGrammar's view of a 150k
 * vocabulary takes about 200 ms, which a server that never constrains should not pay. A start
 * that fails is not kept: that request gets GrammarUnavailableError (a 503), and the next one
 * tries again.
 */
export function lazyGrammarService(
  tokenizer: Tokenizer,
  vocabSize: number,
  opts: GrammarServiceOptions = {},
): {
  constraint(
    c: OutputConstraint,
    replay: readonly number[],
    req?: ConstraintRequest,
  ): Promise<TokenConstraint>;
  service(): Promise<GrammarService>;
  /** Ends its workers (the model is unloaded); later requests get GrammarUnavailableError. */
  close(): void;
} {
  let service: Promise<GrammarService> | undefined;
  let closed = false;
  const get = () => {
    if (closed) {
      return Promise.reject(new GrammarUnavailableError("The grammar service was closed"));
    }
    return service ??= grammarVocabularyInSlices(tokenizer, vocabSize).then((vocab) =>
      GrammarService.create(vocab, opts)
    ).then(
      (s) => {
        if (closed) s.close();
        return s;
      },
      (e) => {
        service = undefined;
        throw new GrammarUnavailableError(
          `Cannot constrain the output: the grammar engine could not be started (${
            e instanceof Error ? e.message : e
          }); retry later`,
        );
      },
    );
  };
  return {
    service: get,
    constraint: async (c, replay, req) => (await get()).constraint(c, replay, req),
    close: () => {
      closed = true;
      service?.then((s) => s.close(), () => {});
    },
  };
}
