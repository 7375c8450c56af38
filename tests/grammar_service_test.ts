import { assert, assertEquals, assertLess, assertRejects } from "@std/assert";
import { Ajv } from "ajv";
import { GrammarService, lazyGrammarService } from "../lib/grammar/grammar_service.ts";
import { ConstraintError, GrammarUnavailableError } from "../lib/grammar/constraint_error.ts";
import { GRAMMAR_LIMITS, type GrammarLimits } from "../lib/grammar/grammar_limits.ts";
import type { GrammarRestartReason } from "../lib/grammar/grammar_thread.ts";
import { grammarVocabulary } from "../lib/grammar/grammar_vocabulary.ts";
import type { TokenConstraint } from "../lib/grammar/token_constraint.ts";
import { allowedIds, allowsOnly, tokenAllowed } from "../lib/engine/token_mask.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { seededRandom } from "../lib/util/seeded_random.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";

/** Real vocabularies: byte-level BPE (Llama 3, Qwen2.5) and SentencePiece (TinyLlama, tok512). */
const VOCABULARIES = [
  ["llama3-like", () => compatPath("llama3-like-q4_k_m")],
  ["qwen2-like", () => compatPath("qwen2-like-q4_k_m")],
  ["tinyllama-like", () => compatPath("tinyllama-like-q4_k_m")],
  ["stories260K (tok512)", () => modelFile("stories260K.bin")],
] as const;

async function tokenizerOf(path: string): Promise<{ tokenizer: Tokenizer; vocab: number }> {
  const model = await loadModel(
    path,
    path.endsWith(".bin") ? { tokenizerPath: modelFile("tok512.bin") } : {},
  );
  return { tokenizer: new Tokenizer(model.tokenizer!), vocab: model.config.vocabSize };
}

const SCHEMA = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 6 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    tags: { type: "array", items: { enum: ["a", "b", "ü"] }, maxItems: 3 },
    ok: { type: "boolean" },
  },
  required: ["name", "age"],
  additionalProperties: false,
};

/**
 * Walks the grammar with uniformly random allowed tokens until it may only end. Returns the
 * bytes the tokens decode to, as the tokenizer decodes them, and checks at every step that no
 * id the tokenizer never prints from text is allowed (save the stop ids at the end).
 */
async function randomWalk(
  c: TokenConstraint,
  tokenizer: Tokenizer,
  vocab: number,
  random: () => number,
  maxSteps = 400,
  prefer?: (id: number) => boolean,
  eligible: (id: number) => boolean = () => true,
): Promise<string> {
  const ids: number[] = [];
  for (let step = 0; step < maxSteps; step++) {
    const mask = await c.nextMask();
    if (allowsOnly(mask, c.stopIds, vocab)) return tokenizer.decode(ids);
    const allowed = allowedIds(mask, vocab);
    for (const id of allowed) {
      if (c.stopIds.includes(id)) continue;
      assert(id < tokenizer.vocabSize && !tokenizer.isSpecial(id), `special id ${id} allowed`);
      assert(tokenizer.tokenBytes(id).length > 0, `empty token ${id} allowed`);
    }
    let choices = allowed.filter((id) => !c.stopIds.includes(id) && eligible(id));
    const preferred = prefer ? choices.filter(prefer) : [];
    if (preferred.length > 0 && random() < 0.7) choices = preferred;
    const id = choices[Math.floor(random() * choices.length)]!;
    assert(c.accept(id), `the grammar refused token ${id}, which its mask allowed`);
    ids.push(id);
  }
  throw new Error(`the walk did not finish in ${maxSteps} tokens: ${tokenizer.decode(ids)}`);
}

/** The id that prints exactly `text`. */
function idOf(tokenizer: Tokenizer, text: string): number {
  const want = new TextEncoder().encode(text);
  for (let id = 0; id < tokenizer.vocabSize; id++) {
    const b = tokenizer.tokenBytes(id);
    if (b.length === want.length && b.every((x, i) => x === want[i])) return id;
  }
  throw new Error(`no token prints ${JSON.stringify(text)}`);
}

for (const [name, path] of VOCABULARIES) {
  Deno.test(`GrammarService masks on the ${name} vocabulary allow only tokens whose bytes keep the output valid`, async () => {
    const { tokenizer, vocab } = await tokenizerOf(path());
    const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab));
    const validate = new Ajv({ strict: false }).compile(SCHEMA);
    const random = seededRandom(7);
    for (let i = 0; i < 6; i++) {
      const c = await grammars.constraint({ type: "json_schema", schema: JSON.stringify(SCHEMA) });
      const text = await randomWalk(c, tokenizer, vocab, random);
      c.dispose();
      const value = JSON.parse(text);
      assert(validate(value), `${text}: ${JSON.stringify(validate.errors)}`);
    }
    // json_object: any object. Uniform draws write strings for ever; lean on closing bytes.
    const closing = (id: number) => tokenizer.tokenBytes(id).some((b) => b === 0x22 || b === 0x7d);
    const c = await grammars.constraint({ type: "json_object" });
    const value = JSON.parse(await randomWalk(c, tokenizer, vocab, random, 2000, closing));
    c.dispose();
    assertEquals(typeof value, "object");
    assert(value !== null && !Array.isArray(value));
    grammars.close();
  });
}

Deno.test("json_schema_or_text: output that starts with '{' must be the schema's JSON, other text is free", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab));
  const validate = new Ajv({ strict: false }).compile(SCHEMA);
  const spec = { type: "json_schema_or_text", schema: JSON.stringify(SCHEMA) } as const;
  const [brace, quote, a, space] = ["{", '"', "a", " "].map((t) => idOf(tokenizer, t)) as [
    number,
    number,
    number,
    number,
  ];
  const random = seededRandom(3);
  const strict = new TextDecoder("utf-8", { fatal: true });
  const whole = (id: number) => {
    try {
      strict.decode(tokenizer.tokenBytes(id));
      return true;
    } catch {
      return false;
    }
  };
  for (let i = 0; i < 4; i++) {
    const c = await grammars.constraint(spec);
    const first = await c.nextMask();
    assert(tokenAllowed(first, brace) && tokenAllowed(first, a) && tokenAllowed(first, space));
    assert(c.accept(brace));
    // Committed to JSON: the object's first key opens with '"' (that token, or a longer one
    // starting with it), nothing else is allowed.
    const afterBrace = allowedIds(await c.nextMask(), vocab);
    assert(afterBrace.includes(quote));
    for (const id of afterBrace) {
      const piece = new TextDecoder().decode(tokenizer.tokenBytes(id));
      assert(piece.startsWith('"'), `token ${id} (${JSON.stringify(piece)}) after '{'`);
    }
    // Tokens that are whole UTF-8 on their own: XGrammar 0.1.27 accepts byte-fallback tokens
    // that together are not UTF-8 (a walk wrote four such bytes, counted as one character of
    // maxLength); that limit is the json_schema constraint's too, not this or-grammar's.
    const text = "{" + await randomWalk(c, tokenizer, vocab, random, 400, undefined, whole);
    c.dispose();
    assert(validate(JSON.parse(text)), `${text}: ${JSON.stringify(validate.errors)}`);
  }
  // Blanks then '{' are JSON too (the parser trims blanks), so the grammar refuses that '{'.
  const blank = await grammars.constraint(spec);
  assert(blank.accept(space));
  assertEquals(tokenAllowed(await blank.nextMask(), brace), false);
  blank.dispose();
  // After a word, anything: '{' included, and the end.
  const words = await grammars.constraint(spec);
  assert(words.accept(a));
  const next = await words.nextMask();
  assert(tokenAllowed(next, brace) && words.stopIds.every((id) => tokenAllowed(next, id)));
  words.dispose();
  grammars.close();
});

Deno.test("GrammarService compiles a schema once and answers again from its cache", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab), {
    cacheEntries: 2,
  });
  const a = { type: "json_schema", schema: '{"type": "integer"}' } as const;
  const b = { type: "json_schema", schema: '{"type": "string"}' } as const;
  const c = { type: "json_schema", schema: '{"type": "boolean"}' } as const;
  const first = await grammars.compile(a);
  assert(first === await grammars.compile(a));
  assertEquals(grammars.stats(), {
    compiles: 1,
    hits: 1,
    entries: 1,
    restarts: { trap: 0, budget: 0, cancelled: 0, crash: 0 },
  });
  await grammars.compile(b);
  await grammars.compile(c); // evicts a, the least recently used
  assertEquals(grammars.stats().entries, 2);
  await grammars.compile(a);
  assertEquals(grammars.stats().compiles, 4);
  grammars.close();
});

Deno.test("GrammarService refuses a schema or grammar XGrammar cannot compile, with its reason", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab));
  const e = await assertRejects(
    () => grammars.constraint({ type: "json_schema", schema: "{not json" }),
    ConstraintError,
  );
  assert(/Cannot compile the JSON schema: .*parse JSON/.test(e.message), e.message);
  await assertRejects(
    () => grammars.constraint({ type: "grammar", grammar: "root ::= (" }),
    ConstraintError,
    "Cannot compile the grammar",
  );
  // Still usable after XGrammar aborted twice.
  const ok = await grammars.constraint({ type: "grammar", grammar: 'root ::= "yes" | "no"' });
  const text = await randomWalk(ok, tokenizer, vocab, seededRandom(1));
  assert(text === "yes" || text === "no", text);
  grammars.close();
});

Deno.test("GrammarService.constraint() replays the tokens an earlier attempt generated", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab));
  const spec = { type: "grammar", grammar: 'root ::= "abc" [0-9]' } as const;
  const replay = [idOf(tokenizer, "a"), idOf(tokenizer, "b")];
  const c = await grammars.constraint(spec, replay);
  assertEquals((await randomWalk(c, tokenizer, vocab, seededRandom(3))).slice(0, 1), "c");
  await assertRejects(
    () => grammars.constraint(spec, [idOf(tokenizer, "x")]),
    ConstraintError,
    "does not fit the grammar",
  );
  grammars.close();
});

/** Every id the mask allows prints text starting with `prefix`, and one prints exactly it. */
function assertStartsAll(mask: Uint32Array, tokenizer: Tokenizer, vocab: number, prefix: string) {
  const allowed = allowedIds(mask, vocab);
  assert(allowed.includes(idOf(tokenizer, prefix)), `${prefix} not allowed`);
  for (const id of allowed) {
    const text = new TextDecoder().decode(tokenizer.tokenBytes(id));
    assert(text.startsWith(prefix), `${JSON.stringify(text)} allowed where ${prefix} must come`);
  }
}

/** `depth` arrays nested in one another: XGrammar 0.1.27's converter traps from about 100. */
function nestedArrays(depth: number): string {
  return '{"type": "array", "items": '.repeat(depth) + '{"type": "string"}' + "}".repeat(depth);
}

/** The bounds of GRAMMAR_LIMITS lifted, so a schema they refuse reaches XGrammar. */
function unbounded(over: Partial<GrammarLimits> = {}): GrammarLimits {
  return {
    ...GRAMMAR_LIMITS,
    maxDepth: Infinity,
    maxRepetition: Infinity,
    maxLengthBound: Infinity,
    ...over,
  };
}

Deno.test("a WebAssembly trap in the grammar worker fails that compile alone: the worker starts afresh, a live matcher moves on, new schemas compile", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const restarts: GrammarRestartReason[] = [];
  // One worker: the trap happens where the live matcher lives.
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab), {
    limits: unbounded({ workers: 1 }),
    onRestart: (r) => restarts.push(r),
  });
  const live = await grammars.constraint({ type: "grammar", grammar: 'root ::= "abc" [0-9]' });
  assertStartsAll(await live.nextMask(), tokenizer, vocab, "a");
  assert(live.accept(idOf(tokenizer, "a")));

  const e = await assertRejects(
    () => grammars.compile({ type: "json_schema", schema: nestedArrays(1000) }),
    ConstraintError,
  );
  assert(/RuntimeError|out of bounds/.test(e.message) && /restarted/.test(e.message), e.message);
  assertEquals(restarts, ["trap"]);

  // Before the fix every later compile answered "Aborted()" or "table index is out of bounds".
  const fresh = await grammars.constraint({ type: "json_object" });
  assertStartsAll(await fresh.nextMask(), tokenizer, vocab, "{");
  // The live matcher replayed "a" on the fresh worker: only "b" may follow.
  assertStartsAll(await live.nextMask(), tokenizer, vocab, "b");
  assertEquals(grammars.stats().restarts.trap, 1);
  grammars.close();
});

Deno.test("a compile over its time budget is ended with a 400 naming the budget, and a canary constrained request meanwhile is answered within 2 s", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const restarts: GrammarRestartReason[] = [];
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab), {
    limits: unbounded({ compileMs: 3000 }),
    onRestart: (r) => restarts.push(r),
  });
  const t0 = performance.now();
  const slow = grammars.compile({
    type: "json_schema",
    schema: '{"type": "string", "pattern": "^(a{0,1000}){0,1000}$"}',
  });
  slow.catch(() => {});
  const canary = await grammars.constraint({
    type: "json_schema",
    schema: '{"type": "string", "maxLength": 3}',
  });
  assertStartsAll(await canary.nextMask(), tokenizer, vocab, '"');
  assertLess(performance.now() - t0, 2000);
  await assertRejects(() => slow, ConstraintError, "3000 ms compile budget");
  assertLess(performance.now() - t0, 3000 + 2000);
  assertEquals(restarts, ["budget"]);
  grammars.close();
});

Deno.test("a compile whose client left is ended at once; the next compile runs on a fresh worker", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const restarts: GrammarRestartReason[] = [];
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab), {
    limits: unbounded({ workers: 1 }),
    onRestart: (r) => restarts.push(r),
  });
  const left = new AbortController();
  const slow = grammars.constraint(
    {
      type: "json_schema",
      schema: '{"type": "string", "pattern": "^(a{0,1000}){0,1000}$"}',
    },
    [],
    { signal: left.signal },
  );
  slow.catch(() => {});
  await new Promise((r) => setTimeout(r, 200));
  left.abort(new Error("client left"));
  await assertRejects(() => slow, Error, "client left");
  assertEquals(restarts, ["cancelled"]);
  const next = await grammars.constraint({ type: "json_object" });
  assertStartsAll(await next.nextMask(), tokenizer, vocab, "{");
  grammars.close();
});

Deno.test("a compile that outgrows the worker's memory budget traps and is survived", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const restarts: GrammarRestartReason[] = [];
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab), {
    limits: unbounded({
      workerMemoryBytes: 64 * 1024 * 1024,
      maxEnumValues: Infinity,
      maxBytes: Infinity,
    }),
    onRestart: (r) => restarts.push(r),
  });
  const huge = { enum: Array.from({ length: 200_000 }, (_, i) => `value number ${i}`) };
  await assertRejects(
    () => grammars.compile({ type: "json_schema", schema: JSON.stringify(huge) }),
    ConstraintError,
  );
  assertEquals(restarts, ["trap"]);
  const ok = await grammars.constraint({ type: "json_object" });
  assertStartsAll(await ok.nextMask(), tokenizer, vocab, "{");
  grammars.close();
});

Deno.test("a grammar engine that cannot start is a GrammarUnavailableError (a 503), not a cached failure: the next request starts it again", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  // XGrammar's bundle missing (a broken npm cache): the workers cannot load it.
  const opts: { bundle?: string } = { bundle: "/nonexistent/web-xgrammar/lib/index.js" };
  const lazy = lazyGrammarService(tokenizer, vocab, opts);
  for (let i = 0; i < 2; i++) {
    await assertRejects(
      () => lazy.constraint({ type: "json_object" }, []),
      GrammarUnavailableError,
      "the grammar engine could not be started",
    );
  }
  delete opts.bundle; // the cache repaired: the next request starts the engine
  const c = await lazy.constraint({ type: "json_object" }, []);
  assertStartsAll(await c.nextMask(), tokenizer, vocab, "{");
  (await lazy.service()).close();
});

Deno.test("a lazy grammar service closed with its model ends its workers: the service it started and later requests answer GrammarUnavailableError", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const lazy = lazyGrammarService(tokenizer, vocab);
  const started = await lazy.service();
  const c = await lazy.constraint({ type: "json_object" }, []);
  assertStartsAll(await c.nextMask(), tokenizer, vocab, "{");
  lazy.close();
  await assertRejects(() => c.nextMask(), Error, "closed");
  await assertRejects(
    () => started.constraint({ type: "json_schema", schema: '{"type": "string"}' }),
    GrammarUnavailableError,
    "closed",
  );
  await assertRejects(
    () => lazy.constraint({ type: "json_object" }, []),
    GrammarUnavailableError,
    "closed",
  );
});

Deno.test("the pool starts one worker, and a second only for a compile that would wait behind the first", async () => {
  const { tokenizer, vocab } = await tokenizerOf(modelFile("stories260K.bin"));
  const grammars = await GrammarService.create(grammarVocabulary(tokenizer, vocab));
  assertEquals(grammars.heapBytes().length, 1);
  await grammars.compile({ type: "json_object" });
  await grammars.compile({ type: "json_schema", schema: '{"type": "string"}' });
  assertEquals(grammars.heapBytes().length, 1, "compiles one after another share one worker");
  // Asked for in one turn, while the first (~0.1 s, 10,000 pattern states) has not begun.
  const slow = '{"type": "string", "pattern": "^(a{0,100}){0,100}$"}';
  await Promise.all([
    grammars.compile({ type: "json_schema", schema: slow }),
    grammars.compile({ type: "json_schema", schema: '{"type": "boolean"}' }),
  ]);
  assertEquals(grammars.heapBytes().length, GRAMMAR_LIMITS.workers);
  grammars.close();
});
