/**
 * POST /tokenize, POST /detokenize and GET /props on the real stories260K tokenizer, checked
 * against karpathy's run.c (tests/fixtures/run_c: the ids it encoded and the text it printed).
 */
import { assertEquals, assertStringIncludes } from "@std/assert";
import { ServingCore } from "../actors/core.ts";
import { createApp } from "../lib/http/app.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CoreBackend } from "../lib/backend/core_backend.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { postJson } from "./_http_harness.ts";
import { modelFile } from "./harness/model_files.ts";

const model = await loadModel(modelFile("stories260K.bin"), {
  tokenizerPath: modelFile("tok512.bin"),
});
const tokenizer = new Tokenizer(model.tokenizer!);
const fixture = new URL("./fixtures/run_c/", import.meta.url);
const idsFile = Deno.readTextFileSync(new URL("once_upon_a_time_n64.ids.txt", fixture));
const idLine = (name: string) =>
  idsFile.split("\n").find((l) => l.startsWith(name + " "))!.split(" ").slice(1).map(Number);
/** run.c's encoding of "Once upon a time": BOS, then the prompt. */
const RUN_C_PROMPT = idLine("prompt");
const RUN_C_GENERATED = idLine("generated");
/** run.c printed the prompt, then the continuation, then a newline. */
const RUN_C_TEXT = Deno.readTextFileSync(new URL("once_upon_a_time_n64.txt", fixture));

function serve(opts: { servedModelNames?: string[] } = {}) {
  const make = () => new CpuEngine(model.config, model.weights, { numBlocks: 64, blockSize: 16 });
  const core = new ServingCore({ engine: make(), engineFactory: make, codec: tokenizer });
  const backend = new CoreBackend("stories260K", core, tokenizer);
  const service = createApp({
    backend,
    requestLog: new RequestLog("text", () => {}),
    props: { modelPath: "/models/stories260K.bin", maxRunning: 64, maxWaiting: 256 },
    ...opts,
  });
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, service.fetch);
  const { port } = server.addr as Deno.NetAddr;
  return {
    base: `http://127.0.0.1:${port}`,
    async [Symbol.asyncDispose]() {
      service.close();
      await server.shutdown();
      await core.close();
    },
  };
}

async function post(base: string, path: string, body: unknown) {
  const res = await postJson(base + path, body);
  return [res.status, await res.json()] as const;
}

Deno.test("POST /tokenize in llama-server's shape: no BOS unless add_special, as run.c encodes the text", async () => {
  await using svc = serve();
  const [status, plain] = await post(svc.base, "/tokenize", { content: "Once upon a time" });
  assertEquals(status, 200);
  assertEquals(plain, { tokens: RUN_C_PROMPT.slice(1), count: 4, max_model_len: 512 });
  const [, withBos] = await post(svc.base, "/tokenize", {
    content: "Once upon a time",
    add_special: true,
  });
  assertEquals(withBos.tokens, RUN_C_PROMPT);
  const [, pieces] = await post(svc.base, "/tokenize", {
    content: "Once upon",
    add_special: true,
    with_pieces: true,
  });
  // tok512.bin spells BOS "\n<s>\n"; a piece on its own keeps its leading space.
  assertEquals(pieces.tokens, [
    { id: 1, piece: "\n<s>\n" },
    { id: RUN_C_PROMPT[1], piece: " Once" },
    { id: RUN_C_PROMPT[2], piece: " upon" },
  ]);
});

Deno.test("POST /tokenize in vLLM's shape: BOS unless add_special_tokens is false; messages give the chat completion's prompt ids", async () => {
  await using svc = serve();
  const [, prompt] = await post(svc.base, "/tokenize", { prompt: "Once upon a time" });
  assertEquals(prompt, { tokens: RUN_C_PROMPT, count: 5, max_model_len: 512 });
  const [, noBos] = await post(svc.base, "/tokenize", {
    prompt: "Once upon a time",
    add_special_tokens: false,
  });
  assertEquals(noBos.tokens, RUN_C_PROMPT.slice(1));
  // No template in this file: the plain chat format, which is what /v1/chat/completions runs.
  const [, chat] = await post(svc.base, "/tokenize", {
    model: "stories260K",
    messages: [{ role: "user", content: "Hi" }],
  });
  assertEquals(chat.tokens, tokenizer.encode("User: Hi\nAssistant:"));
  const res = await postJson(svc.base + "/v1/chat/completions", {
    messages: [{ role: "user", content: "Hi" }],
    max_tokens: 1,
    temperature: 0,
  });
  assertEquals((await res.json()).usage.prompt_tokens, chat.count);
});

Deno.test("POST /detokenize answers the text in both servers' fields, as run.c printed it", async () => {
  await using svc = serve();
  const [status, body] = await post(svc.base, "/detokenize", {
    tokens: [...RUN_C_PROMPT, ...RUN_C_GENERATED],
  });
  assertEquals(status, 200);
  assertEquals(body.content, RUN_C_TEXT.replace(/\n$/, ""));
  assertEquals(body.prompt, body.content);
});

Deno.test("/tokenize and /detokenize refuse bad input with 400 or 404 naming the problem", async () => {
  await using svc = serve();
  const cases: Array<[string, unknown, number, string]> = [
    ["/tokenize", {}, 400, "'content'"],
    ["/tokenize", { content: "a", prompt: "b" }, 400, "exactly one"],
    ["/tokenize", { content: "a", bogus: 1 }, 400, "'bogus'"],
    ["/tokenize", { content: 5 }, 400, "content"],
    ["/tokenize", { prompt: "a", model: "gpt-4" }, 404, '"gpt-4" does not exist'],
    ["/detokenize", { tokens: [1, 512] }, 400, "512 at index 1"],
    ["/detokenize", { tokens: [-1] }, 400, "tokens[0]"],
    ["/detokenize", { tokens: "abc" }, 400, "tokens"],
  ];
  for (const [path, body, status, text] of cases) {
    const [got, json] = await post(svc.base, path, body);
    assertEquals(got, status, `${path} ${JSON.stringify(body)}: ${JSON.stringify(json)}`);
    assertStringIncludes(`${json.error.message} param=${json.error.param}`, text);
  }
});

Deno.test("GET /props gives the model, its context, template, special tokens, limits and served names", async () => {
  await using svc = serve({ servedModelNames: ["tiny", "gpt-3.5-turbo"] });
  const res = await fetch(svc.base + "/props");
  const p = await res.json();
  assertEquals(p.model, "tiny");
  assertEquals(p.served_model_names, ["tiny", "gpt-3.5-turbo"]);
  assertEquals(p.model_path, "/models/stories260K.bin");
  assertEquals(p.context_length, 512);
  assertEquals(p.default_generation_settings.n_ctx, 512);
  assertEquals(p.vocab_size, 512);
  assertEquals(p.chat_template, null);
  // As tok512.bin spells them.
  assertEquals([p.bos_token, p.eos_token], ["\n<s>\n", "\n</s>\n"]);
  assertEquals(p.total_slots, 64);
  assertEquals(p.limits.max_waiting, 256);
  assertEquals(p.limits.max_body_bytes, 1 << 20);
  assertEquals(p.loaded, true);
});

Deno.test("/tokenize refuses text that cannot fit in the context before tokenizing it, naming the limit", async () => {
  await using svc = serve();
  const long = "Once upon a time ".repeat(40_000); // 680 KB
  const messages = [{ role: "user", content: long }];
  for (const body of [{ content: long }, { prompt: long }, { messages }]) {
    const [status, json] = await post(svc.base, "/tokenize", body);
    assertEquals(status, 400, JSON.stringify(json).slice(0, 200));
    assertEquals(json.error.code, "context_length_exceeded");
    assertStringIncludes(json.error.message, `context is ${model.config.contextLength} tokens`);
    assertEquals(json.error.param, Object.keys(body)[0]);
  }
  // Text that fits is still tokenized.
  const [status, json] = await post(svc.base, "/tokenize", { content: "Once upon a time" });
  assertEquals(status, 200);
  assertEquals(json.count, tokenizer.encode("Once upon a time", { bos: false }).length);
});
