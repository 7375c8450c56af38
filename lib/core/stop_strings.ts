/** What a StopMatcher lets through for one piece of streamed text. */
export interface StopMatch {
  /** Text that is safe to emit now. */
  readonly text: string;
  /** True when a stop string was completed: `text` ends just before it and nothing follows. */
  readonly stopped: boolean;
}

/**
 * Applies stop strings to streamed text. Text that could be the start of a stop string is held
 * back until the following text decides it, so a client never sees part of a stop string.
 * Generation ends at the first piece after which the text contains a stop string, cut at the
 * earliest occurrence in it (as OpenAI-style servers do: a stop string that would only complete
 * later does not matter).
 *
 * @example
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * const m = new StopMatcher(["\n\n"]);
 * assertEquals(m.push("Hello\n"), { text: "Hello", stopped: false }); // "\n" held back
 * assertEquals(m.push("\nWorld"), { text: "", stopped: true });
 * ```
 */
export class StopMatcher {
  readonly stops: readonly string[];
  #held = "";
  #stopped = false;
  #matched: string | undefined;
  #maxLen: number;

  constructor(stops: readonly string[]) {
    this.stops = stops.filter((s) => s.length > 0);
    this.#maxLen = Math.max(0, ...this.stops.map((s) => s.length));
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /** The stop string that ended the text (the earliest in it), once one has. */
  get matched(): string | undefined {
    return this.#matched;
  }

  /** Feeds the next piece of text. After a stop, everything is swallowed. */
  push(piece: string): StopMatch {
    if (this.#stopped) return { text: "", stopped: true };
    if (this.stops.length === 0) return { text: piece, stopped: false };
    const buf = this.#held + piece;
    let at = -1;
    for (const s of this.stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (at < 0 || i < at)) {
        at = i;
        this.#matched = s;
      }
    }
    if (at >= 0) {
      this.#stopped = true;
      this.#held = "";
      return { text: buf.slice(0, at), stopped: true };
    }
    const keep = this.#partialSuffix(buf);
    this.#held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** At the end of the stream: the held-back text, which turned out not to be a stop string. */
  flush(): string {
    const rest = this.#stopped ? "" : this.#held;
    this.#held = "";
    return rest;
  }

  /** Length of the longest suffix of buf that is a proper prefix of some stop string. */
  #partialSuffix(buf: string): number {
    for (let k = Math.min(this.#maxLen - 1, buf.length); k > 0; k--) {
      const tail = buf.slice(buf.length - k);
      if (this.stops.some((s) => s.startsWith(tail))) return k;
    }
    return 0;
  }
}
