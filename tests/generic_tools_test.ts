import { assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { type ChatTurn, createChatRenderer, renderPlainChat } from "../lib/chat/chat_template.ts";
import { ChatRequestError } from "../lib/chat/chat_error.ts";
import {
  genericToolPrompt,
  genericToolTurns,
  renderWithPreamble,
} from "../lib/chat/generic_tools.ts";

/**
 * The generic tool format's text side (lib/chat/generic_tools.ts): the tool section of the
 * system prompt, a history's calls and results as text turns, and where the section goes in
 * templates that take a system turn and in one that refuses it. The served behaviour (grammar,
 * responses) is in http_tools_test.ts (fake model) and http_tools_generic_test.ts (compat models).
 */

const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

Deno.test("the tool section lists each tool's name, description and parameters, then how to call", () => {
  const auto = genericToolPrompt([WEATHER, { type: "function", function: { name: "now" } }], false);
  assertEquals(
    auto,
    "You can call these tools:\n" +
      "- get_weather: Weather in a city\n" +
      '  arguments: {"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}\n' +
      '- now\n  arguments: {"type":"object"}\n' +
      'To call a tool, answer with only a JSON object: {"name": <tool name>, "arguments": ' +
      "<an object valid under that tool's parameters>}. Otherwise answer in text.",
  );
  const must = genericToolPrompt([WEATHER], true);
  assertStringIncludes(must, '\nAnswer with only a JSON object: {"name"');
  assertEquals(must.includes("Otherwise"), false);
});

Deno.test("a history's calls become the assistant's text and results user turns, joined with the next user turn", () => {
  const turns: ChatTurn[] = [
    { role: "user", content: "Weather in Paris and Rome?" },
    {
      role: "assistant",
      content: "Checking.",
      toolCalls: [
        { id: "c1", name: "get_weather", arguments: { city: "Paris" } },
        { id: "c2", name: "get_weather", arguments: { city: "Rome" } },
      ],
    },
    { role: "tool", content: "sun", toolCallId: "c1" },
    { role: "tool", content: "rain", toolCallId: "c2", name: "weather_api" },
    { role: "user", content: "Thanks. And tomorrow?" },
  ];
  assertEquals(genericToolTurns(turns), [
    { role: "user", content: "Weather in Paris and Rome?" },
    {
      role: "assistant",
      content: 'Checking.\n{"name":"get_weather","arguments":{"city":"Paris"}}\n' +
        '{"name":"get_weather","arguments":{"city":"Rome"}}',
    },
    {
      role: "user",
      content: "Tool result (get_weather): sun\n\nTool result (weather_api): rain\n\n" +
        "Thanks. And tomorrow?",
    },
  ]);
  // Without tools, two user turns in a row stay as they were.
  const plain: ChatTurn[] = [{ role: "user", content: "a" }, { role: "user", content: "b" }];
  assertEquals(genericToolTurns(plain), plain);
});

Deno.test("the tool section goes before the system text, else in a system turn of its own", () => {
  const zephyr = createChatRenderer({
    template: "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}" +
      "<|assistant|>",
    bosToken: "<s>",
    eosToken: "</s>",
  });
  const user: ChatTurn = { role: "user", content: "Hi" };
  assertEquals(
    renderWithPreamble(zephyr, [{ role: "system", content: "Be terse." }, user], null, "TOOLS")
      .prompt,
    "<|system|>\nTOOLS\n\nBe terse.</s>\n<|user|>\nHi</s>\n<|assistant|>",
  );
  assertEquals(
    renderWithPreamble(zephyr, [user], null, "TOOLS").prompt,
    "<|system|>\nTOOLS</s>\n<|user|>\nHi</s>\n<|assistant|>",
  );
  assertEquals(
    renderWithPreamble(renderPlainChat, [user], null, "TOOLS").prompt,
    "System: TOOLS\nUser: Hi\nAssistant:",
  );
});

Deno.test("a template that refuses system turns gets the tool section in the first user turn", () => {
  const strict = createChatRenderer({
    template: "{% for m in messages %}{% if m.role == 'system' %}" +
      "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}" +
      "[INST] {{ m.content }} [/INST]{% endfor %}",
    bosToken: "<s>",
    eosToken: "</s>",
  });
  const turns: ChatTurn[] = [{ role: "user", content: "Hi" }];
  assertEquals(
    renderWithPreamble(strict, turns, null, "TOOLS").prompt,
    "[INST] TOOLS\n\nHi [/INST]",
  );
  // With no user turn to carry it, the template's own refusal is what the client reads.
  const err = assertThrows(
    () => renderWithPreamble(strict, [{ role: "assistant", content: "x" }], null, "TOOLS"),
    ChatRequestError,
  );
  assertStringIncludes(err.message, "Only user and assistant roles are supported!");
});
