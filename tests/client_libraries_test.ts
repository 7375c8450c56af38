/**
 * Two more clients people point at an inference server, against the real server on a compat
 * model: LangChain's ChatOllama (Ollama's API) and the Vercel AI SDK over
 * @ai-sdk/openai-compatible (streamText, generateObject). The oracle is the same greedy request
 * through /v1/chat/completions, and a schema check of the generated object.
 */
import { ChatOllama } from "@langchain/ollama";
import { generateObject, jsonSchema, streamText } from "ai";
import {
  createOpenAICompatible,
  OpenAICompatibleChatLanguageModel,
} from "@ai-sdk/openai-compatible";
import { Ajv } from "ajv";
import { assertEquals } from "@std/assert";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

const STEM = "tinyllama-like-q4_0";
const MAIN = new URL("../main.ts", import.meta.url).pathname;
const QUESTION = "Tell me about the sea";

async function chatText(base: string, maxTokens: number): Promise<string> {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      messages: [{ role: "user", content: QUESTION }],
      max_tokens: maxTokens,
      temperature: 0,
    }),
  });
  const j = await res.json();
  assertEquals(res.status, 200, JSON.stringify(j));
  return j.choices[0].message.content;
}

Deno.test("ChatOllama and the Vercel AI SDK get /v1/chat/completions' greedy text; generateObject a schema-valid object", async (t) => {
  const server = await spawnUntilListening([
    ...["run", "--allow-all", MAIN, "serve", "--model", compatPath(STEM), "--port", "0"],
    ...["--backend", "cpu", "--context-length", "512", "--kv-memory", "8MiB"],
  ]);
  const base = server.base;
  try {
    const want = await chatText(base, 12);
    await t.step("LangChain's ChatOllama, invoke and stream", async () => {
      const llm = new ChatOllama({ baseUrl: base, model: STEM, temperature: 0, numPredict: 12 });
      const answer = await llm.invoke([["human", QUESTION]]);
      assertEquals(answer.content, want);
      let streamed = "";
      for await (const chunk of await llm.stream([["human", QUESTION]])) {
        streamed += chunk.content as string;
      }
      assertEquals(streamed, want);
    });
    const provider = createOpenAICompatible({ name: "llmserve", baseURL: `${base}/v1` });
    await t.step("the AI SDK's streamText", async () => {
      const result = streamText({
        model: provider(STEM),
        prompt: QUESTION,
        maxTokens: 12,
        temperature: 0,
      });
      let text = "";
      for await (const part of result.textStream) text += part;
      assertEquals(text, want);
    });
    await t.step("the AI SDK's generateObject under a JSON schema", async () => {
      const shape = {
        type: "object",
        properties: {
          name: { type: "string", maxLength: 12 },
          age: { type: "integer", minimum: 0, maximum: 99 },
        },
        required: ["name", "age"],
        additionalProperties: false,
      } as const;
      const { object } = await generateObject({
        // The provider's factory has no structured-outputs switch in 0.2.14: the model class
        // does, and with it the SDK sends response_format json_schema (else json_object).
        model: new OpenAICompatibleChatLanguageModel(STEM, {}, {
          provider: "llmserve.chat",
          url: ({ path }) => `${base}/v1${path}`,
          headers: () => ({}),
          supportsStructuredOutputs: true,
          defaultObjectGenerationMode: "json",
        }),
        schema: jsonSchema<{ name: string; age: number }>(shape),
        prompt: "Describe a person",
        temperature: 0,
        maxTokens: 64,
      });
      const validate = new Ajv({ strict: false }).compile(shape);
      assertEquals(validate(object), true, JSON.stringify([object, validate.errors]));
    });
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
  }
});
