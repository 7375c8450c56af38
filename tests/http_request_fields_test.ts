import { assert, assertEquals, assertMatch } from "@std/assert";
import { modelMirror } from "./harness/model_files.ts";
import { readGgufHeader } from "../lib/model/gguf.ts";
import { postJson, startService, TestSocket } from "./_http_harness.ts";
import { REFUSED_CHAT, REFUSED_COMMON } from "../lib/http/request_fields.ts";

/**
 * The field policy (lib/http/request_fields.ts): every field that changes generation in
 * OpenAI, vLLM or llama-server is honoured or refused by name; none returns 200 unchanged.
 */

const mirror = modelMirror();
const msgs = [{ role: "user", content: "Tell me a story" }];

// The fields the issue found silently ignored, with a value that would change generation in
// the server that has them (vLLM's or llama-server's documented meaning).
const IGNORED_BEFORE: [string, unknown][] = [
  ["guided_regex", "[a-z]+"],
  ["typical_p", 0.5],
];

for (const [field, value] of IGNORED_BEFORE) {
  Deno.test(`POST /v1/completions and /v1/chat/completions refuse ${field}=${JSON.stringify(value)} with a 400 naming it`, async () => {
    await using svc = await startService();
    for (
      const [path, body] of [
        ["/v1/completions", { prompt: "Once upon a time", max_tokens: 4 }],
        ["/v1/chat/completions", { messages: msgs, max_tokens: 4 }],
      ] as const
    ) {
      const res = await postJson(svc.base + path, { ...body, [field]: value });
      const err = (await res.json()).error;
      assertEquals(res.status, 400, `${path} ${field}`);
      assertEquals(err.param, field);
      assertMatch(err.message, new RegExp(`^Invalid '${field}': ${field} is not supported`));
      assert(err.message.endsWith(`; got ${JSON.stringify(value)}`), err.message);
    }
    // Nothing reached the core: a refused request generates nothing.
    assertEquals(svc.backend.requests.length, 0);
  });
}

Deno.test("every refused field is accepted at the value that means off, and as null", async () => {
  await using svc = await startService();
  const tables = [
    ["/v1/completions", { prompt: "x", max_tokens: 1 }, REFUSED_COMMON],
    ["/v1/chat/completions", { messages: msgs, max_tokens: 1 }, {
      ...REFUSED_COMMON,
      ...REFUSED_CHAT,
    }],
  ] as const;
  let sent = 0;
  for (const [path, body, table] of tables) {
    for (const [field, r] of Object.entries(table)) {
      for (const v of [...r.off, null]) {
        const res = await postJson(svc.base + path, { ...body, [field]: v });
        assertEquals(res.status, 200, `${path} ${field}=${JSON.stringify(v)}: ${await res.text()}`);
        sent++;
      }
    }
  }
  assertEquals(svc.backend.requests.length, sent);
});

Deno.test("POST /v1/completions refuses a field none of OpenAI, vLLM and llama-server has, naming it", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/completions", { prompt: "x", max_token: 5 });
  assertEquals(res.status, 400);
  const err = (await res.json()).error;
  assertEquals(err.param, "max_token");
  assertEquals(err.message, "Unknown field 'max_token'");
  const chat = await postJson(svc.base + "/v1/chat/completions", {
    messages: [{ role: "user", content: "x", tool_calls: [] }],
  });
  assertEquals(chat.status, 400);
  assertEquals((await chat.json()).error.param, "messages[0].tool_calls");
});

Deno.test("n_predict (llama-server's max_tokens) is honoured: the completion has that many tokens", async () => {
  await using svc = await startService();
  const res = await postJson(svc.base + "/v1/completions", {
    prompt: "Once upon a time",
    n_predict: 5,
    temperature: 0,
  });
  assertEquals(res.status, 200);
  assertEquals((await res.json()).usage.completion_tokens, 5);
  assertEquals(svc.backend.requests[0]!.maxTokens, 5);
});

async function qwen3Template(): Promise<string> {
  const header = await readGgufHeader(`${mirror}/compat/qwen3-like-q4_k_m.gguf`);
  const t = header.metadata.get("tokenizer.chat_template")?.value;
  if (typeof t !== "string") throw new Error("the Qwen3 compat file has no chat template");
  return t;
}

// Qwen3's template (as Qwen ship it, taken from the file) closes an empty think block after
// the generation prompt when enable_thinking is false: that is the switch's documented effect.
const NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n";

Deno.test("chat_template_kwargs reach the chat template: Qwen3's enable_thinking: false closes the think block", async () => {
  await using svc = await startService({ chatTemplate: await qwen3Template() });
  const off = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    max_tokens: 1,
    chat_template_kwargs: { enable_thinking: false },
  });
  assertEquals(off.status, 200, await off.clone().text());
  const on = await postJson(svc.base + "/v1/chat/completions", { messages: msgs, max_tokens: 1 });
  assertEquals(on.status, 200);
  const [p0, p1] = svc.backend.requests.map((r) => svc.backend.detokenize(r.prompt));
  assert(p0!.endsWith(NO_THINK), `prompt ends ${JSON.stringify(p0!.slice(-60))}`);
  assert(p1!.endsWith("<|im_start|>assistant\n") && !p1!.includes("<think>"));
  assertEquals(p0, p1 + "<think>\n\n</think>\n\n");
  // /tokenize counts the prompt the chat completion ran on, with the same variables. The
  // test server's vocabulary is tok512, which has no control tokens: the prompt is plain text
  // to it. llama2.c's run.c (the commit in tests/fixtures/run_c/README.md, with the prompt ids
  // printed after bpe_encode) encodes this prompt to 65 tokens; with BOS, 66.
  assertEquals(
    p0,
    "<|im_start|>user\nTell me a story<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
  );
  const tok = await postJson(svc.base + "/tokenize", {
    messages: msgs,
    chat_template_kwargs: { enable_thinking: false },
  });
  assertEquals((await tok.json()).count, 66);
  // And the WebSocket takes them with messages.
  const ws = await TestSocket.open(svc.wsUrl);
  try {
    ws.send({
      type: "generate",
      id: "a",
      messages: msgs,
      max_tokens: 1,
      chat_template_kwargs: { enable_thinking: false },
    });
    const frames = await ws.collect("a");
    assertEquals(frames.at(-1)!.type, "done", JSON.stringify(frames.at(-1)));
  } finally {
    await ws.close();
  }
  assertEquals(svc.backend.detokenize(svc.backend.requests[2]!.prompt), p0);
});

Deno.test("chat_template_kwargs are refused where they would have no effect or override the server", async () => {
  await using svc = await startService(); // the fake model has no chat template
  const plain = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    chat_template_kwargs: { enable_thinking: false },
  });
  assertEquals(plain.status, 400);
  const e1 = (await plain.json()).error;
  assertEquals(e1.param, "chat_template_kwargs");
  assertMatch(e1.message, /no chat template.*received \{"enable_thinking":false\}/);
  const reserved = await postJson(svc.base + "/v1/chat/completions", {
    messages: msgs,
    chat_template_kwargs: { add_generation_prompt: false },
  });
  assertEquals(reserved.status, 400);
  assertEquals((await reserved.json()).error.param, "chat_template_kwargs.add_generation_prompt");
  assertEquals(svc.backend.requests.length, 0);
});
