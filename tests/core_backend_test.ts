/**
 * CoreBackend's prompt ids over a real serving core (stories260K, CPU engine): a client's text
 * is encoded as it is, template text gets exactly one BOS, and every end-of-generation id of
 * the tokenizer stops a generation.
 */
import { assert, assertEquals } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { GREEDY } from "../lib/engine/engine.ts";
import { CpuEngine } from "../lib/engine/cpu/cpu_engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CachedBackend } from "../lib/serving/cached_backend.ts";
import { CoreBackend } from "../lib/serving/core_backend.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { GenerationEvent } from "../lib/core/generation.ts";
import { modelFile } from "./_model_files.ts";

const bin = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const gguf = await loadModel(modelFile("stories260K.gguf"));

async function withBackend(
  model: typeof bin,
  tokenizer: Tokenizer,
  run: (b: CoreBackend) => Promise<void>,
): Promise<void> {
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  try {
    await run(new CoreBackend("m", core, tokenizer));
  } finally {
    await core.close();
  }
}

Deno.test("CoreBackend encodes a client's BOS spelling as characters (issue 13: it was cut off)", async () => {
  for (const model of [bin, gguf]) {
    const tok = new Tokenizer(model.tokenizer!);
    await withBackend(model, tok, (b) => {
      const bosText = tok.tokenText(tok.bosId); // "\n<s>\n" in tok512.bin, "<s>" in the GGUF
      const text = `${bosText}Once upon`;
      assertEquals(b.countTokens(text), tok.encode(text).length);
      assert(
        b.countTokens(text) > b.countTokens("Once upon"),
        `${JSON.stringify(text)} keeps its characters`,
      );
      // Template text: the BOS it writes is the one BOS the vocabulary adds.
      assertEquals(
        b.countTokens(`${bosText}Once upon`, { special: true }),
        b.countTokens("Once upon"),
      );
      return Promise.resolve();
    });
  }
});

Deno.test("CoreBackend stops a generation on any end-of-generation id, not only EOS", async () => {
  const tok = new Tokenizer(gguf.tokenizer!);
  // Find what greedy decoding produces first, then declare that token an end-of-turn token.
  let first = -1;
  await withBackend(gguf, tok, async (b) => {
    for await (const e of b.generate(request(4), AbortSignal.timeout(30_000))) {
      if (e.type === "token") first = e.ids[0]!;
      if (e.type === "token") break;
    }
  });
  assert(first >= 0);
  const tokens = [...gguf.tokenizer!.tokens];
  tokens[first] = "<|im_end|>"; // llama.cpp's text-based EOG detection picks this spelling up
  const eogTok = new Tokenizer({ ...gguf.tokenizer!, tokens });
  assert(eogTok.isEog(first));
  await withBackend(gguf, eogTok, async (b) => {
    const events: GenerationEvent[] = [];
    for await (const e of b.generate(request(4), AbortSignal.timeout(30_000))) events.push(e);
    const done = events.at(-1);
    if (done?.type !== "done") throw new Error(`ended with ${JSON.stringify(done)}`);
    assertEquals([done.finishReason, done.usage.completionTokens], ["stop", 1]);
  });
});

function request(maxTokens: number) {
  return {
    prompt: "Once upon a time",
    maxTokens,
    sampling: GREEDY,
    stop: [],
    priority: "interactive" as const,
    requestId: "r",
  };
}

Deno.test("CoreBackend.tokenize without special tokens drops only the BOS/EOS the vocabulary adds", async () => {
  for (
    const [addBos, addEos] of [[true, false], [false, false], [true, true], [false, true]] as const
  ) {
    const tok = new Tokenizer({ ...gguf.tokenizer!, addBos, addEos });
    await withBackend(gguf, tok, (b) => {
      const bare = tok.encode("Once upon", { bos: false, eos: false });
      assertEquals(
        b.tokenize("Once upon", { bos: false, special: false }),
        bare,
        `${addBos} ${addEos}`,
      );
      assertEquals(b.tokenize("Once upon", { bos: true, special: false }), tok.encode("Once upon"));
      return Promise.resolve();
    });
  }
});

Deno.test("the chat renderer sees the vocabulary's special spellings through the result cache too", async () => {
  const tok = new Tokenizer(gguf.tokenizer!);
  await withBackend(gguf, tok, (b) => {
    assertEquals([...b.specialTokens].sort(), ["</s>", "<s>", "<unk>"]);
    assertEquals(new CachedBackend(b, 1 << 20).specialTokens, b.specialTokens);
    return Promise.resolve();
  });
});
