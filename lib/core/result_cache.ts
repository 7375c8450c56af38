import type { FinishReason, GenerationRequest, Usage } from "./generation.ts";
import { hasLogitControls, type LogitControls } from "./logit_controls.ts";
import { constraintKey } from "../grammar/output_constraint.ts";

/** One stored token event of a finished generation. */
export interface StoredToken {
  readonly text: string;
  readonly ids: readonly number[];
  readonly logprob: number;
}

/** What a finished deterministic generation produced, enough to replay it event for event. */
export interface StoredResult {
  readonly promptTokens: number;
  readonly tokens: readonly StoredToken[];
  readonly finishReason: FinishReason;
  /** The stop string that ended it, where one did (Anthropic's stop_sequence). */
  readonly stopString?: string;
  readonly usage: Usage;
  /** Wall time the generation took. */
  readonly totalMs: number;
}

/**
 * The identity of a request's answer: everything that decides its tokens and nothing else
 * (not the priority, not the request id). A greedy request's seed changes nothing, so it is
 * left out; a sampled one is only cacheable with an explicit seed. Null when the request is
 * not deterministic, so it must never be answered from, or stored in, the cache.
 */
export function resultCacheKey(model: string, req: GenerationRequest): string | null {
  // Stored results keep no alternatives: a request asking for them is never cached.
  if (req.deterministic !== true || (req.topLogprobs ?? 0) > 0 || req.noCache) return null;
  const s = req.sampling;
  const greedy = s.temperature === 0;
  return JSON.stringify([
    // One API key's answers are never another's hits (nor its in-flight generations).
    req.cacheScope ?? "",
    model,
    [...req.prompt],
    req.maxTokens,
    greedy ? 0 : s.temperature,
    greedy ? 0 : s.topK,
    greedy ? 1 : s.topP,
    greedy ? 0 : s.minP,
    greedy ? 0 : s.seed,
    req.stop,
    req.stopTokenIds ?? [],
    req.ignoreEos === true,
    req.logprobs === true,
    logitControlsKey(req.controls),
    // The same prompt under another schema is another answer.
    req.constraint ? constraintKey(req.constraint) : "",
    req.constraintReplay ?? 0,
  ]);
}

/**
 * The controls' part of the key, with every field at its default written the same way (absent,
 * 0 or 1), so a request that spells a default out shares the answer of one that leaves it out.
 */
function logitControlsKey(c: LogitControls | undefined): unknown {
  if (!hasLogitControls(c)) return null;
  const rep = c.repetitionPenalty ?? 1;
  return [
    [...(c.logitBias ?? [])].sort((a, b) => a[0] - b[0]),
    c.presencePenalty ?? 0,
    c.frequencyPenalty ?? 0,
    rep,
    rep === 1 ? -1 : c.repeatLastN ?? -1,
    c.minTokens ?? 0,
  ];
}

/**
 * A stored result packed flat: its token texts joined into one string, ids and logprobs in
 * typed arrays. An array of per-token objects cost about 2.5 times what was counted for it
 * (object headers, boxed numbers, per-array backing stores); packed, the count is what it
 * holds.
 */
interface Packed {
  readonly promptTokens: number;
  readonly finishReason: FinishReason;
  readonly stopString?: string;
  readonly usage: Usage;
  readonly totalMs: number;
  readonly text: string;
  /** End of token i's text in `text`, and of its ids in `ids`. */
  readonly ends: Uint32Array;
  readonly ids: Int32Array;
  readonly logprobs: Float64Array;
}

/**
 * Bytes of an entry's fixed parts: the Map entry, the packed object, its usage object and its
 * four typed arrays with their ArrayBuffers (about 100 bytes each in V8).
 */
const ENTRY_OVERHEAD = 640;

function pack(r: StoredResult): Packed {
  const n = r.tokens.length;
  const ends = new Uint32Array(2 * n);
  let chars = 0, idCount = 0;
  for (let i = 0; i < n; i++) {
    chars += r.tokens[i]!.text.length;
    idCount += r.tokens[i]!.ids.length;
    ends[2 * i] = chars;
    ends[2 * i + 1] = idCount;
  }
  const ids = new Int32Array(idCount);
  const logprobs = new Float64Array(n);
  let k = 0;
  for (let i = 0; i < n; i++) {
    for (const id of r.tokens[i]!.ids) ids[k++] = id;
    logprobs[i] = r.tokens[i]!.logprob;
  }
  // Joined, then flattened: a concatenation would keep a rope of every token's string.
  const text = r.tokens.map((t) => t.text).join("");
  return {
    promptTokens: r.promptTokens,
    finishReason: r.finishReason,
    ...(r.stopString === undefined ? {} : { stopString: r.stopString }),
    usage: r.usage,
    totalMs: r.totalMs,
    text,
    ends,
    ids,
    logprobs,
  };
}

function unpack(p: Packed): StoredResult {
  const tokens: StoredToken[] = [];
  let c = 0, k = 0;
  for (let i = 0; i < p.logprobs.length; i++) {
    const ce = p.ends[2 * i]!, ke = p.ends[2 * i + 1]!;
    tokens.push({
      text: p.text.slice(c, ce),
      ids: Array.from(p.ids.subarray(k, ke)),
      logprob: p.logprobs[i]!,
    });
    c = ce;
    k = ke;
  }
  return {
    promptTokens: p.promptTokens,
    tokens,
    finishReason: p.finishReason,
    ...(p.stopString === undefined ? {} : { stopString: p.stopString }),
    usage: p.usage,
    totalMs: p.totalMs,
  };
}

/** Bytes an entry costs as stored: the key and the joined texts as UTF-16, the typed arrays, and the fixed parts. */
export function storedResultBytes(key: string, r: StoredResult): number {
  let chars = 0, ids = 0;
  for (const t of r.tokens) {
    chars += t.text.length;
    ids += t.ids.length;
  }
  return ENTRY_OVERHEAD + 2 * key.length + 2 * chars + 8 * r.tokens.length + 4 * ids +
    8 * r.tokens.length + 2 * (r.stopString?.length ?? 0);
}

/**
 * A least-recently-used map of finished results, bounded by the bytes its entries cost
 * (storedResultBytes). An entry larger than the whole capacity is not stored; a capacity of 0
 * stores nothing. Pure bookkeeping: no clocks, no I/O.
 */
export class ResultCache {
  readonly capacityBytes: number;
  #entries = new Map<string, { result: Packed; bytes: number }>();
  #bytes = 0;
  hits = 0;
  misses = 0;
  /** Sum of the totalMs of every result answered from the cache. */
  savedMs = 0;

  constructor(capacityBytes: number) {
    if (!(Number.isFinite(capacityBytes) && capacityBytes >= 0)) {
      throw new RangeError(
        `Result cache capacity must be a non-negative number of bytes; received ${capacityBytes}`,
      );
    }
    this.capacityBytes = capacityBytes;
  }

  get bytes(): number {
    return this.#bytes;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** The stored result (now the most recently used), counted as a hit or a miss. */
  get(key: string): StoredResult | undefined {
    const e = this.#entries.get(key);
    if (e === undefined) {
      this.misses++;
      return undefined;
    }
    this.#entries.delete(key);
    this.#entries.set(key, e);
    this.hits++;
    this.savedMs += e.result.totalMs;
    return unpack(e.result);
  }

  /**
   * Counts a request answered without generating though not from an entry: it followed an
   * identical request that was generating when it came.
   */
  countHit(savedMs: number): void {
    this.hits++;
    this.savedMs += savedMs;
  }

  /**
   * A lookup counted as a miss here was answered by another level (the shared store): it is
   * counted as a hit instead.
   */
  missAnsweredElsewhere(savedMs: number): void {
    this.misses--;
    this.countHit(savedMs);
  }

  /** Stores a result, evicting the least recently used entries until it fits. */
  set(key: string, result: StoredResult): boolean {
    const bytes = storedResultBytes(key, result);
    if (bytes > this.capacityBytes) return false;
    const old = this.#entries.get(key);
    if (old !== undefined) {
      this.#entries.delete(key);
      this.#bytes -= old.bytes;
    }
    while (this.#bytes + bytes > this.capacityBytes) {
      const oldest = this.#entries.keys().next();
      if (oldest.done) break;
      const e = this.#entries.get(oldest.value)!;
      this.#entries.delete(oldest.value);
      this.#bytes -= e.bytes;
    }
    this.#entries.set(key, { result: pack(result), bytes });
    this.#bytes += bytes;
    return true;
  }
}
