import type { TokenizerData } from "./tokenizer_data.ts";

/** llama2.c's sentencepiece export hard-codes these ids (run.c stops generating at BOS = 1). */
const LLAMA2C_BOS_ID = 1;
const LLAMA2C_EOS_ID = 2;

/**
 * Parses a karpathy llama2.c `tokenizer.bin`: an int32 max_token_length, then for each of the
 * `vocabSize` tokens a float32 score, an int32 byte length and that many UTF-8 bytes. The file
 * does not store its own vocabulary size, so it comes from the checkpoint header. Pieces keep
 * the file's spelling (a space is " ", BOS is "\n<s>\n"); `tokenTypes` is left out because the
 * format has none.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const tok = parseLlama2cTokenizer(await Deno.readFile("tok512.bin"), 512, "tok512.bin");
 * assertEquals([tok.tokens.length, tok.bosId, tok.eosId], [512, 1, 2]);
 * assertEquals(tok.tokens[403], " Once"); // a space spelled " ", not "▁"
 * ```
 */
export function parseLlama2cTokenizer(
  bytes: Uint8Array,
  vocabSize: number,
  source: string,
): TokenizerData {
  const fail = (why: string): never => {
    throw new Error(`Cannot load llama2.c tokenizer ${source}: ${why}`);
  };
  if (!Number.isInteger(vocabSize) || vocabSize <= LLAMA2C_EOS_ID) {
    fail(`vocabulary size must be an integer above ${LLAMA2C_EOS_ID}, received ${vocabSize}`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.byteLength < 4) {
    fail(
      `file is truncated, expected a 4-byte max_token_length header, received ${bytes.byteLength} bytes`,
    );
  }
  const maxTokenLength = view.getInt32(0, true);
  if (maxTokenLength <= 0) {
    fail(
      `max_token_length must be positive, received ${maxTokenLength} (is this a llama2.c tokenizer.bin?)`,
    );
  }

  // Fatal decoding would reject a whole vocabulary for one odd piece; SentencePiece pieces are
  // valid UTF-8, so replacement characters can only come from a damaged file.
  const utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
  const tokens: string[] = new Array(vocabSize);
  const scores = new Float32Array(vocabSize);
  let offset = 4;
  for (let i = 0; i < vocabSize; i++) {
    if (offset + 8 > bytes.byteLength) {
      fail(
        `file is truncated at token ${i} of ${vocabSize}: its score and length need bytes ${offset}..${
          offset + 8
        }, file has ${bytes.byteLength} bytes`,
      );
    }
    scores[i] = view.getFloat32(offset, true);
    const len = view.getInt32(offset + 4, true);
    offset += 8;
    if (len < 0) fail(`token ${i} has a negative length ${len}`);
    if (offset + len > bytes.byteLength) {
      fail(
        `file is truncated at token ${i} of ${vocabSize}: its ${len}-byte text needs bytes ${offset}..${
          offset + len
        }, file has ${bytes.byteLength} bytes`,
      );
    }
    tokens[i] = utf8.decode(bytes.subarray(offset, offset + len));
    offset += len;
  }
  return { tokens, scores, bosId: LLAMA2C_BOS_ID, eosId: LLAMA2C_EOS_ID };
}
