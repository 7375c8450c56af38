import { Worker } from "node:worker_threads";
import { ConstraintError } from "./constraint_error.ts";
import { type GrammarVocabulary, grammarVocabulary } from "./grammar_vocabulary.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { constraintKey, type OutputConstraint } from "./output_constraint.ts";
import type { TokenConstraint } from "./token_constraint.ts";
import type { GrammarReply, GrammarRequest, MaskAnswer, MaskItem } from "./grammar_worker.ts";
import { tokenAllowed } from "../engine/token_mask.ts";

/** Compiled grammars kept (least recently used dropped first). */
const DEFAULT_CACHE_ENTRIES = 64;

export interface GrammarServiceStats {
  readonly compiles: number;
  readonly hits: number;
  readonly entries: number;
}

/** A grammar compiled in the grammar thread, named by its id there. */
export class CompiledGrammarHandle {
  constructor(readonly gid: number) {}
}

export { ConstraintError };

/**
 * Compiles output constraints against one vocabulary, once per distinct constraint (an LRU keyed
 * by the SHA-256 of its text), and starts a matcher per sequence. XGrammar runs on a thread of
 * its own (grammar_worker.ts): a cold compile (about a second on a 150k vocabulary) no longer
 * stalls the thread that streams every generation, and the masks of all the sequences that
 * want one are computed there in one round trip.
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
 * ```
 */
export class GrammarService {
  readonly vocabSize: number;
  readonly stopIds: readonly number[];
  #thread: GrammarThread;
  #cache = new Map<string, CacheEntry>();
  #capacity: number;
  #compiles = 0;
  #hits = 0;
  #nextGid = 1;
  #nextMid = 1;

  private constructor(thread: GrammarThread, vocab: GrammarVocabulary, capacity: number) {
    this.#thread = thread;
    this.vocabSize = vocab.vocabSize;
    this.stopIds = vocab.stopIds;
    this.#capacity = capacity;
  }

  static async create(
    vocab: GrammarVocabulary,
    opts: { cacheEntries?: number } = {},
  ): Promise<GrammarService> {
    const thread = new GrammarThread();
    try {
      await thread.call({ op: "init", call: 0, vocab });
    } catch (e) {
      thread.close();
      throw e;
    }
    return new GrammarService(thread, vocab, opts.cacheEntries ?? DEFAULT_CACHE_ENTRIES);
  }

  stats(): GrammarServiceStats {
    return { compiles: this.#compiles, hits: this.#hits, entries: this.#cache.size };
  }

  /** Ends the grammar thread; every constraint made here is unusable afterwards. */
  close(): void {
    this.#thread.close();
  }

  /**
   * The compiled grammar of a constraint, from the cache when it was compiled before. Throws
   * ConstraintError with XGrammar's reason when it cannot be compiled.
   */
  async compile(c: OutputConstraint): Promise<CompiledGrammarHandle> {
    const entry = await this.#entry(c);
    try {
      return await entry.grammar;
    } finally {
      this.#unpin(entry);
    }
  }

  /** The cache entry of a constraint, pinned: it is not disposed before #unpin. */
  async #entry(c: OutputConstraint): Promise<CacheEntry> {
    const key = await sha256(constraintKey(c));
    const hit = this.#cache.get(key);
    if (hit) {
      this.#hits++;
      this.#cache.delete(key);
      this.#cache.set(key, hit);
      hit.pins++;
      return hit;
    }
    this.#compiles++;
    const gid = this.#nextGid++;
    const grammar = this.#thread.call({ op: "compile", call: 0, gid, constraint: c })
      .then(() => new CompiledGrammarHandle(gid));
    const entry: CacheEntry = { grammar, pins: 1, evicted: false };
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

  #unpin(entry: CacheEntry): void {
    if (--entry.pins === 0 && entry.evicted) this.#dispose(entry);
  }

  #dispose(entry: CacheEntry): void {
    entry.grammar.then((g) => this.#thread.post({ op: "drop", gid: g.gid }), () => {});
  }

  /**
   * A fresh matcher for a sequence, advanced over `replay` (tokens an earlier attempt already
   * generated under this constraint: a failover resubmission).
   */
  async constraint(c: OutputConstraint, replay: readonly number[] = []): Promise<TokenConstraint> {
    const entry = await this.#entry(c);
    const mid = this.#nextMid++;
    let reply: GrammarReply;
    try {
      // Pinned until the matcher holds its own reference (XGrammar shares the grammar).
      const { gid } = await entry.grammar;
      reply = await this.#thread.call({ op: "matcher", call: 0, mid, gid, replay: [...replay] });
    } finally {
      this.#unpin(entry);
    }
    const at = reply.ok ? reply.refusedAt : undefined;
    if (at !== undefined) {
      throw new ConstraintError(
        `Cannot resume the constrained output: generated token ${at} (id ${
          replay[at]
        }) does not fit the grammar`,
      );
    }
    return new WorkerConstraint(this.#thread, mid, this.stopIds);
  }
}

/** A compiled grammar in the LRU, and how many callers are using it right now. */
interface CacheEntry {
  readonly grammar: Promise<CompiledGrammarHandle>;
  pins: number;
  evicted: boolean;
}

/**
 * The grammar thread and its calls. It keeps the process alive only while a call is waiting
 * for its answer (a server or a test that never closes it still exits). Mask requests made in
 * the same turn of the event loop (the scheduler asks for every constrained sequence's at once)
 * go in one message.
 */
class GrammarThread {
  #worker: Worker;
  #calls = new Map<number, { resolve: (r: GrammarReply) => void; reject: (e: Error) => void }>();
  #nextCall = 1;
  #batch: { item: MaskItem; resolve: (a: MaskAnswer) => void; reject: (e: Error) => void }[] = [];
  #broken: Error | undefined;

  constructor() {
    this.#worker = new Worker(new URL("./grammar_worker.ts", import.meta.url));
    this.#worker.unref();
    this.#worker.on("message", (reply: GrammarReply) => {
      const waiting = this.#calls.get(reply.call);
      this.#calls.delete(reply.call);
      if (this.#calls.size === 0) this.#worker.unref();
      if (!waiting) return;
      if (reply.ok) waiting.resolve(reply);
      else {
        waiting.reject(
          reply.constraint ? new ConstraintError(reply.message) : new Error(reply.message),
        );
      }
    });
    const fail = (e: Error) => {
      this.#broken = new Error(`The grammar thread failed: ${e.message}`);
      for (const w of this.#calls.values()) w.reject(this.#broken);
      this.#calls.clear();
      this.#worker.unref();
    };
    this.#worker.on("error", fail);
    this.#worker.on("exit", () => fail(new Error("it exited")));
  }

  /** Sends a request (its `call` is filled in) and waits for its answer. */
  call(req: GrammarRequest & { call: number }): Promise<GrammarReply> {
    if (this.#broken) return Promise.reject(this.#broken);
    const call = this.#nextCall++;
    return new Promise((resolve, reject) => {
      if (this.#calls.size === 0) this.#worker.ref();
      this.#calls.set(call, { resolve, reject });
      this.#worker.postMessage({ ...req, call });
    });
  }

  /** Sends a request that has no answer. */
  post(req: GrammarRequest): void {
    if (!this.#broken) this.#worker.postMessage(req);
  }

  /** The next mask of a matcher after `tokens`, batched with the others asked for meanwhile. */
  mask(item: MaskItem): Promise<MaskAnswer> {
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
      (e) => batch.forEach((b) => b.reject(e)),
    );
  }

  close(): void {
    this.#broken ??= new Error("The grammar service was closed");
    this.#worker.terminate();
  }
}

/**
 * A matcher in the grammar thread behind the TokenConstraint interface. A token is checked
 * against the mask it was sampled under at once (XGrammar accepts exactly the tokens its mask
 * allows), and fed to the matcher with the next mask's request.
 */
class WorkerConstraint implements TokenConstraint {
  #thread: GrammarThread;
  #mid: number;
  #mask: Uint32Array | undefined;
  #unsent: number[] = [];
  #disposed = false;

  constructor(thread: GrammarThread, mid: number, readonly stopIds: readonly number[]) {
    this.#thread = thread;
    this.#mid = mid;
  }

  accept(token: number): boolean {
    if (this.#mask && !tokenAllowed(this.#mask, token)) return false;
    this.#unsent.push(token);
    this.#mask = undefined;
    return true;
  }

  async nextMask(): Promise<Uint32Array> {
    if (this.#disposed) throw new Error("the constraint was disposed");
    const tokens = this.#unsent;
    this.#unsent = [];
    const answer = await this.#thread.mask({ mid: this.#mid, tokens });
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

async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * A GrammarService made on the first constrained request: building XGrammar's view of a 150k
 * vocabulary takes about 200 ms, which a server that never constrains should not pay.
 */
export function lazyGrammarService(
  tokenizer: Tokenizer,
  vocabSize: number,
): { constraint: GrammarService["constraint"]; service(): Promise<GrammarService> } {
  let service: Promise<GrammarService> | undefined;
  const get = () => service ??= GrammarService.create(grammarVocabulary(tokenizer, vocabSize));
  return {
    service: get,
    constraint: async (c, replay) => (await get()).constraint(c, replay),
  };
}
