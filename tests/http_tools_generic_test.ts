/**
 * Tool calls on models whose chat template has no tool syntax (tinyllama-like's Zephyr
 * template) or that have no template (stories260K): the generic format, on the real server.
 * With tool_choice "required" or a named function the answer is one call whose arguments
 * validate against the tool's schema (ajv as the oracle), through the official openai client.
 */
// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import OpenAI from "npm:openai@7.59.0";
import { assert, assertEquals } from "@std/assert";
import { Ajv } from "ajv";
import { startServer } from "./harness/server_process.ts";
import { compatPath } from "./harness/compat.ts";
import { modelFile } from "./harness/model_files.ts";

const PARAMS = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 12 },
    days: { type: "integer", minimum: 1, maximum: 7 },
  },
  required: ["city", "days"],
  additionalProperties: false,
} as const;
const TOOLS = [
  { type: "function" as const, function: { name: "get_weather", parameters: PARAMS } },
  // No arguments at all: whichever tool a random model picks, its call is short and complete.
  {
    type: "function" as const,
    function: {
      name: "get_time",
      parameters: { type: "object", properties: {}, additionalProperties: false },
    },
  },
];

for (
  const [name, args] of [
    ["tinyllama-like (a template without tools)", ["--model", compatPath("tinyllama-like-q4_0")]],
    ["stories260K (no template)", ["--model", modelFile("stories260K-ctx512.gguf")]],
  ] as const
) {
  Deno.test(`${name}: tool_choice required and a named function give one call valid under the tool's schema`, async () => {
    const srv = await startServer({
      args: [...args, "--backend", "cpu", "--kv-memory", "8MiB", "--log-format", "off"],
    });
    try {
      const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: "unused", maxRetries: 0 });
      const models = await c.models.list();
      const model = models.data[0]!.id;
      assertEquals((models.data[0] as unknown as { tool_format: string }).tool_format, "generic");
      const validate = new Ajv({ strict: false }).compile(PARAMS);
      for (
        const choice of [
          "required" as const,
          { type: "function" as const, function: { name: "get_weather" } },
        ]
      ) {
        const r = await c.chat.completions.create({
          model,
          messages: [{ role: "user", content: "What is the weather in Paris?" }],
          tools: TOOLS,
          tool_choice: choice,
          temperature: 0,
          max_tokens: 96,
        });
        const m = r.choices[0]!;
        assertEquals(m.finish_reason, "tool_calls", JSON.stringify(m));
        const call = m.message.tool_calls![0]!;
        if (call.type !== "function") throw new Error(`a ${call.type} call, expected a function`);
        if (typeof choice !== "string") assertEquals(call.function.name, "get_weather");
        if (call.function.name === "get_weather") {
          const a = JSON.parse(call.function.arguments);
          assert(validate(a), `${call.function.arguments}: ${JSON.stringify(validate.errors)}`);
        } else {
          assertEquals([call.function.name, JSON.parse(call.function.arguments)], ["get_time", {}]);
        }
      }
    } finally {
      await srv.stop();
    }
  });
}
