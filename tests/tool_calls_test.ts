import { assertEquals } from "@std/assert";
import {
  parseCallJson,
  type ParsedOutput,
  parseToolCalls,
  type ToolCallFormat,
  ToolCallStream,
} from "../lib/chat/tool_calls.ts";

/**
 * The tool-call parsers on hand-written model texts, in the shapes the Qwen2.5/Qwen3 (Hermes)
 * and Llama 3.1 templates teach, and the streaming parser against the whole-text one on every
 * way of cutting each text into pieces of 1 to 7 characters.
 */

const call = (name: string, args: Record<string, unknown>) => ({
  name,
  arguments: JSON.stringify(args),
});

/** `cut`: the text ended at max_tokens (finish_reason "length"). */
const CASES: {
  name: string;
  format: ToolCallFormat;
  text: string;
  cut?: boolean;
  want: ParsedOutput;
}[] = [
  {
    name: "hermes: one call, as Qwen2.5 writes it",
    format: "hermes",
    text:
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
    want: { content: null, calls: [call("get_weather", { city: "Paris", days: 2 })] },
  },
  {
    name: "hermes: text before two calls",
    format: "hermes",
    text: 'Let me check both.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n' +
      '<tool_call>\n{"name": "b", "arguments": {"x": [1, 2]}}\n</tool_call>',
    want: { content: "Let me check both.", calls: [call("a", {}), call("b", { x: [1, 2] })] },
  },
  {
    name: "hermes: Qwen3's thinking stays content",
    format: "hermes",
    text:
      '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": "w", "arguments": {"c": "<b>"}}\n</tool_call>',
    want: {
      content: "<think>\nThe user wants weather.\n</think>",
      calls: [call("w", { c: "<b>" })],
    },
  },
  {
    name: "hermes: a call cut at the end of the answer (no closing tag) still parses",
    format: "hermes",
    text: '<tool_call>\n{"name": "f", "arguments": {"q": "x"}}',
    want: { content: null, calls: [call("f", { q: "x" })] },
  },
  {
    name: "hermes: a block that is not a call stays text, the valid one is a call",
    format: "hermes",
    text:
      '<tool_call>\nnot json\n</tool_call> and <tool_call>{"name": "g", "arguments": {}}</tool_call> done',
    want: { content: "<tool_call>\nnot json\n</tool_call> and  done", calls: [call("g", {})] },
  },
  {
    name: "hermes: plain text is content, untouched",
    format: "hermes",
    text: "The weather is nice. <tool_ is not a tag  \n",
    want: { content: "The weather is nice. <tool_ is not a tag  \n", calls: [] },
  },
  {
    name: "hermes: bare JSON is not a call in this format",
    format: "hermes",
    text: '{"name": "f", "arguments": {}}',
    want: { content: '{"name": "f", "arguments": {}}', calls: [] },
  },
  {
    name: "hermes: arguments given as a JSON string",
    format: "hermes",
    text: '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
    want: { content: null, calls: [call("f", { a: 1 })] },
  },
  {
    name: "json: Llama 3.1's call",
    format: "json",
    text: '{"name": "get_weather", "parameters": {"city": "San Francisco"}}',
    want: { content: null, calls: [call("get_weather", { city: "San Francisco" })] },
  },
  {
    name: "json: after <|python_tag|> and whitespace",
    format: "json",
    text: '<|python_tag|>  {"name": "f", "parameters": {"n": 3}}\n',
    want: { content: null, calls: [call("f", { n: 3 })] },
  },
  {
    name: "json: two calls separated by ';'",
    format: "json",
    text: '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
    want: { content: null, calls: [call("a", { x: 1 }), call("b", {})] },
  },
  {
    name: "json: 'arguments' accepted too (the constrained shape)",
    format: "json",
    text: '{"name": "f", "arguments": {"x": "y"}}',
    want: { content: null, calls: [call("f", { x: "y" })] },
  },
  {
    name: "json: an answer in words is content",
    format: "json",
    text: "It is sunny in Paris.",
    want: { content: "It is sunny in Paris.", calls: [] },
  },
  {
    name: "json: a JSON object that is not a call is content",
    format: "json",
    text: ' {"city": "Paris"}',
    want: { content: ' {"city": "Paris"}', calls: [] },
  },
  {
    name: "json: a call cut short is content",
    format: "json",
    text: '{"name": "f", "parameters": {"x": ',
    want: { content: '{"name": "f", "parameters": {"x": ', calls: [] },
  },
  {
    name: "json: a call cut by max_tokens is that call, its arguments as far as they came",
    format: "json",
    text: '{"name": "f", "parameters": {"x": ',
    cut: true,
    want: { content: null, calls: [{ name: "f", arguments: '{"x": ' }] },
  },
  {
    name: "json: a call cut inside its name has the name so far, escapes read",
    format: "json",
    text: '<|python_tag|>{"name": "a\\"b\\u00',
    cut: true,
    want: { content: null, calls: [{ name: 'a"b', arguments: "" }] },
  },
  {
    name: "json: cut before the name began, still a call (nothing of it yet)",
    format: "json",
    text: '{"na',
    cut: true,
    want: { content: null, calls: [{ name: "", arguments: "" }] },
  },
  {
    name: "json: words cut by max_tokens stay content",
    format: "json",
    text: "It is sun",
    cut: true,
    want: { content: "It is sun", calls: [] },
  },
  {
    name: "hermes: a call cut by max_tokens after words: the words, then the call so far",
    format: "hermes",
    text: 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
    cut: true,
    want: { content: "Sure.", calls: [{ name: "get_weather", arguments: '{"city": "Pa' }] },
  },
  {
    name: "hermes: an unclosed block that is not a call stays text when cut",
    format: "hermes",
    text: "a <tool_call> b",
    cut: true,
    want: { content: "a <tool_call> b", calls: [] },
  },
  {
    name: "generic: the whole answer is one call",
    format: "generic",
    text: '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    want: { content: null, calls: [call("get_weather", { city: "Paris" })] },
  },
  {
    name: "generic: no <|python_tag|> lead (that is Llama 3.1's, not this format's)",
    format: "generic",
    text: '<|python_tag|>{"name": "f", "arguments": {}}',
    want: { content: '<|python_tag|>{"name": "f", "arguments": {}}', calls: [] },
  },
  {
    name: "generic: no ';' list of calls (its grammar writes one)",
    format: "generic",
    text: '{"name": "a", "arguments": {}}; {"name": "b", "arguments": {}}',
    want: { content: '{"name": "a", "arguments": {}}; {"name": "b", "arguments": {}}', calls: [] },
  },
  {
    name: "generic: words are content",
    format: "generic",
    text: "It is sunny.",
    want: { content: "It is sunny.", calls: [] },
  },
  {
    name: "generic: a call cut by max_tokens is that call so far",
    format: "generic",
    text: '{"name": "f", "arguments": {"x": ',
    cut: true,
    want: { content: null, calls: [{ name: "f", arguments: '{"x": ' }] },
  },
];

for (const c of CASES) {
  Deno.test(`parseToolCalls() ${c.name}`, () => {
    assertEquals(parseToolCalls(c.text, c.format, c.cut), c.want);
  });
}

Deno.test("parseCallJson() refuses what is not one call with object arguments", () => {
  assertEquals(parseCallJson('{"name": "f"}'), { name: "f", arguments: "{}" });
  for (
    const bad of [
      '{"name": "", "arguments": {}}',
      '{"name": 3, "arguments": {}}',
      '{"name": "f", "arguments": [1]}',
      '{"name": "f", "arguments": "not json"}',
      '{"name": "f", "arguments": {}, "extra": 1}',
      "[]",
      "null",
    ]
  ) assertEquals(parseCallJson(bad), undefined, bad);
});

/** Splits `text` into pieces by a seeded sequence of lengths 1..7. */
function pieces(text: string, seed: number): string[] {
  const out: string[] = [];
  let s = seed;
  for (let at = 0; at < text.length;) {
    s = (s * 1103515245 + 12345) >>> 0;
    const n = 1 + (s >>> 16) % 7;
    out.push(text.slice(at, at + n));
    at += n;
  }
  return out;
}

Deno.test("ToolCallStream gives the whole-text parse's calls and content, however the text is cut", () => {
  for (const c of CASES) {
    for (let seed = 0; seed < 40; seed++) {
      const s = new ToolCallStream(c.format);
      let content = "";
      const calls = [];
      for (const p of [...pieces(c.text, seed), null]) {
        const got = p === null ? s.finish(c.cut) : s.push(p);
        content += got.content;
        calls.push(...got.calls);
      }
      assertEquals(calls, c.want.calls, `${c.name} (seed ${seed})`);
      assertEquals(content, c.want.content ?? "", `${c.name} (seed ${seed})`);
    }
  }
});

Deno.test("ToolCallStream sends content at once and a hermes call when its closing tag arrives", () => {
  const s = new ToolCallStream("hermes");
  assertEquals(s.push("Sure"), { content: "Sure", calls: [] });
  // Whitespace and a possible tag start wait.
  assertEquals(s.push(" <tool"), { content: "", calls: [] });
  assertEquals(s.push('_call>{"name": "f", "arguments": {}}'), { content: "", calls: [] });
  assertEquals(s.push("</tool_call>"), { content: "", calls: [call("f", {})] });
  assertEquals(s.finish(), { content: "", calls: [] });
  const j = new ToolCallStream("json");
  assertEquals(j.push("  It"), { content: "  It", calls: [] }, "words: content at once");
});
