import type { Tokenizer } from "../tokenizer/tokenizer.ts";

/**
 * Turns a rendered prompt into the ids the core gets: BOS first, and a leading BOS *text*
 * (chat templates render "<s>") dropped rather than tokenized as "<", "s", ">". The server and
 * the router both use it, so a router counts and sends exactly the ids a replica would make.
 *
 * The HTTP layer counts a prompt's tokens (to check the context) right before it generates
 * from it: remembering the last encoding means the prompt is tokenized once, not twice.
 */
export class PromptEncoder {
  readonly bosToken: string;
  #last?: { text: string; special: boolean; ids: number[] };

  constructor(private readonly tokenizer: Tokenizer) {
    this.bosToken = tokenizer.tokenText(tokenizer.bosId);
  }

  encode(text: string, special: boolean): number[] {
    const last = this.#last;
    if (last !== undefined && last.text === text && last.special === special) return last.ids;
    const body = this.bosToken !== "" && text.startsWith(this.bosToken)
      ? text.slice(this.bosToken.length)
      : text;
    const ids = this.tokenizer.encode(body, { bos: true, special });
    this.#last = { text, special, ids };
    return ids;
  }
}
