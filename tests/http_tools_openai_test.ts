// deno-lint-ignore no-import-prefix -- as in http_openai_client_test.ts
import OpenAI from "npm:openai@7.59.0";
import { assert, assertEquals, assertMatch } from "@std/assert";
import { Template } from "@huggingface/jinja";
import { Ajv } from "ajv";
import { readGgufHeader } from "../lib/model/gguf.ts";
import { ggufTokenizerData } from "../lib/model/gguf_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/**
 * The official openai client's two-turn tool flow against the real server (`main.ts serve`, cpu
 * engine) on two compat files with real vocabularies and real templates: Qwen2.5's (Hermes
 * `<tool_call>` format) and Llama 3.1's (bare JSON with "parameters"). Turn one forces a call
 * (a named function, then `required`); its arguments must parse and validate (ajv) against the
 * tool's schema. Turn two sends the call back with the tool's result and gets an answer. The
 * compat weights are random, so the answer's words mean nothing; what is checked is the
 * protocol, and that the prompt the server built is the one the model's template gives when
 * rendered independently (@huggingface/jinja directly, HF's message shapes, our tokenizer).
 * Streamed, the SDK's own accumulator (chat.completions.stream) assembles the deltas.
 */

const MAIN = new URL("../main.ts", import.meta.url).pathname;

const PARAMS = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 1, maxLength: 12 },
    unit: { enum: ["celsius", "fahrenheit"] },
  },
  required: ["city", "unit"],
  additionalProperties: false,
};
const TOOLS = [
  {
    type: "function" as const,
    function: { name: "get_weather", description: "Current weather in a city", parameters: PARAMS },
  },
  {
    type: "function" as const,
    function: {
      name: "get_time",
      description: "Local time in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 12 } },
        required: ["city"],
        additionalProperties: false,
      },
    },
  },
];
const validate = new Ajv({ strict: false }).compile(PARAMS);
const USER = { role: "user" as const, content: "What is the weather in Paris?" };
const RESULT = '{"temperature": 21, "sky": "clear"}';

/** The prompt's token count as the template renders it independently of the server. */
async function independentPromptTokens(
  stem: string,
  messages: readonly Record<string, unknown>[],
): Promise<number> {
  const header = await readGgufHeader(compatPath(stem));
  const tok = new Tokenizer(ggufTokenizerData(header.metadata, stem)!);
  const tpl = new Template(header.metadata.get("tokenizer.chat_template")!.value as string);
  const text = tpl.render({
    messages,
    tools: TOOLS,
    bos_token: tok.tokenText(tok.bosId),
    eos_token: tok.tokenText(tok.eosId),
    add_generation_prompt: true,
  });
  return tok.encodeTemplate(text).length;
}

/** The call message as Hugging Face templates take it: arguments as an object, content null. */
function hfAssistant(call: { id: string; function: { name: string; arguments: string } }) {
  return {
    role: "assistant",
    content: null,
    tool_calls: [{
      id: call.id,
      type: "function",
      function: { name: call.function.name, arguments: JSON.parse(call.function.arguments) },
    }],
  };
}

for (const stem of ["qwen2-like-q4_k_m", "llama3-like-q4_k_m"]) {
  Deno.test(`the openai client's tool flow on ${stem}: forced call, tool result, answer; streaming and not`, async () => {
    const server = await spawnUntilListening([
      "run",
      "--allow-all",
      MAIN,
      "serve",
      "--model",
      compatPath(stem),
      "--port",
      "0",
      "--backend",
      "cpu",
      "--context-length",
      "1024",
      "--kv-memory",
      "16MiB",
      "--max-running",
      "4",
      // The tool grammars compile in well under the 10 s default; a loaded CI machine can
      // stretch that, and this test is about the tool flow, not the budget (tested below).
      "--grammar-compile-timeout",
      "2m",
    ]);
    try {
      const client = new OpenAI({ baseURL: server.base + "/v1", apiKey: "unused", maxRetries: 0 });
      const model = stem;

      // Turn one, not streamed: a named function.
      const first = await client.chat.completions.create({
        model,
        messages: [USER],
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_weather" } },
        temperature: 0,
        max_tokens: 128,
      });
      const c1 = first.choices[0]!;
      assertEquals(c1.finish_reason, "tool_calls");
      assertEquals(c1.message.content, null);
      assertEquals(c1.message.tool_calls?.length, 1);
      const call = c1.message.tool_calls![0]! as {
        id: string;
        type: string;
        function: { name: string; arguments: string };
      };
      assertMatch(call.id, /^call_/);
      assertEquals([call.type, call.function.name], ["function", "get_weather"]);
      const args = JSON.parse(call.function.arguments);
      assert(validate(args), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
      assertEquals(
        first.usage!.prompt_tokens,
        await independentPromptTokens(stem, [USER]),
        "the prompt is the template's rendering with the tools",
      );

      // Turn two: the call and its result go back; the model answers (auto).
      const second = await client.chat.completions.create({
        model,
        messages: [USER, c1.message, { role: "tool", tool_call_id: call.id, content: RESULT }],
        tools: TOOLS,
        temperature: 0,
        max_tokens: 12,
      });
      const c2 = second.choices[0]!;
      assert(["stop", "length", "tool_calls"].includes(c2.finish_reason), c2.finish_reason);
      assertEquals(c2.message.role, "assistant");
      assert(
        typeof c2.message.content === "string" || (c2.message.tool_calls?.length ?? 0) > 0,
        JSON.stringify(c2.message),
      );
      assertEquals(
        second.usage!.prompt_tokens,
        await independentPromptTokens(stem, [
          USER,
          hfAssistant(call),
          { role: "tool", tool_call_id: call.id, content: RESULT },
        ]),
        "the call and the tool result render as the template writes them",
      );

      // Streamed, tool_choice "required": the SDK assembles the delta.tool_calls chunks.
      const stream = client.chat.completions.stream({
        model,
        messages: [USER],
        tools: TOOLS,
        tool_choice: "required",
        temperature: 0,
        max_tokens: 128,
      });
      const done = await stream.finalChatCompletion();
      const s1 = done.choices[0]!;
      assertEquals(s1.finish_reason, "tool_calls");
      const sc = s1.message.tool_calls![0]! as typeof call;
      assertMatch(sc.id, /^call_/);
      assert(["get_weather", "get_time"].includes(sc.function.name), sc.function.name);
      const sargs = JSON.parse(sc.function.arguments);
      if (sc.function.name === "get_weather") assert(validate(sargs), sc.function.arguments);
      else assertEquals(typeof sargs.city, "string");
      assert(!s1.message.content, `no content beside the call: ${s1.message.content}`);

      // Turn two, streamed.
      const answer = client.chat.completions.stream({
        model,
        messages: [USER, s1.message, { role: "tool", tool_call_id: sc.id, content: RESULT }],
        tools: TOOLS,
        temperature: 0,
        max_tokens: 12,
        stream_options: { include_usage: true },
      });
      const final = await answer.finalChatCompletion();
      const s2 = final.choices[0]!;
      assert(["stop", "length", "tool_calls"].includes(s2.finish_reason), s2.finish_reason);
      assertEquals(
        final.usage!.prompt_tokens,
        await independentPromptTokens(stem, [
          USER,
          hfAssistant(sc),
          { role: "tool", tool_call_id: sc.id, content: RESULT },
        ]),
      );

      // auto: the model's own text is parsed. A GBNF grammar stands in for a model that chooses
      // to call (these weights never would): it spells the template's format with ordinary
      // tokens, which the real detokenizer turns back into the text the parser reads.
      const written = stem.startsWith("qwen")
        ? 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
        : '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}';
      const auto = await client.chat.completions.create({
        model,
        messages: [USER],
        tools: TOOLS,
        temperature: 0,
        max_tokens: 128,
        grammar: `root ::= ${JSON.stringify(written)}`,
      } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      const a1 = auto.choices[0]!;
      assertEquals(a1.finish_reason, "tool_calls");
      assertEquals(a1.message.content, stem.startsWith("qwen") ? "Checking." : null);
      assertEquals(
        (a1.message.tool_calls![0]! as typeof call).function,
        { name: "get_weather", arguments: '{"city":"Paris","unit":"celsius"}' },
      );
    } finally {
      server.child.kill("SIGTERM");
      await server.child.status;
    }
  });
}
