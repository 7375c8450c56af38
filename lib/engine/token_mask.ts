/**
 * Token masks: which ids a constrained sequence may sample next, one bit per id (bit id % 32 of
 * word id / 32), as XGrammar produces them. Every engine samples a masked row as if each masked
 * logit were -Infinity, and reports the logprob under the raw logits, as it does without a mask.
 */

/** Words of a mask over `vocab` ids. */
export function maskWords(vocab: number): number {
  return Math.ceil(vocab / 32);
}

/** Whether the mask allows `id`. */
export function tokenAllowed(mask: Uint32Array, id: number): boolean {
  return ((mask[id >>> 5]! >>> (id & 31)) & 1) === 1;
}

/** The allowed ids, ascending. */
export function allowedIds(mask: Uint32Array, vocab: number): number[] {
  const ids: number[] = [];
  for (let id = 0; id < vocab; id++) if (tokenAllowed(mask, id)) ids.push(id);
  return ids;
}

/**
 * A copy of `logits` with every id the mask forbids at -Infinity: what every sampler draws
 * from, so the candidates, their order and the draw are the unmasked sampler's over the
 * allowed ids.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 *
 * // Bit 0 set: only token 0 is allowed.
 * assertEquals([...maskLogits(new Float32Array([1, 2]), Uint32Array.of(0b01))], [1, -Infinity]);
 * ```
 */
export function maskLogits(logits: Float32Array, mask: Uint32Array): Float32Array {
  const out = new Float32Array(logits.length);
  out.fill(-Infinity);
  for (let w = 0; w < mask.length; w++) {
    let bits = mask[w]!;
    while (bits !== 0) {
      const low = bits & -bits;
      const id = w * 32 + (31 - Math.clz32(low));
      if (id < logits.length) out[id] = logits[id]!;
      bits ^= low;
    }
  }
  return out;
}

/**
 * The allowed id with the largest logit (the lowest id on ties, as argmax), or -1 when the mask
 * allows none.
 */
export function maskedArgmax(logits: ArrayLike<number>, mask: Uint32Array): number {
  let best = -1;
  let bestValue = -Infinity;
  for (let w = 0; w < mask.length; w++) {
    let bits = mask[w]!;
    while (bits !== 0) {
      const low = bits & -bits;
      const id = w * 32 + (31 - Math.clz32(low));
      bits ^= low;
      if (id >= logits.length) break;
      const v = logits[id]!;
      if (best < 0 || v > bestValue) {
        best = id;
        bestValue = v;
      }
    }
  }
  return best;
}

/** Why a mask cannot be used on a vocabulary of `vocab` ids, or undefined when it can. */
export function tokenMaskProblem(mask: Uint32Array, vocab: number): string | undefined {
  if (!(mask instanceof Uint32Array)) return "a token mask must be a Uint32Array";
  if (mask.length !== maskWords(vocab)) {
    return `a token mask over ${vocab} ids has ${maskWords(vocab)} words, received ${mask.length}`;
  }
  const tail = vocab % 32;
  for (let w = 0; w < mask.length; w++) {
    const word = w === mask.length - 1 && tail !== 0 ? mask[w]! & ((1 << tail) - 1) : mask[w]!;
    if (word !== 0) return undefined;
  }
  return "the token mask allows no token";
}

/** Whether every id the mask allows is one of `ids` (a grammar that can only end here). */
export function allowsOnly(mask: Uint32Array, ids: readonly number[], vocab: number): boolean {
  const rest = mask.slice();
  for (const id of ids) if (id < vocab) rest[id >>> 5]! &= ~(1 << (id & 31));
  const tail = vocab % 32;
  if (tail !== 0) rest[rest.length - 1]! &= (1 << tail) - 1;
  return rest.every((w) => w === 0);
}
