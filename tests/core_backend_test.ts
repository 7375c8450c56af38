import { assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { buildGenerationRequest, type GenerationInput } from "../lib/http/generation_request.ts";
import { fakeContinuation, FakeEngine, type FakeEngineOptions } from "./harness/fake_engine.ts";
import { TOKENIZER, WORD_IDS } from "./_fake_core.ts";
import { closeCore } from "./_serving_core.ts";

const BOS = TOKENIZER.bosId;

function backend(engine: Partial<FakeEngineOptions> = {}) {
  const opts: FakeEngineOptions = {
    vocabSize: TOKENIZER.vocabSize,
    outputIds: WORD_IDS,
    numBlocks: 64,
    blockSize: 4,
    contextLength: 128,
    ...engine,
  };
  const core = new ServingCore({
    engine: new FakeEngine(opts),
    engineFactory: () => new FakeEngine(opts),
    codec: TOKENIZER,
  });
  return { core, backend: new CoreBackend("m", core, TOKENIZER), opts };
}

const request = (prompt: number[], maxTokens: number): GenerationRequest => ({
  prompt,
  maxTokens,
  sampling: GREEDY,
  stop: [],
  priority: "interactive",
  requestId: "t",
});

/** A text prompt as the edge maps it (the one mapping tokenizes, with the backend's tokenizer). */
const fromText = (b: CoreBackend, input: Omit<GenerationInput, "promptParam">) =>
  buildGenerationRequest({ promptParam: "prompt", temperature: 0, ...input }, b, "t").request;

async function run(b: CoreBackend, req: GenerationRequest): Promise<GenerationEvent[]> {
  const out: GenerationEvent[] = [];
  for await (const e of b.generate(req, new AbortController().signal)) out.push(e);
  return out;
}

const ids = (events: GenerationEvent[]) => events.flatMap((e) => (e.type === "token" ? e.ids : []));

Deno.test("a text prompt is tokenized with BOS by the backend's tokenizer and the core generates from those ids", async () => {
  const { core, backend: b, opts } = backend();
  try {
    const events = await run(b, fromText(b, { prompt: "Once upon a time", maxTokens: 5 }));
    const prompt = TOKENIZER.encode("Once upon a time", { bos: true });
    assertEquals(prompt[0], BOS);
    assertEquals(events[0], { type: "started", promptTokens: prompt.length });
    assertEquals(b.countTokens("Once upon a time"), prompt.length);
    assertEquals(
      ids(events),
      fakeContinuation(prompt, {
        ...opts,
        maxTokens: 5,
        contextLength: 128,
        vocabSize: 512,
        sampling: GREEDY,
      }),
    );
  } finally {
    await closeCore(core);
  }
});

Deno.test("the BOS text a chat template renders is dropped instead of tokenized as '<', 's', '>'", async () => {
  const { core, backend: b } = backend();
  try {
    const plain = await run(b, fromText(b, { prompt: "Hello", maxTokens: 3 }));
    const templated = await run(
      b,
      fromText(b, { prompt: `${b.bosToken}Hello`, maxTokens: 3, specialTokens: true }),
    );
    assertEquals(b.bosToken, "\n<s>\n", "tok512 (llama2.c) spells BOS so");
    assertEquals(templated[0], plain[0], "the same prompt length: one BOS");
    assertEquals(ids(templated), ids(plain));
  } finally {
    await closeCore(core);
  }
});

Deno.test("CoreBackend ends a generation that samples BOS (a new story begins), as run.c does", async () => {
  // A model that can only say " the" or BOS: the first BOS it draws ends the generation.
  const the = TOKENIZER.encode(" the", { bos: false }).at(-1)!;
  const { core, backend: b, opts } = backend({ outputIds: [the, BOS] });
  try {
    const prompt = TOKENIZER.encode("Once", { bos: true });
    const solo = fakeContinuation(prompt, {
      ...opts,
      maxTokens: 40,
      contextLength: 128,
      vocabSize: 512,
      sampling: GREEDY,
      stopTokenIds: [BOS],
    });
    assertEquals(solo.at(-1), BOS, "the oracle run reaches a BOS within 40 tokens");
    const events = await run(b, request(prompt, 40));
    const done = events.at(-1)!;
    assertEquals(done.type === "done" && done.finishReason, "stop");
    assertEquals(done.type === "done" && done.usage.completionTokens, solo.length);
    assertEquals(ids(events), solo.slice(0, -1), "BOS itself is not streamed");
  } finally {
    await closeCore(core);
  }
});

Deno.test("CoreBackend passes the tokenizer's vocabulary, context and token texts through", async () => {
  const { core, backend: b } = backend();
  try {
    assertEquals([b.contextLength, b.vocabSize, b.eosToken], [128, 512, "\n</s>\n"]);
    const t = b.tokenize("a cat", { bos: true, special: false });
    assertEquals(t[0], BOS);
    assertEquals(b.detokenize(t), "a cat");
    assertEquals(t.slice(1).map((id) => b.tokenPiece(id)).join(""), " a cat");
    assertEquals(b.stats().kvBlocksTotal, 64);
  } finally {
    await closeCore(core);
  }
});

Deno.test("a token event carries only the ids whose text it completes: text a stop matcher holds keeps its ids", async () => {
  const { core, backend: b, opts } = backend();
  try {
    const prompt = TOKENIZER.encode("Once upon a time", { bos: true });
    const n = 12;
    const words = fakeContinuation(prompt, {
      ...opts,
      maxTokens: n,
      contextLength: 128,
      vocabSize: 512,
      sampling: GREEDY,
    });
    const text = (id: number) => TOKENIZER.tokenText(id);
    // Stops that begin inside a word's text and never complete: the matcher sends " th" of
    // " the" and holds "e" (stop "e#"), or the end of one word and all of the next, until the
    // following text shows they are not a stop.
    const stop = [
      text(words[2]!).slice(-1) + "#",
      text(words[5]!).slice(-2) + text(words[6]!) + "#",
    ];
    const events = await run(b, { ...request(prompt, n), stop });
    const dec = TOKENIZER.createDecoder({ afterBos: prompt.at(-1) === BOS });
    let sent = "";
    let decoded = "";
    for (const e of events) {
      if (e.type !== "token") continue;
      sent += e.text;
      for (const id of e.ids) decoded += dec.push(id);
      // What a router counts as delivered (the ids) must be exactly what the client has (the
      // text): failover resubmits after those ids, and held text would be lost.
      assertEquals(sent, decoded, `after ${JSON.stringify(e)}`);
    }
    assertEquals(ids(events), words);
    const last = events.at(-1);
    assertEquals(last?.type === "done" ? last.finishReason : last, "length");
  } finally {
    await closeCore(core);
  }
});
