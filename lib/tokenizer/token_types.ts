import type { TokenizerData } from "./tokenizer_data.ts";

/** Token types as GGUF's `tokenizer.ggml.token_type` stores them (llama.cpp's LLAMA_TOKEN_TYPE_*). */
export const TokenType = {
  UNDEFINED: 0,
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

export const BYTE_PIECE = /^<0x([0-9A-Fa-f]{2})>$/;

/**
 * Token texts llama.cpp treats as ending a generation (its text-based detection in
 * llama_vocab::impl::load; see llama.cpp issue 9606), limited to the families we load.
 */
const EOG_TEXTS = new Set([
  "<|eot_id|>",
  "<|im_end|>",
  "<|end|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "</s>",
  "<|eom_id|>",
  "<EOT>",
  "_<EOT>",
  "<|end_of_text|>",
  "<end_of_utterance>",
]);
/** Fill-in-the-middle tokens llama.cpp also stops on, found by text when the file names no id. */
const FIM_TEXTS = new Map<string, number>([
  ...["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"].map((t) => [t, 0] as const),
  ...["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"].map((t) =>
    [t, 1] as const
  ),
  ["<|file_sep|>", 2],
]);

export interface ResolvedTypes {
  /** Effective type of each id: the file's, or inferred, with end-of-generation tokens made control. */
  readonly types: Uint8Array;
  /** Every id that ends a generation. */
  readonly eogIds: ReadonlySet<number>;
}

/**
 * Works out each token's effective type and the end-of-generation set the way llama.cpp does:
 * EOS, EOT and EOM ids, the FIM pad/repo/file-separator tokens, and every token whose text is one
 * of the known end-of-turn spellings. A token found by its text is made a control token (as
 * llama.cpp does, warning "control-looking token"), so plain text never produces it.
 */
export function resolveTokenTypes(data: TokenizerData): ResolvedTypes {
  const n = data.tokens.length;
  const types = new Uint8Array(n);
  for (let id = 0; id < n; id++) {
    types[id] = data.tokenTypes ? data.tokenTypes[id]! : inferType(id, data.tokens[id]!, data);
  }
  const eog = new Set<number>();
  const makeControl = (id: number) => {
    if (types[id] !== TokenType.CONTROL) types[id] = TokenType.CONTROL;
  };
  // One pass over the texts (no map of all 128k of them): the end-of-turn spellings, and the
  // lowest id spelling each FIM token.
  const fim: (number | undefined)[] = [undefined, undefined, undefined];
  for (let id = 0; id < n; id++) {
    const text = data.tokens[id]!;
    // Every spelling looked for starts with "<" or "_": testing that first keeps this pass from
    // hashing all 128k texts.
    const first = text.charCodeAt(0);
    if ((first !== 0x3c && first !== 0x5f) || text.length < 3 || text.length > 18) continue;
    if (EOG_TEXTS.has(text)) {
      eog.add(id);
      makeControl(id);
    }
    const f = FIM_TEXTS.get(text);
    if (f !== undefined && fim[f] === undefined) fim[f] = id;
  }
  [data.fimPadId, data.fimRepId, data.fimSepId].forEach((given, f) => {
    const id = given ?? fim[f];
    if (id === undefined || id < 0 || id >= n) return;
    if (given === undefined) makeControl(id);
    eog.add(id);
  });
  for (const id of [data.eosId, data.eotId, data.eomId]) {
    if (id !== undefined && id >= 0 && id < n) eog.add(id);
  }
  return { types, eogIds: eog };
}

/** Without token types (llama2.c files), recognise the special pieces the way llama.cpp's converter does. */
function inferType(id: number, piece: string, data: TokenizerData): number {
  if (id === data.bosId || id === data.eosId) return TokenType.CONTROL;
  if (BYTE_PIECE.test(piece)) return TokenType.BYTE;
  if (piece === "<unk>") return TokenType.UNKNOWN;
  return TokenType.NORMAL;
}
