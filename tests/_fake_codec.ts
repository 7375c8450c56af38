/**
 * A toy tokenizer for actor tests: token i spells a short piece from a tiny alphabet, so stop
 * strings made of those letters show up often and span token boundaries. Token 0 is EOS and
 * token 1 BOS (no text). Odd tokens above 1 are "incomplete" for the streaming decoder: their
 * text appears only with the next token, like a UTF-8 character split over byte tokens.
 */
import type { TextCodec } from "../actors/request.ts";

export const EOS = 0;
export const BOS = 1;

export function piece(id: number): string {
  if (id === EOS || id === BOS) return "";
  return "ab c"[id % 4]! + (id % 5 === 0 ? "b" : "");
}

/** A token spelling each letter exactly. */
const SPELL: Record<string, number> = { a: 4, b: 9, " ": 6, c: 7 };

export function decodeAll(ids: readonly number[]): string {
  return ids.map(piece).join("");
}

/** `encode` builds the ids a test sends (the actor itself sees only ids). */
export const fakeCodec: TextCodec & { encode(text: string): number[] } = {
  bosId: BOS,
  endIds: new Set([EOS]),
  /** Always starts with BOS, like a vocabulary with add_bos_token. */
  encode(text: string): number[] {
    const ids = [...text].map((ch) => {
      const id = SPELL[ch];
      if (id === undefined) throw new Error(`fakeCodec cannot encode ${JSON.stringify(ch)}`);
      return id;
    });
    return [BOS, ...ids];
  },
  createDecoder() {
    let held = "";
    return {
      push(id: number): string {
        if (id > 1 && id % 2 === 1) {
          held += piece(id);
          return "";
        }
        const out = held + piece(id);
        held = "";
        return out;
      },
      flush(): string {
        const out = held;
        held = "";
        return out;
      },
    };
  },
};
