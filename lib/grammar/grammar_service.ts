import { ConstraintError } from "./constraint_error.ts";
import { type GrammarVocabulary, grammarVocabulary } from "./grammar_vocabulary.ts";
import type { Tokenizer } from "../tokenizer/tokenizer.ts";
import { constraintKey, type OutputConstraint } from "./output_constraint.ts";
import type { TokenConstraint } from "./token_constraint.ts";
import {
  type CompiledGrammar,
  type GrammarCompiler,
  type GrammarMatcher,
  loadXGrammar,
  type XGrammar,
  xgrammarCall,
  XGrammarError,
} from "./xgrammar.ts";

/**
 * How JSON is laid out under a schema: one line, ", " and ": " between items (Python's
 * json.dumps), no other whitespace. Free whitespace lets a model pad forever, and a fixed layout
 * makes the same request give the same text on every replica.
 */
const JSON_LAYOUT = {
  anyWhitespace: false,
  indent: -1,
  separators: [", ", ": "] as [string, string],
};

/** Compiled grammars kept (least recently used dropped first). */
const DEFAULT_CACHE_ENTRIES = 64;

/** The grammar of OpenAI's json_object: any JSON object. */
const ANY_OBJECT = '{"type": "object"}';

export interface GrammarServiceStats {
  readonly compiles: number;
  readonly hits: number;
  readonly entries: number;
}

export { ConstraintError };

/**
 * Compiles output constraints against one vocabulary, once per distinct constraint (an LRU keyed
 * by the SHA-256 of its text), and starts a matcher per sequence.
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
  #xg: XGrammar;
  /** For JSON: the vocabulary without tokens holding a control byte (see jsonVocabulary). */
  #jsonCompiler: GrammarCompiler;
  /** For grammars: every token; made on the first grammar. */
  #textCompiler: Promise<GrammarCompiler> | undefined;
  #vocab: GrammarVocabulary;
  #cache = new Map<string, CacheEntry>();
  #capacity: number;
  #compiles = 0;
  #hits = 0;

  private constructor(
    xg: XGrammar,
    jsonCompiler: GrammarCompiler,
    vocab: GrammarVocabulary,
    capacity: number,
  ) {
    this.#xg = xg;
    this.#jsonCompiler = jsonCompiler;
    this.#vocab = vocab;
    this.vocabSize = vocab.vocabSize;
    this.stopIds = vocab.stopIds;
    this.#capacity = capacity;
  }

  static async create(
    vocab: GrammarVocabulary,
    opts: { cacheEntries?: number } = {},
  ): Promise<GrammarService> {
    const xg = await loadXGrammar();
    const compiler = await compilerFor(xg, jsonVocabulary(vocab));
    return new GrammarService(xg, compiler, vocab, opts.cacheEntries ?? DEFAULT_CACHE_ENTRIES);
  }

  stats(): GrammarServiceStats {
    return { compiles: this.#compiles, hits: this.#hits, entries: this.#cache.size };
  }

  /**
   * The compiled grammar of a constraint, from the cache when it was compiled before. Throws
   * ConstraintError with XGrammar's reason when it cannot be compiled.
   */
  async compile(c: OutputConstraint): Promise<CompiledGrammar> {
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
    const entry: CacheEntry = { grammar: this.#compileNow(c), pins: 1, evicted: false };
    this.#cache.set(key, entry);
    entry.grammar.catch(() => {
      if (this.#cache.get(key) === entry) this.#cache.delete(key);
    });
    while (this.#cache.size > this.#capacity) {
      const [oldest, old] = this.#cache.entries().next().value!;
      this.#cache.delete(oldest);
      old.evicted = true;
      if (old.pins === 0) dispose(old);
    }
    return entry;
  }

  #unpin(entry: CacheEntry): void {
    if (--entry.pins === 0 && entry.evicted) dispose(entry);
  }

  /**
   * A fresh matcher for a sequence, advanced over `replay` (tokens an earlier attempt already
   * generated under this constraint: a failover resubmission).
   */
  async constraint(c: OutputConstraint, replay: readonly number[] = []): Promise<TokenConstraint> {
    const entry = await this.#entry(c);
    let matcher: GrammarMatcher;
    try {
      // Pinned until the matcher holds its own reference (XGrammar shares the grammar).
      matcher = await this.#xg.GrammarMatcher.createGrammarMatcher(await entry.grammar);
    } finally {
      this.#unpin(entry);
    }
    const constraint = new XGrammarConstraint(matcher, this.stopIds);
    for (let i = 0; i < replay.length; i++) {
      if (!constraint.accept(replay[i]!)) {
        constraint.dispose();
        throw new ConstraintError(
          `Cannot resume the constrained output: generated token ${i} (id ${
            replay[i]
          }) does not fit the grammar`,
        );
      }
    }
    return constraint;
  }

  async #compileNow(c: OutputConstraint): Promise<CompiledGrammar> {
    const json = this.#jsonCompiler;
    const text = c.type === "grammar"
      ? await (this.#textCompiler ??= compilerFor(this.#xg, this.#vocab))
      : undefined;
    const l = JSON_LAYOUT;
    return xgrammarCall(() => {
      switch (c.type) {
        case "json_object":
          return json.compileJSONSchema(ANY_OBJECT, l.anyWhitespace, l.indent, l.separators);
        case "json_schema":
          return json.compileJSONSchema(c.schema, l.anyWhitespace, l.indent, l.separators);
        case "grammar":
          return text!.compileGrammar(c.grammar);
      }
    }).catch((e) => {
      const what = c.type === "grammar" ? "grammar" : "JSON schema";
      const why = e instanceof XGrammarError ? e.message : String(e);
      throw new ConstraintError(`Cannot compile the ${what}: ${why}`);
    });
  }
}

/** A compiled grammar in the LRU, and how many callers are using it right now. */
interface CacheEntry {
  readonly grammar: Promise<CompiledGrammar>;
  pins: number;
  evicted: boolean;
}

function dispose(entry: CacheEntry): void {
  entry.grammar.then((g) => g.dispose(), () => {});
}

/** A compiler over a vocabulary (XGrammar's own unbounded cache off: ours is an LRU). */
async function compilerFor(xg: XGrammar, vocab: GrammarVocabulary): Promise<GrammarCompiler> {
  const info = await xgrammarCall(() =>
    xg.TokenizerInfo.createTokenizerInfo(
      // XGrammar copies each Uint8Array's bytes as they are (its std::string binding).
      vocab.tokens as unknown as string[],
      "raw",
      false,
      vocab.vocabSize,
      [...vocab.stopIds],
    )
  );
  return await xg.GrammarCompiler.createGrammarCompiler(info, false);
}

/**
 * The vocabulary JSON is made of: tokens holding a byte below 0x20 left out. Our JSON layout
 * has no newline or tab, and inside a string JSON forbids raw control characters, yet XGrammar
 * 0.1.27's string rule under minLength/maxLength (`[^"\\\r\n]{0,n}`) admits them: a tab or
 * \x1a token then made the output unparseable.
 */
function jsonVocabulary(vocab: GrammarVocabulary): GrammarVocabulary {
  const none = new Uint8Array(0);
  const tokens = vocab.tokens.map((t) => t.some((b) => b < 0x20) ? none : t);
  return { ...vocab, tokens };
}

/** A GrammarMatcher behind the TokenConstraint interface. */
class XGrammarConstraint implements TokenConstraint {
  #matcher: GrammarMatcher;
  #disposed = false;

  constructor(matcher: GrammarMatcher, readonly stopIds: readonly number[]) {
    this.#matcher = matcher;
  }

  accept(token: number): boolean {
    return this.#matcher.acceptToken(token);
  }

  async nextMask(): Promise<Uint32Array> {
    const words = await this.#matcher.getNextTokenBitmask();
    return new Uint32Array(words.buffer, words.byteOffset, words.length);
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#matcher.dispose();
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
