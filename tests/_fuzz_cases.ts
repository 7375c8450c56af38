/**
 * Generated malformed client input for the reliability tests: WebSocket frames and OpenAI
 * request bodies that are each wrong in one way (not JSON, cut short, wrong JSON type, a field
 * of the wrong type or out of range, missing or conflicting fields, unknown types, huge
 * numbers, invalid UTF-8, oversized). Every case is invalid by construction, so each must be
 * answered with an error.
 */
import { seededRandom } from "../lib/util/seeded_random.ts";

export { seededRandom as seeded };

const pick = <T>(rand: () => number, xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;

function junk(rand: () => number, n: number): string {
  const chars = '{}[]":,abcxyz0123456789 \\\n\ttruefalsenull-+.eE€😀';
  let s = "";
  for (let i = 0; i < n; i++) s += pick(rand, [...chars]);
  return s;
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** Values no field of either API accepts in place of the one it expects (per field below). */
const WS_POISON: Record<string, readonly Json[]> = {
  id: ["", 123, null, "x".repeat(129), ["a"], { a: 1 }, true],
  prompt: [5, null, {}, ["a"], true, [1, 2]],
  max_tokens: [0, -1, 1.5, "10", 1e20, 1_000_001, null, true],
  temperature: [-0.1, 2.01, "hot", 1e308, null, [1]],
  top_k: [-1, 0.5, "3", null],
  top_p: [-0.01, 1.01, "x", null],
  min_p: [2, -1, "0.1"],
  seed: [1.5, 2 ** 60, "42", -(2 ** 60), null],
  stop: [5, [1, 2], Array.from({ length: 17 }, () => "a"), { a: 1 }, null],
  priority: ["urgent", 1, "", null],
  logprobs: ["yes", 1, null],
  messages: [[], "hi", [{ role: "user" }], [{ role: "robot", content: "x" }], [{
    role: "user",
    content: 5,
  }], [{
    role: "user",
    content: "x",
    extra: 1,
  }]],
};

export interface FuzzFrame {
  readonly kind: string;
  /** Text frame, or bytes for a binary frame. */
  readonly data: string | Uint8Array;
  /** The generation id the error must carry, when the frame has a valid one. */
  readonly id?: string;
}

/** A valid generate frame, to be spoiled in exactly one way. */
function validGenerate(id: string): Record<string, Json> {
  return { type: "generate", id, prompt: "Once upon a time", max_tokens: 4, temperature: 0 };
}

/**
 * `n` malformed WebSocket frames. Valid-looking ids are unique ("f<i>"), so a frame that was
 * wrongly accepted could not be confused with another.
 */
export function malformedWsFrames(rand: () => number, n: number): FuzzFrame[] {
  const out: FuzzFrame[] = [];
  const kinds = [
    "junk",
    "truncated",
    "non-object",
    "type-missing",
    "type-wrong",
    "type-unknown",
    "field-poison",
    "field-poison",
    "field-poison",
    "unknown-field",
    "prompt-and-messages",
    "no-prompt",
    "cancel-unknown",
    "cancel-bad",
    "huge-number",
    "deep-nesting",
  ] as const;
  for (let i = 0; i < n; i++) {
    const id = `f${i}`;
    const kind = pick(rand, kinds);
    const g = validGenerate(id);
    switch (kind) {
      case "junk":
        out.push({ kind, data: `#${junk(rand, 1 + Math.floor(rand() * 40))}` });
        break;
      case "truncated": {
        const text = JSON.stringify(g);
        out.push({ kind, data: text.slice(0, 1 + Math.floor(rand() * (text.length - 1))) });
        break;
      }
      case "non-object":
        out.push({
          kind,
          data: JSON.stringify(pick(rand, [1, -3.5, "generate", [g], null, true, []] as Json[])),
        });
        break;
      case "type-missing": {
        const { type: _t, ...rest } = g;
        out.push({ kind, data: JSON.stringify(rest), id });
        break;
      }
      case "type-wrong":
        out.push({
          kind,
          data: JSON.stringify({
            ...g,
            type: pick(rand, [1, null, ["generate"], { t: 1 }, true] as Json[]),
          }),
          id,
        });
        break;
      case "type-unknown":
        out.push({
          kind,
          data: JSON.stringify({
            ...g,
            type: pick(rand, ["generat", "GENERATE", "", "cancel ", "stats", "subscribe"]),
          }),
          id,
        });
        break;
      case "field-poison": {
        const field = pick(rand, Object.keys(WS_POISON));
        const value = pick(rand, WS_POISON[field]!);
        const frame: Record<string, Json> = { ...g, [field]: value };
        if (field === "messages") delete frame.prompt;
        out.push({
          kind: `poison:${field}`,
          data: JSON.stringify(frame),
          ...(field === "id" ? {} : { id }),
        });
        break;
      }
      case "unknown-field":
        out.push({
          kind,
          data: JSON.stringify({
            ...g,
            [pick(rand, ["maxTokens", "n", "stream", "model", "foo"])]: 1,
          }),
          id,
        });
        break;
      case "prompt-and-messages":
        out.push({
          kind,
          data: JSON.stringify({ ...g, messages: [{ role: "user", content: "hi" }] }),
          id,
        });
        break;
      case "no-prompt": {
        const { prompt: _p, ...rest } = g;
        out.push({ kind, data: JSON.stringify(rest), id });
        break;
      }
      case "cancel-unknown":
        out.push({ kind, data: JSON.stringify({ type: "cancel", id }), id });
        break;
      case "cancel-bad":
        out.push({
          kind,
          data: JSON.stringify(
            pick(
              rand,
              [{ type: "cancel" }, { type: "cancel", id: 5 }, {
                type: "cancel",
                id,
                x: 1,
              }] as Json[],
            ),
          ),
        });
        break;
      case "huge-number": {
        // Numbers JSON can spell but no field accepts: infinite after parsing, or far too big.
        const [field, huge] = pick(rand, [
          ["max_tokens", "1e999"],
          ["max_tokens", "123456789012345678901234567890"],
          ["temperature", "-1e999"],
          ["temperature", "1e999"],
          ["seed", "1e400"],
        ]);
        const text = JSON.stringify({ ...g, [field]: 0 }).replace(
          `"${field}":0`,
          `"${field}":${huge}`,
        );
        out.push({ kind, data: text, id });
        break;
      }
      case "deep-nesting":
        out.push({
          kind,
          data: `{"type":"generate","id":"${id}","prompt":${"[".repeat(2000)}${"]".repeat(2000)}}`,
          id,
        });
        break;
    }
  }
  return out;
}

export interface FuzzBody {
  readonly kind: string;
  readonly path: "/v1/completions" | "/v1/chat/completions";
  readonly body: string | Uint8Array<ArrayBuffer>;
}

const COMPLETION_POISON: Record<string, readonly Json[]> = {
  prompt: [5, {}, [[1, 2], [3]], ["a", "b"], [], [-1], [1.5], null, [1, 99999]],
  max_tokens: [0, -5, "1", 1e20, 1.5],
  temperature: [3, -1, "x"],
  top_p: [2, -0.5],
  json_schema: ["{}", { type: "object", not: { required: ["a"] } }],
  grammar: [5],
  top_k: [-2, 0.5],
  n: [17, 0, 1.5],
  echo: ["yes", 1],
  best_of: [3],
  logprobs: [21, -1, 1.5],
  presence_penalty: [2.5, "x"],
  frequency_penalty: [-3],
  logit_bias: [{ "1": 200 }, { x: 1 }, { "99999": 1 }],
  repetition_penalty: [0, 3, -1],
  stream: ["yes", 1],
  stop: [5, Array.from({ length: 17 }, () => "a")],
  priority: ["now", 3],
  seed: [1.5, 2 ** 60],
  suffix: ["x"],
  model: [5, "no-such-model"],
};

const CHAT_POISON: Record<string, readonly Json[]> = {
  messages: [
    [],
    "hi",
    [{ role: "tool", content: "x" }],
    [{ role: "user" }],
    [{
      role: "user",
      content: [{ type: "image_url", image_url: { url: "x" } }],
    }],
    [{ role: "user", content: 5 }],
    null,
  ],
  tools: [[{}]],
  top_logprobs: [2, 21],
  // Malformed, or a schema keyword constrained decoding cannot enforce.
  response_format: [
    { type: "xml" },
    { type: "json_schema" },
    { type: "json_schema", json_schema: { schema: { type: "array", uniqueItems: true } } },
  ],
  max_completion_tokens: [0, "9"],
  temperature: [9],
  logprobs: ["yes"],
};

/** `n` malformed bodies for the two OpenAI endpoints (oversized ones are extra, see the test). */
export function malformedHttpBodies(rand: () => number, n: number): FuzzBody[] {
  const out: FuzzBody[] = [];
  const enc = new TextEncoder();
  for (let i = 0; i < n; i++) {
    const chat = rand() < 0.4;
    const path = chat ? "/v1/chat/completions" as const : "/v1/completions" as const;
    const valid: Record<string, Json> = chat
      ? { messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 4 }
      : { prompt: "Once upon a time", max_tokens: 4 };
    const kind = pick(
      rand,
      [
        "junk",
        "truncated",
        "empty",
        "non-object",
        "poison",
        "poison",
        "poison",
        "missing",
        "invalid-utf8",
        "too-long-prompt",
      ] as const,
    );
    switch (kind) {
      case "junk":
        out.push({ kind, path, body: `#${junk(rand, 1 + Math.floor(rand() * 60))}` });
        break;
      case "truncated": {
        const text = JSON.stringify(valid);
        out.push({ kind, path, body: text.slice(0, 1 + Math.floor(rand() * (text.length - 1))) });
        break;
      }
      case "empty":
        out.push({ kind, path, body: pick(rand, ["", "   ", "\n"]) });
        break;
      case "non-object":
        out.push({
          kind,
          path,
          body: JSON.stringify(pick(rand, [1, "x", [valid], null, true] as Json[])),
        });
        break;
      case "poison": {
        const table = chat ? CHAT_POISON : COMPLETION_POISON;
        const field = pick(rand, Object.keys(table));
        out.push({
          kind: `poison:${field}`,
          path,
          body: JSON.stringify({ ...valid, [field]: pick(rand, table[field]!) }),
        });
        break;
      }
      case "missing": {
        const { prompt: _p, messages: _m, ...rest } = valid;
        out.push({ kind, path, body: JSON.stringify(rest) });
        break;
      }
      case "invalid-utf8": {
        const text = enc.encode(JSON.stringify(valid));
        // Stray continuation bytes, an overlong encoding or a truncated sequence inside a string.
        const bad = pick(rand, [[0xff], [0xc0, 0xaf], [0xe2, 0x82], [0x80, 0x80], [
          0xed,
          0xa0,
          0x80,
        ]]);
        const at = text.indexOf(0x22, 2) + 1; // just inside the first string value
        const body = new Uint8Array(new ArrayBuffer(text.length + bad.length));
        body.set(text.subarray(0, at));
        body.set(bad, at);
        body.set(text.subarray(at), at + bad.length);
        out.push({ kind, path, body });
        break;
      }
      case "too-long-prompt":
        out.push({
          kind,
          path,
          body: JSON.stringify(
            chat
              ? { ...valid, messages: [{ role: "user", content: "the dog ran ".repeat(300) }] }
              : { ...valid, prompt: "the dog ran ".repeat(300) },
          ),
        });
        break;
    }
  }
  return out;
}
