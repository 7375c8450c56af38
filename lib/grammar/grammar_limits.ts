/**
 * Every bound on what a request may ask the grammar engine to build, in one place. XGrammar
 * expands counted repetition and string lengths into automaton states and recurses once per
 * nesting level, so a few bytes of schema could otherwise cost minutes of compile or trap its
 * WebAssembly (issue 37). Measured on XGrammar 0.1.27 (tok512 vocabulary): 40 nested objects
 * (JSON depth 81) and 64 nested arrays compile; 100 nested arrays trap; `maxLength: 1e5` takes
 * 0.36 s against 21.9 s for 1e9; `(a{0,100}){0,100}` 0.14 s against 147 s for
 * `(a{0,1000}){0,1000}`; an enum of 10,000 strings 1.5 s.
 */
export interface GrammarLimits {
  /** Bytes of a schema's JSON or a grammar's text. */
  readonly maxBytes: number;
  /** Nesting of a schema's JSON (objects and arrays), or of a grammar's parentheses. */
  readonly maxDepth: number;
  /** Values in all of a schema's `enum`s together (OpenAI's limit). */
  readonly maxEnumValues: number;
  /** States a pattern or grammar's counted repetition expands to: the sum over its atoms of
   * the product of the repetition bounds around each (`(a{0,1000}){0,1000}`: 10^6). */
  readonly maxRepetition: number;
  /** `maxLength` and `maxItems` (automaton states grow with them). */
  readonly maxLengthBound: number;
  /** Milliseconds one compile may take before its worker is ended. */
  readonly compileMs: number;
  /** Bytes of WebAssembly memory a grammar worker may grow to (beyond it the compile traps). */
  readonly workerMemoryBytes: number;
  /** Grammar workers: compiles for different requests run side by side on these. */
  readonly workers: number;
}

export const GRAMMAR_LIMITS: GrammarLimits = {
  // As the HTTP fields' own cap on a grammar; 50,000 GBNF alternatives compile in time.
  maxBytes: 1024 * 1024,
  maxDepth: 64,
  maxEnumValues: 1000,
  maxRepetition: 10_000,
  maxLengthBound: 100_000,
  compileMs: 10_000,
  workerMemoryBytes: 1024 * 1024 * 1024,
  workers: 2,
};
