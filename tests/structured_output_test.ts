import { assert, assertEquals, assertLess } from "@std/assert";
import { Ajv } from "ajv";
import { ServingCore } from "../actors/core.ts";
import type { GenerationEvent, GenerationRequest } from "../lib/core/generation.ts";
import type { Engine, SamplingParams } from "../lib/engine/engine.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { lazyGrammarService } from "../lib/grammar/grammar_service.ts";
import type { OutputConstraint } from "../lib/grammar/output_constraint.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { WasmEngine } from "../kernels/wasm/wasm_engine.ts";
import { modelFile } from "./harness/model_files.ts";
import { randomSchemas } from "./_random_schema.ts";
import { closeCore } from "./_serving_core.ts";
import { compatPath } from "./harness/compat.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const KV = { numBlocks: 512, blockSize: 16 };

function core(engine: () => Engine | Promise<Engine>, first: Engine): ServingCore {
  return new ServingCore({
    engine: first,
    engineFactory: engine,
    codec: tokenizer,
    grammars: lazyGrammarService(tokenizer, model.config.vocabSize),
    scheduler: { maxRunning: 32 },
  });
}

interface Outcome {
  readonly text: string;
  readonly finish: string;
  readonly ids: number[];
  readonly error?: string;
}

async function run(c: ServingCore, req: GenerationRequest): Promise<Outcome> {
  let text = "", finish = "", error: string | undefined;
  const ids: number[] = [];
  for await (const ev of c.generate(req) as AsyncIterable<GenerationEvent>) {
    if (ev.type === "token") {
      text += ev.text;
      ids.push(...ev.ids);
    } else if (ev.type === "done") finish = ev.finishReason;
    else if (ev.type === "error") error = `${ev.code}: ${ev.message}`;
  }
  return error === undefined ? { text, finish, ids } : { text, finish, ids, error };
}

function request(
  i: number,
  constraint: OutputConstraint | undefined,
  maxTokens: number,
  sampling: Partial<SamplingParams> = {},
): GenerationRequest {
  return {
    prompt: tokenizer.encode(`Once upon a time, record ${i}:`),
    maxTokens,
    sampling: { temperature: 1, topK: 0, topP: 1, minP: 0, seed: 1000 + i, ...sampling },
    stop: [],
    priority: "interactive",
    requestId: `schema-${i}`,
    ...(constraint ? { constraint } : {}),
  };
}

function parses(text: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

Deno.test("200 random JSON schemas at temperature 1 on the cpu engine: every output parses and validates (ajv); unconstrained, almost none do", async () => {
  const schemas = randomSchemas(200, 20261202);
  const engine = () => WasmEngine.create(model.config, model.weights, KV, { maxSeqs: 32 });
  const c = core(engine, await engine());
  try {
    const ajv = new Ajv({ strict: false });
    const constrained = await Promise.all(
      schemas.map((s, i) =>
        run(c, request(i, { type: "json_schema", schema: JSON.stringify(s) }, 256))
      ),
    );
    const free = await Promise.all(schemas.map((_, i) => run(c, request(i, undefined, 64))));
    let validFree = 0;
    constrained.forEach((out, i) => {
      const schema = JSON.stringify(schemas[i]);
      assertEquals(out.error, undefined, `schema ${i} ${schema}`);
      assertEquals(out.finish, "stop", `schema ${i} ${schema}: ${out.text}`);
      const parsed = parses(out.text);
      if (!parsed.ok) throw new Error(`schema ${i} ${schema}: output does not parse: ${out.text}`);
      const validate = ajv.compile(schemas[i]!);
      assert(
        validate(parsed.value),
        `schema ${i} ${schema}: ${out.text}: ${JSON.stringify(validate.errors)}`,
      );
    });
    free.forEach((out, i) => {
      const parsed = parses(out.text);
      if (parsed.ok && ajv.compile(schemas[i]!)(parsed.value)) validFree++;
    });
    // The same prompts and seeds without the constraint: the model writes stories.
    assertLess(validFree, 10, `${validFree} of 200 unconstrained outputs validated`);
  } finally {
    await closeCore(c);
  }
});

Deno.test("constrained decoding on the reference engine: json_object and a schema, greedy and sampled, always parse", async () => {
  const engine = () => new CpuEngine(model.config, model.weights, KV);
  const c = core(engine, engine());
  try {
    const schema = {
      type: "object",
      properties: {
        name: { type: "string", maxLength: 5 },
        n: { type: "integer", minimum: 1, maximum: 9 },
      },
      required: ["name", "n"],
      additionalProperties: false,
    };
    const validate = new Ajv({ strict: false }).compile(schema);
    for (const temperature of [0, 1]) {
      const a = await run(
        c,
        request(1, { type: "json_schema", schema: JSON.stringify(schema) }, 128, { temperature }),
      );
      assertEquals(a.finish, "stop", a.text);
      assert(validate(JSON.parse(a.text)), a.text);
      const b = await run(c, request(2, { type: "json_object" }, 400, { temperature }));
      if (b.finish === "stop") {
        const v = JSON.parse(b.text);
        assert(typeof v === "object" && v !== null && !Array.isArray(v), b.text);
      } else {
        // A free-form object may run past max_tokens: then it is still a valid prefix.
        assertEquals(b.finish, "length");
        assert(b.text.startsWith("{"), b.text);
      }
    }
  } finally {
    await closeCore(c);
  }
});

Deno.test("a constrained sequence gives the same tokens alone and batched with unconstrained ones", async () => {
  const engine = () => WasmEngine.create(model.config, model.weights, KV, { maxSeqs: 32 });
  const c = core(engine, await engine());
  try {
    const schema = JSON.stringify(randomSchemas(1, 5)[0]);
    const alone = await run(c, request(7, { type: "json_schema", schema }, 200));
    const mixed = await Promise.all([
      run(c, request(7, { type: "json_schema", schema }, 200)),
      ...Array.from({ length: 6 }, (_, i) => run(c, request(100 + i, undefined, 40))),
    ]);
    assertEquals(mixed[0]!.ids, alone.ids);
    assertEquals(alone.finish, "stop");
    // The unconstrained ones ran their full length beside it.
    for (const m of mixed.slice(1)) assert(m.finish === "length" || m.finish === "stop");
  } finally {
    await closeCore(c);
  }
});

Deno.test("a schema that does not compile ends the generation with invalid_request before anything runs", async () => {
  const engine = () => new CpuEngine(model.config, model.weights, KV);
  const c = core(engine, engine());
  try {
    const out = await run(c, request(1, { type: "json_schema", schema: "{oops" }, 16));
    assert(out.error?.startsWith("invalid_request: Cannot compile the JSON schema"), out.error);
    assertEquals(c.stats().running, 0);
  } finally {
    await closeCore(c);
  }
});

Deno.test("a failover resubmission (prompt + delivered ids, constraintReplay) continues exactly where the lost generation was", async () => {
  const engine = () => WasmEngine.create(model.config, model.weights, KV, { maxSeqs: 32 });
  const c = core(engine, await engine());
  try {
    const schema = JSON.stringify(randomSchemas(3, 77)[2]);
    const constraint = { type: "json_schema", schema } as const;
    const prompt = tokenizer.encode("Once upon a time, record 9:");
    const whole = await run(c, { ...request(9, constraint, 256), prompt });
    assertEquals(whole.finish, "stop");
    assert(whole.ids.length >= 6, whole.text);
    for (const k of [1, 3, Math.floor(whole.ids.length / 2)]) {
      // As the router resubmits: the delivered ids appended, max_tokens less them, same seed.
      const resumed = await run(c, {
        ...request(9, constraint, 256 - k),
        prompt: [...prompt, ...whole.ids.slice(0, k)],
        constraintReplay: k,
      });
      assertEquals(resumed.ids, whole.ids.slice(k), `resumed after ${k} tokens`);
      assertEquals(resumed.finish, "stop");
    }
    // Without the replay the grammar would start over at the delivered text: not the same.
    const naive = await run(c, {
      ...request(9, constraint, 256 - 3),
      prompt: [...prompt, ...whole.ids.slice(0, 3)],
    });
    assert(naive.ids.join() !== whole.ids.slice(3).join());
  } finally {
    await closeCore(c);
  }
});

Deno.test("late masks: 32 constrained sequences at temperature 1 decode from their tokens in flight and give the same tokens as when each waits for its token", async () => {
  const engine = () => WasmEngine.create(model.config, model.weights, KV, { maxSeqs: 32 });
  const schemas = randomSchemas(32, 99);
  const outputs: Outcome[][] = [];
  for (const lateMasks of [true, false]) {
    let lateSamples = 0;
    const c = new ServingCore({
      engine: await engine(),
      engineFactory: engine,
      codec: tokenizer,
      grammars: lazyGrammarService(tokenizer, model.config.vocabSize),
      scheduler: { maxRunning: 32, lateMasks },
      executor: {
        onStep: (r) => lateSamples += r.plan.seqs.filter((s) => s.lateTokenMask).length,
      },
    });
    try {
      outputs.push(
        await Promise.all(
          schemas.map((s, i) =>
            run(c, request(i, { type: "json_schema", schema: JSON.stringify(s) }, 200))
          ),
        ),
      );
    } finally {
      await closeCore(c);
    }
    if (lateMasks) assert(lateSamples > 100, `${lateSamples} samples under a late mask`);
    else assertEquals(lateSamples, 0);
  }
  const [late, waiting] = outputs as [Outcome[], Outcome[]];
  late.forEach((out, i) => {
    assertEquals(out.error, undefined);
    assertEquals(out.finish, "stop", out.text);
    assertEquals(out.ids, waiting[i]!.ids, `schema ${i}`);
  });
});

Deno.test("a cold schema compile runs off the event loop: another generation keeps streaming tokens meanwhile (152k vocabulary)", async () => {
  const big = await loadModel(compatPath("qwen2-like-q4_k_m"));
  const bigTokenizer = new Tokenizer(big.tokenizer!);
  const engine = () => WasmEngine.create(big.config, big.weights, KV, { maxSeqs: 4 });
  const inner = lazyGrammarService(bigTokenizer, big.config.vocabSize);
  await inner.service(); // the vocabulary is built; what is measured is one schema's compile
  let streamed = 0, duringCompile = -1;
  const c = new ServingCore({
    engine: await engine(),
    engineFactory: engine,
    codec: bigTokenizer,
    grammars: {
      constraint: async (spec, replay) => {
        const before = streamed;
        const out = await inner.constraint(spec, replay);
        duringCompile = streamed - before;
        return out;
      },
    },
    scheduler: { maxRunning: 4 },
  });
  try {
    const free = (async () => {
      const req = { ...request(1, undefined, 100_000), ignoreEos: true };
      for await (const ev of c.generate(req) as AsyncIterable<GenerationEvent>) {
        if (ev.type === "token") streamed += ev.ids.length;
        if (duringCompile >= 0) break; // closes the stream: the generation is cancelled
      }
    })();
    while (streamed < 2) await new Promise((r) => setTimeout(r, 10));
    const schema = {
      type: "object",
      properties: {
        name: { type: "string", maxLength: 20 },
        age: { type: "integer", minimum: 0, maximum: 150 },
        tags: { type: "array", items: { enum: ["a", "b", "c"] }, maxItems: 5 },
        address: {
          type: "object",
          properties: { city: { type: "string" }, zip: { type: "string", pattern: "^[0-9]{5}$" } },
          required: ["city"],
        },
      },
      required: ["name", "age"],
      additionalProperties: false,
    };
    const constrained = await run(
      c,
      request(2, { type: "json_schema", schema: JSON.stringify(schema) }, 8),
    );
    await free;
    assertEquals(constrained.error, undefined);
    // Compiled on the main thread, the compile stalled every stream for its whole length.
    assert(duringCompile >= 5, `${duringCompile} tokens streamed while the schema compiled`);
  } finally {
    await closeCore(c);
    (await inner.service()).close();
  }
});

Deno.test("late masks: constrained generations cancelled mid-stream leave the engine nothing to wait for; the others finish", async () => {
  const engine = () => WasmEngine.create(model.config, model.weights, KV, { maxSeqs: 32 });
  const c = core(engine, await engine());
  try {
    const schema = { type: "json_object" } as const;
    const cut = async (i: number) => {
      let n = 0;
      for await (
        const ev of c.generate(request(i, schema, 200)) as AsyncIterable<GenerationEvent>
      ) {
        if (ev.type === "token" && ++n === 3) break; // closes the stream: cancelled
      }
      return n;
    };
    const outs = await Promise.all([
      ...Array.from({ length: 8 }, (_, i) => cut(i)),
      ...Array.from({ length: 4 }, (_, i) => run(c, request(50 + i, schema, 60))),
    ]);
    outs.slice(0, 8).forEach((n) => assertEquals(n, 3));
    for (const o of outs.slice(8) as Outcome[]) assertEquals(o.error, undefined);
  } finally {
    await closeCore(c);
  }
});
