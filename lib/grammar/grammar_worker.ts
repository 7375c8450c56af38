/**
 * The thread that owns XGrammar for a GrammarService (grammar_service.ts): its vocabulary, the
 * compiled grammars and every sequence's matcher. A cold compile takes about a second on a 150k
 * vocabulary and XGrammar's WebAssembly cannot be interrupted, so it runs here, off the thread
 * that streams every generation; a compiled grammar cannot leave the WebAssembly instance that
 * made it, so the matchers and their masks live here too.
 *
 * Requests come with a `call` number and are answered in order with it; `drop` and `free` have
 * no answer. Masks go back as transferred buffers (no copy).
 */
import { parentPort, workerData } from "node:worker_threads";
import { type GrammarVocabulary, tokenBytes } from "./grammar_vocabulary.ts";
import type { OutputConstraint } from "./output_constraint.ts";
import {
  type CompiledGrammar,
  type GrammarCompiler,
  type GrammarMatcher,
  loadXGrammar,
  type StructuralTag,
  type XGrammar,
  xgrammarCall,
  XGrammarError,
  xgrammarHeapBytes,
} from "./xgrammar.ts";

export type GrammarRequest =
  | { op: "init"; call: number; vocab: GrammarVocabulary }
  | { op: "compile"; call: number; gid: number; constraint: OutputConstraint }
  | { op: "drop"; gid: number }
  | { op: "matcher"; call: number; mid: number; gid: number; replay: readonly number[] }
  | { op: "masks"; call: number; items: readonly MaskItem[] }
  | { op: "free"; mid: number };

/** One matcher's next mask: first feed it `tokens` (sampled since its last mask). */
export interface MaskItem {
  readonly mid: number;
  readonly tokens: readonly number[];
}

/** A mask, or the index in `tokens` of the first token the grammar refused. */
export type MaskAnswer = { mask: Uint32Array } | { refused: number } | { error: string };

export type GrammarReply =
  /** `heapBytes` (init's answer): XGrammar's WebAssembly heap once it holds the vocabulary. */
  | { call: number; ok: true; masks?: MaskAnswer[]; refusedAt?: number; heapBytes?: number }
  /**
   * `constraint`: the request's grammar is at fault (a 400), else an internal failure.
   * `trapped`: XGrammar's WebAssembly trapped; this worker must not be used again.
   */
  | { call: number; ok: false; constraint: boolean; trapped?: boolean; message: string };

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

/** The grammar of OpenAI's json_object: any JSON object. */
const ANY_OBJECT = '{"type": "object"}';

class GrammarHost {
  constructor(readonly memoryBytes: number | undefined, readonly bundle: string | undefined) {}
  #xg: XGrammar | undefined;
  #vocab: GrammarVocabulary | undefined;
  /** For JSON: the vocabulary without tokens holding a control byte (see jsonVocabulary). */
  #jsonCompiler: GrammarCompiler | undefined;
  /** For grammars: every token; made on the first grammar. */
  #textCompiler: GrammarCompiler | undefined;
  #grammars = new Map<number, CompiledGrammar>();
  #matchers = new Map<number, GrammarMatcher>();

  async handle(req: GrammarRequest): Promise<GrammarReply | undefined> {
    switch (req.op) {
      case "init": {
        this.#xg = await loadXGrammar(this.memoryBytes, this.bundle);
        this.#vocab = req.vocab;
        this.#jsonCompiler = await compilerFor(this.#xg, req.vocab, jsonToken);
        return { call: req.call, ok: true, heapBytes: xgrammarHeapBytes() };
      }
      case "compile": {
        const grammar = await this.#compile(req.constraint);
        this.#grammars.set(req.gid, grammar);
        return { call: req.call, ok: true };
      }
      case "drop":
        this.#grammars.get(req.gid)?.dispose();
        this.#grammars.delete(req.gid);
        return undefined;
      case "matcher": {
        const grammar = this.#grammars.get(req.gid);
        if (!grammar) throw new Error(`grammar ${req.gid} is not compiled here`);
        const matcher = await this.#xg!.GrammarMatcher.createGrammarMatcher(grammar);
        for (let i = 0; i < req.replay.length; i++) {
          if (!matcher.acceptToken(req.replay[i]!)) {
            matcher.dispose();
            return { call: req.call, ok: true, refusedAt: i };
          }
        }
        this.#matchers.set(req.mid, matcher);
        return { call: req.call, ok: true };
      }
      case "masks": {
        const masks: MaskAnswer[] = [];
        for (const { mid, tokens } of req.items) {
          const matcher = this.#matchers.get(mid);
          if (!matcher) {
            masks.push({ error: `matcher ${mid} does not exist` });
            continue;
          }
          const refused = tokens.findIndex((t) => !matcher.acceptToken(t));
          if (refused >= 0) {
            masks.push({ refused });
            continue;
          }
          const words = await matcher.getNextTokenBitmask();
          masks.push({ mask: new Uint32Array(words.buffer, words.byteOffset, words.length) });
        }
        return { call: req.call, ok: true, masks };
      }
      case "free":
        this.#matchers.get(req.mid)?.dispose();
        this.#matchers.delete(req.mid);
        return undefined;
    }
  }

  /**
   * A structural tag choosing between the schema's JSON and TEXT_NOT_JSON. The JSON goes in as
   * the grammar XGrammar makes of the schema in our layout: the tag's own json_schema element
   * allows any whitespace, in which a weak model can run on to max_tokens; and `any_text` may
   * only end a tag, not be one side of an `or` (XGrammar 0.1.27 aborts on it).
   */
  async #jsonOrText(schema: string): Promise<StructuralTag> {
    const l = JSON_LAYOUT;
    const json = await this.#xg!.Grammar.fromJSONSchema(
      schema,
      l.anyWhitespace,
      l.indent,
      l.separators,
    );
    try {
      return {
        type: "structural_tag",
        format: {
          type: "or",
          elements: [
            { type: "grammar", grammar: withoutControlCharacters(json.toString()) },
            { type: "grammar", grammar: TEXT_NOT_JSON },
          ],
        },
      };
    } finally {
      json.dispose();
    }
  }

  #compile(c: OutputConstraint): Promise<CompiledGrammar> {
    const l = JSON_LAYOUT;
    return xgrammarCall(async () => {
      switch (c.type) {
        case "json_object":
          return this.#jsonCompiler!.compileJSONSchema(
            ANY_OBJECT,
            l.anyWhitespace,
            l.indent,
            l.separators,
          );
        case "json_schema":
          return this.#jsonCompiler!.compileJSONSchema(
            c.schema,
            l.anyWhitespace,
            l.indent,
            l.separators,
          );
        case "grammar":
          this.#textCompiler ??= await compilerFor(this.#xg!, this.#vocab!, () => true);
          return this.#textCompiler.compileGrammar(c.grammar);
        case "json_schema_or_text":
          this.#textCompiler ??= await compilerFor(this.#xg!, this.#vocab!, () => true);
          return this.#textCompiler.compileStructuralTag(await this.#jsonOrText(c.schema));
      }
    }).catch((e) => {
      const what = c.type === "grammar" ? "grammar" : "JSON schema";
      const why = e instanceof XGrammarError ? e.message : String(e);
      throw new ConstraintFault(`Cannot compile the ${what}: ${why}`, { cause: e });
    });
  }
}

/**
 * Free text that does not begin (after blanks) with "{": the other branch of
 * json_schema_or_text, so that output starting like JSON is always the schema's.
 */
const TEXT_NOT_JSON = "root ::= [ \\t\\r\\n]* [^{ \\t\\r\\n] [^]*";

/**
 * XGrammar 0.1.27's string rule under minLength/maxLength (`[^"\\\r\n]`) admits raw control
 * characters, which JSON forbids inside a string. The JSON-only compiler drops such tokens from
 * its vocabulary (jsonToken), but the or-grammar's text side needs newlines, so here the
 * character class itself is narrowed to the one its unbounded string rule uses.
 */
function withoutControlCharacters(grammar: string): string {
  return grammar.replaceAll('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\\\r\\n]');
}

/** The request's own grammar cannot be compiled (the client's 400). */
class ConstraintFault extends Error {}

/**
 * A compiler over the vocabulary's tokens that `keep` (the others empty: never allowed), with
 * XGrammar's own unbounded cache off (ours is an LRU).
 */
async function compilerFor(
  xg: XGrammar,
  vocab: GrammarVocabulary,
  keep: (token: Uint8Array) => boolean,
): Promise<GrammarCompiler> {
  const info = await xgrammarCall(() =>
    xg.TokenizerInfo.createTokenizerInfo(
      lazyTokens(vocab, keep) as unknown as string[],
      "raw",
      false,
      vocab.vocabSize,
      [...vocab.stopIds],
    )
  );
  return await xg.GrammarCompiler.createGrammarCompiler(info, false);
}

/**
 * The vocabulary as the array XGrammar reads (its `vecStringFromJSArray` reads `length`, then
 * each index once, copying each Uint8Array's bytes as they are into its heap), each token's
 * view made as it is read: an array of 151k views held at once measured +61 MiB per worker,
 * these are young garbage.
 */
function lazyTokens(
  vocab: GrammarVocabulary,
  keep: (token: Uint8Array) => boolean,
): ArrayLike<Uint8Array> {
  const none = new Uint8Array(0);
  return new Proxy({ length: vocab.vocabSize } as ArrayLike<Uint8Array>, {
    get(target, key) {
      if (typeof key !== "string" || key === "length") return Reflect.get(target, key);
      const id = Number(key);
      if (!Number.isInteger(id) || id < 0 || id >= vocab.vocabSize) return undefined;
      const token = tokenBytes(vocab, id);
      return keep(token) ? token : none;
    },
  });
}

/**
 * Whether a token belongs to the vocabulary JSON is made of: none holding a byte below 0x20.
 * Our JSON layout has no newline or tab, and inside a string JSON forbids raw control
 * characters, yet XGrammar 0.1.27's string rule under minLength/maxLength (`[^"\\\r\n]{0,n}`)
 * admits them: a tab or \x1a token then made the output unparseable.
 */
function jsonToken(token: Uint8Array): boolean {
  return !token.some((b) => b < 0x20);
}

/**
 * Whether an error is a WebAssembly trap (or Emscripten's abort, which raises one): after it
 * the instance's stack and allocator are half-unwound, and every later call fails ("Aborted()",
 * "table index is out of bounds": issue 37).
 */
function isTrap(e: unknown): boolean {
  for (let x = e; x instanceof Error; x = x.cause) {
    if (x instanceof XGrammarError && x.checked) return false;
    if (x instanceof WebAssembly.RuntimeError) return true;
    if (/RuntimeError|Aborted\(|out of bounds|unreachable|Maximum call stack/.test(x.message)) {
      return true;
    }
  }
  return false;
}

if (parentPort) {
  const port = parentPort;
  const host = new GrammarHost(workerData?.memoryBytes, workerData?.bundle);
  let trapped: string | undefined;
  // One request at a time, in arrival order: XGrammar is not reentrant, and answers keep order.
  let queue = Promise.resolve();
  port.on("message", (req: GrammarRequest) => {
    queue = queue.then(async () => {
      let reply: GrammarReply | undefined;
      try {
        if (trapped !== undefined) throw new Error(trapped);
        reply = await host.handle(req);
      } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        if (trapped === undefined && isTrap(e)) trapped = message;
        if (!("call" in req)) return;
        reply = {
          call: req.call,
          ok: false,
          constraint: e instanceof ConstraintFault,
          ...(trapped !== undefined ? { trapped: true } : {}),
          message,
        };
      }
      if (!reply) return;
      const buffers = reply.ok && reply.masks
        ? reply.masks.flatMap((m) => "mask" in m ? [m.mask.buffer as ArrayBuffer] : [])
        : [];
      port.postMessage(reply, buffers);
    });
  });
}
