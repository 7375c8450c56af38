import { assert, assertEquals } from "@std/assert";
import type { GenerationRequest } from "../lib/core/generation.ts";
import {
  ResultCache,
  resultCacheKey,
  type StoredResult,
  storedResultBytes,
} from "../lib/core/result_cache.ts";

function result(text: string): StoredResult {
  return {
    promptTokens: 3,
    tokens: [...text].map((ch, i) => ({ text: ch, ids: [i], logprob: -1 })),
    finishReason: "length",
    usage: { promptTokens: 3, completionTokens: text.length, cachedTokens: 0 },
    totalMs: 10,
  };
}

const base: GenerationRequest = {
  prompt: [1, 403, 407, 261, 378],
  maxTokens: 8,
  sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 1 },
  stop: [],
  priority: "interactive",
  requestId: "r1",
  deterministic: true,
};

Deno.test("resultCacheKey: a request that is not deterministic has no key", () => {
  assertEquals(resultCacheKey("m", { ...base, deterministic: false }), null);
  assertEquals(resultCacheKey("m", { ...base, deterministic: undefined }), null);
});

Deno.test("resultCacheKey: the same answer-deciding fields give the same key, any other change a new one", () => {
  const k = resultCacheKey("m", base);
  // Neither the request id, the priority nor (for greedy) the seed decides the tokens.
  assertEquals(resultCacheKey("m", { ...base, requestId: "r2", priority: "batch" }), k);
  assertEquals(resultCacheKey("m", { ...base, sampling: { ...base.sampling, seed: 99 } }), k);
  const changed: GenerationRequest[] = [
    { ...base, prompt: [1, 403, 407, 261, 378, 29889] },
    { ...base, prompt: [1, 2, 3] },
    { ...base, maxTokens: 9 },
    { ...base, stop: ["."] },
    { ...base, logprobs: true },
    { ...base, sampling: { ...base.sampling, temperature: 0.5 } },
  ];
  for (const r of changed) assert(resultCacheKey("m", r) !== k, JSON.stringify(r));
  assert(resultCacheKey("other-model", base) !== k);
  // A sampled request's seed decides its tokens.
  const sampled = { ...base, sampling: { ...base.sampling, temperature: 0.8 } };
  assert(
    resultCacheKey("m", sampled) !==
      resultCacheKey("m", { ...sampled, sampling: { ...sampled.sampling, seed: 2 } }),
  );
});

Deno.test("ResultCache counts hits and misses and evicts the least recently used entry to stay within its bytes", () => {
  const a = result("aaaa"), b = result("bbbb"), c = result("cccc");
  const one = storedResultBytes("ka", a);
  const cache = new ResultCache(one * 2 + 1);
  assert(cache.set("ka", a));
  assert(cache.set("kb", b));
  assertEquals(cache.bytes, 2 * one);
  assertEquals(cache.get("ka"), a); // a is now the most recently used
  assert(cache.set("kc", c)); // evicts b
  assertEquals(cache.get("kb"), undefined);
  assertEquals(cache.get("ka"), a);
  assertEquals(cache.get("kc"), c);
  assertEquals([cache.hits, cache.misses, cache.size], [3, 1, 2]);
  assertEquals(cache.savedMs, 30);
  assert(cache.bytes <= cache.capacityBytes);
});

Deno.test("ResultCache with capacity 0 stores nothing, and an entry larger than the capacity is not stored", () => {
  const off = new ResultCache(0);
  assertEquals(off.set("k", result("x")), false);
  assertEquals(off.size, 0);
  const small = new ResultCache(200);
  assertEquals(small.set("k", result("x".repeat(100))), false);
  assertEquals([small.size, small.bytes], [0, 0]);
});

Deno.test("ResultCache refuses a negative capacity", () => {
  let message = "";
  try {
    new ResultCache(-1);
  } catch (e) {
    message = (e as Error).message;
  }
  assert(message.includes("received -1"), message);
});

Deno.test("a full 16 MiB result cache holds about what it counts: measured after a GC in a fresh process", async () => {
  // Entries shaped like real ones: a prompt of 60 token ids in the key, 128 token
  // events of 1-6 characters, one id each. Measured as V8's live heap plus external (typed
  // array) memory, before and after filling, with garbage collected each time.
  const dir = await Deno.makeTempDir({ prefix: "result_cache_memory_" });
  try {
    const script = `${dir}/fill.ts`;
    await Deno.writeTextFile(
      script,
      `import { ResultCache, resultCacheKey } from ${
        JSON.stringify(new URL("../lib/core/result_cache.ts", import.meta.url).href)
      };
import type { GenerationRequest } from ${
        JSON.stringify(new URL("../lib/core/generation.ts", import.meta.url).href)
      };
declare const gc: () => void; // --expose-gc
const live = () => { gc(); gc(); const m = Deno.memoryUsage(); return m.heapUsed + m.external; };
const cache = new ResultCache(16 * 1024 * 1024);
const before = live();
for (let i = 0; cache.size === i; i++) {
  const prompt = Array.from({ length: 60 }, (_, t) => 300 + ((t * 31 + i) % 20000));
  const req: GenerationRequest = { prompt, maxTokens: 128, sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 }, stop: [], priority: "batch", requestId: "r" + i, deterministic: true };
  const key = resultCacheKey("m", req)!;
  const tokens = Array.from({ length: 128 }, (_, t) => ({ text: "abcdef".slice(0, 1 + ((t * 7 + i) % 6)), ids: [1000 + t], logprob: -Math.random() }));
  cache.set(key, { promptTokens: 60, tokens, finishReason: "length", usage: { promptTokens: 60, completionTokens: 128, cachedTokens: 0 }, totalMs: 100 });
}
console.log(JSON.stringify({ counted: cache.bytes, measured: live() - before, entries: cache.size }));`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      // Type-checked, so that the entries it fills stay shaped like the ones the server stores.
      args: ["run", "--check", "--v8-flags=--expose-gc", "-A", script],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assertEquals(out.code, 0, new TextDecoder().decode(out.stderr));
    const { counted, measured, entries } = JSON.parse(new TextDecoder().decode(out.stdout));
    assert(counted <= 16 * 1024 * 1024 && counted > 15 * 1024 * 1024, `counted ${counted}`);
    assert(entries > 1000, `${entries} entries`);
    assert(
      measured <= 1.15 * counted && measured >= 0.5 * counted,
      `${entries} entries: counted ${counted} bytes, measured ${measured} (${
        (measured / counted).toFixed(2)
      }x)`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resultCacheKey: each logit control is part of the key; the same controls spelled with defaults share it", () => {
  const k = resultCacheKey("m", base);
  const withControls = (controls: GenerationRequest["controls"]) =>
    resultCacheKey("m", { ...base, controls });
  const variants: GenerationRequest["controls"][] = [
    { logitBias: [[5, -100]] },
    { logitBias: [[5, -99]] },
    { logitBias: [[6, -100]] },
    { presencePenalty: 0.5 },
    { frequencyPenalty: 0.5 },
    { repetitionPenalty: 1.2 },
    { repetitionPenalty: 1.2, repeatLastN: 64 },
    { minTokens: 3 },
  ];
  const keys = variants.map(withControls);
  assertEquals(new Set([k, ...keys]).size, variants.length + 1, "every variant has its own key");
  // Nothing asked, or only defaults: the plain request's key.
  assertEquals(withControls({}), k);
  assertEquals(
    withControls({ presencePenalty: 0, repetitionPenalty: 1, repeatLastN: 64, minTokens: 0 }),
    k,
  );
  assert(resultCacheKey("m", { ...base, ignoreEos: true }) !== k, "ignore_eos");
  assert(resultCacheKey("m", { ...base, stopTokenIds: [4] }) !== k, "stop_token_ids");
  // Stored results keep no alternatives: asking for them is never cached.
  assertEquals(resultCacheKey("m", { ...base, logprobs: true, topLogprobs: 3 }), null);
  // An unordered bias is the same bias.
  assertEquals(
    withControls({ logitBias: [[9, 1], [2, 3]] }),
    withControls({ logitBias: [[2, 3], [9, 1]] }),
  );
});

Deno.test("resultCacheKey: the output constraint is part of the key", () => {
  const schema = {
    ...base,
    constraint: { type: "json_schema", schema: '{"type":"integer"}' },
  } as const;
  const other = {
    ...base,
    constraint: { type: "json_schema", schema: '{"type":"string"}' },
  } as const;
  const keys = [base, schema, other, { ...base, constraint: { type: "json_object" } } as const]
    .map((r) => resultCacheKey("m", r as GenerationRequest));
  assertEquals(new Set(keys).size, 4);
  assertEquals(
    resultCacheKey("m", schema as GenerationRequest),
    resultCacheKey("m", { ...schema }),
  );
});
