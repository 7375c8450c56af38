import type { GenerationEvent, GenerationRequest } from "../core/generation.ts";
import { hash32 } from "../util/rng.ts";

/** The most choices one request may ask for (`n`). */
export const MAX_CHOICES = 16;

/** One event of one of a request's choices. */
export interface ChoiceEvent {
  readonly index: number;
  readonly event: GenerationEvent;
}

/**
 * The seed of choice `index`: the request's own for choice 0 (so `n: 1` samples as before),
 * a hash of it and the index for the others, so a seeded request's n choices are each
 * reproducible and differ from one another.
 */
export function choiceSeed(seed: number, index: number): number {
  return index === 0 ? seed >>> 0 : hash32((seed ^ 0x63686f69) >>> 0, index);
}

/** The n generations of one request: the same but for their seeds and request ids. */
export function choiceRequests(req: GenerationRequest, n: number): GenerationRequest[] {
  return Array.from({ length: n }, (_, i) =>
    i === 0 ? req : {
      ...req,
      requestId: `${req.requestId}/${i}`,
      sampling: { ...req.sampling, seed: choiceSeed(req.sampling.seed, i) },
    });
}

/**
 * Runs a request's choices as one stream of tagged events, in arrival order. Choice 0 runs alone
 * until its first token (or its end): by then its prompt's full KV blocks are in the prefix
 * cache, and the other choices, started then, share them instead of computing the prompt again.
 * `first` is choice 0's first event, already taken by the caller. Returning early ends every
 * choice started.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import type { GenerationEvent } from "../core/generation.ts";
 *
 * // A choice's stream, faked: it starts, then gives one token.
 * async function* choice(text: string): AsyncGenerator<GenerationEvent> {
 *   yield { type: "started", promptTokens: 3 };
 *   yield { type: "token", text, ids: [7], logprob: 0 };
 * }
 * const head = choice("a");
 * const first = (await head.next()).value as GenerationEvent; // the caller took this one
 * const seen: string[] = [];
 * for await (const { index, event } of mergeChoices(head, first, [() => choice("b")])) {
 *   seen.push(`${index}:${event.type}`);
 * }
 * // Choice 1 starts only once choice 0 has its first token (its prompt is then cached).
 * assertEquals(seen.slice(0, 2), ["0:started", "0:token"]);
 * assertEquals(seen.slice(2).sort(), ["1:started", "1:token"]);
 * ```
 */
export async function* mergeChoices(
  head: AsyncGenerator<GenerationEvent>,
  first: GenerationEvent,
  rest: readonly (() => AsyncGenerator<GenerationEvent>)[],
): AsyncGenerator<ChoiceEvent> {
  const streams: AsyncGenerator<GenerationEvent>[] = [head];
  const pending = new Map<number, Promise<{ i: number; r: IteratorResult<GenerationEvent> }>>();
  const pull = (i: number) => pending.set(i, streams[i]!.next().then((r) => ({ i, r })));
  let startedRest = rest.length === 0;
  const startRest = () => {
    startedRest = true;
    for (const make of rest) {
      streams.push(make());
      pull(streams.length - 1);
    }
  };
  try {
    yield { index: 0, event: first };
    if (first.type !== "started") startRest();
    pull(0);
    while (pending.size > 0) {
      const { i, r } = await Promise.race(pending.values());
      pending.delete(i);
      if (r.done) continue;
      yield { index: i, event: r.value };
      if (!startedRest && i === 0 && r.value.type !== "started") startRest();
      if (r.value.type !== "done" && r.value.type !== "error") pull(i);
    }
  } finally {
    await Promise.all(streams.map((s) => s.return(undefined).catch(() => {})));
  }
}
