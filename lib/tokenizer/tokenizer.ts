import { BpeEncoder } from "./bpe_encoder.ts";
import { charsToBytes } from "./byte_unicode.ts";
import { unprotectLiteral } from "./literal_text.ts";
import { preTokenizer } from "./pre_tokenizer.ts";
import { SpmEncoder } from "./spm_encoder.ts";
import { BYTE_PIECE, resolveTokenTypes, TokenType } from "./token_types.ts";
import type { TokenizerData, TokenizerModel } from "./tokenizer_data.ts";

export interface EncodeOptions {
  /** Prepend the BOS token (default: the vocabulary's add_bos_token). */
  bos?: boolean;
  /**
   * Text spelling a control, user-defined or unknown token's piece ("<s>", "<|im_start|>")
   * becomes that token, as chat templates expect; the text between them is encoded on its own
   * (default false: such text is just characters, so a client's text cannot inject tokens).
   */
  special?: boolean;
  /** Append the EOS token (default: the vocabulary's add_eos_token). */
  eos?: boolean;
}

export interface DecodeOptions {
  /**
   * The ids follow a BOS token that is not among them, so the first piece drops one leading
   * space (run.c's rule, which removes SentencePiece's dummy prefix; byte-level BPE adds none).
   */
  afterBos?: boolean;
}

/** Turns a stream of token ids into text without ever splitting a UTF-8 character. */
export interface IncrementalDecoder {
  /** Returns the text that became complete with this token (possibly ""). */
  push(id: number): string;
  /** Returns whatever is still held back (incomplete bytes become U+FFFD) and resets. */
  flush(): string;
}

/**
 * A tokenizer for the vocabularies GGUF files and llama2.c carry, giving llama.cpp's ids:
 * SentencePiece-style BPE with scores and byte fallback (`tokenizer.ggml.model` "llama", and
 * llama2.c's `tokenizer.bin`, where it equals run.c), and byte-level BPE with merges and a
 * pre-tokenizer ("gpt2": Llama 3, Qwen2/3, SmolLM).
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { parseLlama2cTokenizer } from "./llama2c_tokenizer.ts";
 *
 * const bytes = await Deno.readFile("tok512.bin");
 * const tok = new Tokenizer(parseLlama2cTokenizer(bytes, 512, "tok512.bin"));
 * assertEquals(tok.encode("Once upon a time"), [1, 403, 407, 261, 378]); // run.c's ids, BOS first
 * // After BOS, SentencePiece's dummy-prefix space is dropped, as run.c does.
 * assertEquals(tok.decode([1, 403, 407, 261, 378]), "Once upon a time");
 * assertEquals(tok.decode([403]), " Once");
 * ```
 */
export class Tokenizer {
  readonly model: TokenizerModel;
  readonly bosId: number;
  readonly eosId: number;
  readonly vocabSize: number;
  /** Whether a prompt starts with BOS and ends with EOS by default (the file's add_bos/add_eos_token). */
  readonly addBos: boolean;
  readonly addEos: boolean;
  /** Every id that ends a generation: EOS, EOT, EOM and the end-of-turn tokens (llama.cpp's EOG set). */
  readonly eogIds: ReadonlySet<number>;
  /**
   * What ends a served generation: the EOG set and BOS. Sampling BOS means a new document
   * begins: llama2.c models end their stories that way (run.c stops there too).
   */
  readonly endIds: ReadonlySet<number>;
  /** Pieces as printed in logs: SentencePiece "▁" as " ", byte-level pieces as stored. */
  readonly #pieces: readonly string[];
  readonly #types: Uint8Array;
  /** Byte value of each byte token, -1 for other tokens. */
  readonly #byteOf: Int16Array;
  readonly #pieceBytes: (Uint8Array | undefined)[];
  readonly #spm?: SpmEncoder;
  readonly #bpe?: BpeEncoder;
  readonly #addSpacePrefix: boolean;
  /** Control, user-defined and unknown pieces, longest first: what special text may spell. */
  readonly #specials: readonly { piece: string; id: number }[];

  /** Builds the lookup tables; throws if the vocabulary's arrays disagree, an id is out of range or the pre-tokenizer is unknown. */
  constructor(data: TokenizerData) {
    const n = data.tokens.length;
    const fail = (why: string): never => {
      throw new Error(`Cannot build tokenizer: ${why}`);
    };
    if (n === 0) fail("the vocabulary is empty");
    if (data.scores.length !== n) {
      fail(`the vocabulary has ${n} tokens but ${data.scores.length} scores`);
    }
    if (data.tokenTypes && data.tokenTypes.length !== n) {
      fail(`the vocabulary has ${n} tokens but ${data.tokenTypes.length} token types`);
    }
    for (
      const [name, id] of [
        ["BOS", data.bosId],
        ["EOS", data.eosId],
        ["EOT", data.eotId],
        ["EOM", data.eomId],
      ] as const
    ) {
      if (id === undefined && name !== "BOS" && name !== "EOS") continue;
      if (!Number.isInteger(id) || id! < 0 || id! >= n) {
        fail(`${name} id must be a token id in 0..${n - 1}, received ${id}`);
      }
    }
    this.model = data.model ?? "llama";
    this.bosId = data.bosId;
    this.eosId = data.eosId;
    this.vocabSize = n;
    const { types, eogIds } = resolveTokenTypes(data);
    this.#types = types;
    this.eogIds = eogIds;
    this.endIds = new Set([...eogIds, data.bosId]);
    this.#byteOf = new Int16Array(n).fill(-1);
    this.#pieceBytes = new Array(n);
    const byteToken = new Int32Array(256).fill(-1);
    for (let id = 0; id < n; id++) {
      if (types[id] !== TokenType.BYTE) continue;
      const piece = data.tokens[id]!;
      const m = BYTE_PIECE.exec(piece);
      if (!m) {
        fail(
          `token ${id} has type 6 (byte) but its piece ${
            JSON.stringify(piece)
          } is not of the form <0xXX>`,
        );
      }
      const value = parseInt(m![1]!, 16);
      this.#byteOf[id] = value;
      if (byteToken[value] === -1) byteToken[value] = id;
    }

    if (this.model === "gpt2") {
      const pre = preTokenizer(data.pre);
      if (!data.merges || data.merges.length === 0) {
        fail(
          "a byte-level BPE vocabulary (tokenizer.ggml.model 'gpt2') needs tokenizer.ggml.merges",
        );
      }
      this.#pieces = data.tokens;
      const ids = new Map<string, number>();
      for (let id = 0; id < n; id++) ids.set(data.tokens[id]!, id);
      this.#bpe = new BpeEncoder(pre, data.merges!, ids);
      this.addBos = data.addBos ?? pre.addBos;
      this.#addSpacePrefix = false;
    } else if (this.model === "llama") {
      this.#pieces = data.tokens.map((t) => t.replaceAll("\u2581", " "));
      this.#spm = new SpmEncoder(this.#pieces, data.scores, types, byteToken);
      this.addBos = data.addBos ?? true;
      this.#addSpacePrefix = data.addSpacePrefix ?? true;
    } else {
      throw new Error(
        `Cannot build tokenizer: tokenizer model '${
          String(this.model)
        }' is not supported (supported: llama, gpt2)`,
      );
    }
    this.addEos = data.addEos ?? false;

    const specials: { piece: string; id: number }[] = [];
    for (let id = 0; id < n; id++) {
      const t = types[id];
      if (
        (t === TokenType.CONTROL || t === TokenType.USER_DEFINED || t === TokenType.UNKNOWN) &&
        data.tokens[id] !== ""
      ) specials.push({ piece: data.tokens[id]!, id });
    }
    // Longest first, as llama.cpp's cache_special_tokens; equal lengths by id, to be deterministic.
    specials.sort((a, b) => b.piece.length - a.piece.length || a.id - b.id);
    this.#specials = specials;
  }

  /** The texts that chat-template text may spell as tokens: control, user-defined and unknown pieces. */
  get specialPieces(): readonly string[] {
    return this.#specials.map((s) => s.piece);
  }

  /**
   * Whether the id is a control, user-defined, unknown or unused token: one only template text
   * (or nothing at all) produces, never plain text. Constrained decoding leaves them out.
   */
  isSpecial(id: number): boolean {
    this.#checkId(id);
    const t = this.#types[id];
    return t === TokenType.CONTROL || t === TokenType.USER_DEFINED || t === TokenType.UNKNOWN ||
      t === TokenType.UNUSED;
  }

  /** Whether sampling this id ends a generation. */
  isEog(id: number): boolean {
    return this.eogIds.has(id);
  }

  /**
   * Encodes text as llama.cpp's llama_tokenize does: BOS/EOS as asked (by default as the file
   * says), special-token text split out only with `special`, each run of text between special
   * tokens encoded on its own. SentencePiece adds its dummy-prefix space before the first run
   * and before a run that follows a special token.
   */
  encode(text: string, opts: EncodeOptions = {}): number[] {
    const out: number[] = [];
    if (opts.bos ?? this.addBos) out.push(this.bosId);
    const parts: (string | number)[] = opts.special ? this.#splitSpecial(text) : [text];
    let prevSpecial = true;
    for (const part of parts) {
      if (typeof part === "number") {
        out.push(part);
        prevSpecial = true;
        continue;
      }
      const body = opts.special ? unprotectLiteral(part) : part;
      if (this.#bpe) this.#bpe.encode(body, out);
      else this.#spm!.encode(body, this.#addSpacePrefix && prevSpecial, out);
      prevSpecial = false;
    }
    if (opts.eos ?? this.addEos) out.push(this.eosId);
    return out;
  }

  /**
   * Encodes text a chat template rendered, as llama.cpp does: special-token spellings are
   * tokens, and a leading BOS text (trailing EOS text) is dropped where the vocabulary adds
   * that token anyway, so a template that writes "<|begin_of_text|>" still gives one BOS.
   */
  encodeTemplate(text: string): number[] {
    let body = text;
    const bos = this.#pieces[this.bosId]!;
    const eos = this.#pieces[this.eosId]!;
    if (this.addBos && bos !== "" && body.startsWith(bos)) body = body.slice(bos.length);
    if (this.addEos && eos !== "" && body.endsWith(eos)) body = body.slice(0, -eos.length);
    return this.encode(body, { special: true });
  }

  /**
   * Cuts text at special-token pieces as llama.cpp's tokenizer_st_partition does: each piece in
   * turn, longest first, splits every run of text not yet taken; no empty runs are kept.
   */
  #splitSpecial(text: string): (string | number)[] {
    let parts: (string | number)[] = text.length > 0 ? [text] : [];
    for (const { piece, id } of this.#specials) {
      if (!parts.some((p) => typeof p === "string" && p.includes(piece))) continue;
      const next: (string | number)[] = [];
      for (const p of parts) {
        if (typeof p === "number" || !p.includes(piece)) {
          next.push(p);
          continue;
        }
        const runs = p.split(piece);
        runs.forEach((run, i) => {
          if (i > 0) next.push(id);
          if (run.length > 0) next.push(run);
        });
      }
      parts = next;
    }
    return parts;
  }

  /** Decodes a whole id sequence; control tokens vanish and, for SentencePiece, a space after BOS is dropped, as in run.c. */
  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    const parts: Uint8Array[] = [];
    let total = 0;
    let afterBos = opts.afterBos ?? false;
    for (const id of ids) {
      const bytes = this.#tokenBytes(id, afterBos);
      afterBos = id === this.bosId;
      parts.push(bytes);
      total += bytes.byteLength;
    }
    const all = new Uint8Array(total);
    let offset = 0;
    for (const p of parts) {
      all.set(p, offset);
      offset += p.byteLength;
    }
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(all);
  }

  /**
   * A decoder for streamed tokens: each push returns only complete characters, so a character
   * spread over several tokens (`<0xXX>` pieces, or byte-level pieces that end mid-character)
   * appears once its last byte arrives.
   */
  createDecoder(opts: DecodeOptions = {}): IncrementalDecoder {
    // WHATWG streaming decode holds back an incomplete trailing sequence and yields exactly
    // what a one-shot decode of the same bytes would, which is the guarantee we need.
    const utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
    let afterBos = opts.afterBos ?? false;
    return {
      push: (id: number): string => {
        const bytes = this.#tokenBytes(id, afterBos);
        afterBos = id === this.bosId;
        return utf8.decode(bytes, { stream: true });
      },
      flush: (): string => {
        afterBos = false;
        return utf8.decode();
      },
    };
  }

  /**
   * A token's bytes as it prints (llama.cpp's token_to_piece without special tokens): control,
   * unknown and unused tokens are empty. `keep: false` when reading the whole vocabulary once
   * (the grammar engine's): a piece's bytes are then not kept for later decodes (151k small
   * arrays, ~35 MiB on Qwen's vocabulary).
   */
  tokenBytes(id: number, keep = true): Uint8Array {
    return this.#tokenBytes(id, false, keep);
  }

  /** The piece of a token as the vocabulary spells it (SentencePiece spaces as " "), for logs and debugging. */
  tokenText(id: number): string {
    this.#checkId(id);
    return this.#pieces[id]!;
  }

  #checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new RangeError(
        `Cannot decode token id ${id}: the vocabulary has ids 0..${this.vocabSize - 1}`,
      );
    }
  }

  /** What a token prints as (llama.cpp's token_to_piece without special): control, unknown and unused tokens print nothing. */
  #tokenBytes(id: number, afterBos: boolean, keep = true): Uint8Array {
    this.#checkId(id);
    const type = this.#types[id]!;
    if (type === TokenType.CONTROL || type === TokenType.UNKNOWN || type === TokenType.UNUSED) {
      return EMPTY;
    }
    const byte = this.#byteOf[id]!;
    if (byte >= 0) return BYTES[byte]!;
    let bytes = this.#pieceBytes[id];
    if (!bytes) {
      const piece = this.#pieces[id]!;
      bytes = this.#bpe && type !== TokenType.USER_DEFINED
        ? charsToBytes(piece) ?? ENCODER.encode(piece)
        : ENCODER.encode(piece);
      if (keep) this.#pieceBytes[id] = bytes;
    }
    // run.c checks the piece text, so a byte token <0x20> after BOS keeps its space.
    return this.#spm && afterBos && bytes[0] === 0x20 ? bytes.subarray(1) : bytes;
  }
}

const ENCODER = new TextEncoder();
const EMPTY = new Uint8Array(0);
const BYTES = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));
