/**
 * Byte-level BPE pre-tokenizers: how text is cut into words before merging, chosen by GGUF's
 * `tokenizer.ggml.pre`. The regexes are llama.cpp's (src/llama-vocab.cpp), which it applies one
 * after another: each regex cuts every piece from the previous one into its matches and the
 * text between them. Written as JS `u` regexes with llama.cpp's whitespace set (Unicode
 * White_Space: it includes U+0085 and, unlike JS's `\s`, not U+FEFF).
 */

const WS = String.raw`\t-\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000`;
const S = `[${WS}]`;
const NOT_S = `[^${WS}]`;

/** `(?i:'s|'t|'re|'ve|'m|'ll|'d)` without the inline flag JS lacks. */
const CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

/** Llama 3's split: letters with one leading non-letter, numbers in groups of up to 3. */
const LLAMA3 = [
  `${CONTRACTIONS}|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*|${S}*[\\r\\n]+|${S}+(?!${NOT_S})|${S}+`,
];
/** Qwen2's: Llama 3's with every digit on its own. */
const QWEN2 = [
  `${CONTRACTIONS}|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*|${S}*[\\r\\n]+|${S}+(?!${NOT_S})|${S}+`,
];
/** GPT-2's original split (llama.cpp's custom matcher also takes a whitespace run at the end: the final `\s+`). */
const GPT2_RE =
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${WS}\\p{L}\\p{N}]+|${S}+(?!${NOT_S})|${S}+`;
const GPT2 = [GPT2_RE];
/** SmolLM's: single digits first, then GPT-2's. */
const SMOLLM = ["\\p{N}", GPT2_RE];
/** llama.cpp's fallback for a BPE vocabulary with `pre` = "default". */
const DEFAULT = ["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"];

interface PreTokenizerSpec {
  readonly regexes: readonly string[];
  /** A word that is itself a token is taken whole, without merging (llama.cpp's ignore_merges). */
  readonly ignoreMerges: boolean;
  /** llama.cpp's add_bos default for this pre-tokenizer when the file does not say. */
  readonly addBos: boolean;
}

const SPECS: Record<string, PreTokenizerSpec> = {};
for (const name of ["llama-bpe", "llama3", "llama-v3"]) {
  SPECS[name] = { regexes: LLAMA3, ignoreMerges: true, addBos: true };
}
for (const name of ["qwen2", "deepseek-r1-qwen"]) {
  SPECS[name] = { regexes: QWEN2, ignoreMerges: false, addBos: false };
}
SPECS["smollm"] = { regexes: SMOLLM, ignoreMerges: false, addBos: false };
for (const name of ["gpt-2", "gpt2"]) {
  SPECS[name] = { regexes: GPT2, ignoreMerges: false, addBos: false };
}
SPECS["default"] = { regexes: DEFAULT, ignoreMerges: false, addBos: false };

/** The `tokenizer.ggml.pre` values a byte-level BPE vocabulary may name. */
export const SUPPORTED_PRE_TOKENIZERS: readonly string[] = Object.keys(SPECS);

export interface PreTokenizer {
  readonly name: string;
  readonly ignoreMerges: boolean;
  readonly addBos: boolean;
  /** Cuts text into words; joined, they give the text back. */
  split(text: string): string[];
}

/** The pre-tokenizer `pre` names (a missing one means "default", as in llama.cpp); throws for one we do not know. */
export function preTokenizer(pre: string | undefined): PreTokenizer {
  const name = pre === undefined || pre === "" ? "default" : pre;
  const spec = Object.hasOwn(SPECS, name) ? SPECS[name] : undefined;
  if (!spec) {
    throw new Error(
      `Cannot build tokenizer: pre-tokenizer '${name}' (tokenizer.ggml.pre) is not supported (supported: ${
        SUPPORTED_PRE_TOKENIZERS.join(", ")
      })`,
    );
  }
  const regexes = spec.regexes.map((r) => new RegExp(r, "gu"));
  return {
    name,
    ignoreMerges: spec.ignoreMerges,
    addBos: spec.addBos,
    split: (text) => {
      let pieces = [text];
      for (const re of regexes) {
        const next: string[] = [];
        for (const piece of pieces) cut(piece, re, next);
        pieces = next;
      }
      return pieces;
    },
  };
}

/** Appends the matches of `re` in `text` and the unmatched text between them, in order. */
function cut(text: string, re: RegExp, out: string[]): void {
  let last = 0;
  re.lastIndex = 0;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    if (m[0].length === 0) {
      re.lastIndex++;
      continue;
    }
    if (m.index > last) out.push(text.slice(last, m.index));
    out.push(m[0]);
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
}
