// deno-lint-ignore no-import-prefix -- as in http_openai_client_test.ts
import OpenAI from "npm:openai@7.59.0";
import { assert, assertEquals } from "@std/assert";
import { type GgufMetadataEntry, readGgufHeader } from "../lib/model/gguf.ts";
import { ggufTokenizerData } from "../lib/model/gguf_tokenizer.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { ByteStrings } from "../lib/util/byte_strings.ts";
import { T, type WEntry, writeGguf, type WTensor } from "./_gguf_writer.ts";
import { compatPath } from "./harness/compat.ts";
import { spawnUntilListening } from "./_serve_child.ts";

/**
 * A model that decides by itself to call a tool, under `tool_choice: "auto"` and no grammar:
 * Qwen2.5's real vocabulary and template (from the qwen2-like compat file) on weights chosen by
 * hand so that greedy decoding writes one Hermes tool call. The layers add nothing (their output
 * projections are zero), so the last hidden state is the last token's embedding; embeddings are
 * orthogonal ±1 rows of a Hadamard matrix, and the classifier row of each token's successor in
 * the call text is that token's embedding: a bigram model that, after the generation prompt's
 * final "\n", writes `<tool_call>{"name":"get_forecast","arguments":{"days":3}}</tool_call>` and
 * then `<|im_end|>`. The server must parse it into `tool_calls` with finish_reason `tool_calls`,
 * streaming and not, through the official openai client.
 */

const MAIN = new URL("../main.ts", import.meta.url).pathname;
const CALL = '<tool_call>{"name":"get_forecast","arguments":{"days":3}}</tool_call>';
const DIM = 128;

function entryOf(key: string, e: GgufMetadataEntry): WEntry {
  if (e.type !== T.ARRAY) return { key, type: e.type, value: e.value };
  const v = e.value;
  const items = v instanceof ByteStrings
    ? Array.from({ length: v.length }, (_, i) => v.get(i))
    : Array.from(v as ArrayLike<unknown>);
  return { key, type: T.ARRAY, value: { elementType: e.elementType!, items } };
}

/** Row i of the DIM × DIM Sylvester-Hadamard matrix: ±1, orthogonal to every other row. */
function hadamardRow(i: number): Float32Array {
  return Float32Array.from({ length: DIM }, (_, j) => {
    let bits = i & j, parity = 0;
    while (bits) (parity ^= bits & 1, bits >>= 1);
    return parity ? -1 : 1;
  });
}

async function chosenWeightsModel(dir: string): Promise<string> {
  const src = await readGgufHeader(compatPath("qwen2-like-q4_k_m"));
  const tok = new Tokenizer(ggufTokenizerData(src.metadata, "qwen2-like")!);
  const vocab = Number(src.metadata.get("qwen2.vocab_size")?.value ?? 0) ||
    (src.metadata.get("tokenizer.ggml.tokens")!.value as string[]).length;
  // The generation prompt ends "<|im_start|>assistant\n"; its last token starts the chain.
  const start = tok.encodeTemplate("<|im_start|>assistant\n").at(-1)!;
  const chain = [start, ...tok.encodeTemplate(CALL), tok.eosId];
  const successor = new Map<number, number>();
  for (let i = 0; i + 1 < chain.length; i++) {
    const had = successor.get(chain[i]!);
    assert(had === undefined || had === chain[i + 1], `token ${chain[i]} has two successors`);
    successor.set(chain[i]!, chain[i + 1]!);
  }
  assert(successor.size < DIM, "more chain tokens than orthogonal rows");
  const embd = new Float32Array(vocab * DIM);
  const out = new Float32Array(vocab * DIM);
  [...successor].forEach(([t, next], k) => {
    const row = hadamardRow(k + 1);
    embd.set(row, t * DIM);
    // logits[next] = 0.2 × (row · row) = 25.6 after the final norm; every other logit is 0.
    for (let d = 0; d < DIM; d++) out[next * DIM + d]! += 0.2 * row[d]!;
  });
  const f32 = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const ones = f32(new Float32Array(DIM).fill(1));
  const zeros = (n: number) => f32(new Float32Array(n));
  const tensor = (name: string, dims: number[], data: Uint8Array): WTensor => ({
    name,
    dims,
    typeId: 0,
    data,
  });
  const metadata: WEntry[] = [
    { key: "general.architecture", type: T.STRING, value: "llama" },
    { key: "general.name", type: T.STRING, value: "tool-caller" },
    { key: "llama.context_length", type: T.U32, value: 2048 },
    { key: "llama.embedding_length", type: T.U32, value: DIM },
    { key: "llama.block_count", type: T.U32, value: 1 },
    { key: "llama.feed_forward_length", type: T.U32, value: DIM },
    { key: "llama.attention.head_count", type: T.U32, value: 2 },
    { key: "llama.attention.head_count_kv", type: T.U32, value: 2 },
    { key: "llama.rope.freq_base", type: T.F32, value: 10000 },
    { key: "llama.attention.layer_norm_rms_epsilon", type: T.F32, value: 1e-6 },
    ...[...src.metadata].filter(([k]) => k.startsWith("tokenizer.")).map(([k, e]) => entryOf(k, e)),
  ];
  const square = () => f32(Float32Array.from({ length: DIM * DIM }, (_, i) => Math.sin(i) * 0.1));
  const tensors: WTensor[] = [
    tensor("token_embd.weight", [DIM, vocab], f32(embd)),
    tensor("output.weight", [DIM, vocab], f32(out)),
    tensor("output_norm.weight", [DIM], ones),
    tensor("blk.0.attn_norm.weight", [DIM], ones),
    tensor("blk.0.attn_q.weight", [DIM, DIM], square()),
    tensor("blk.0.attn_k.weight", [DIM, DIM], square()),
    tensor("blk.0.attn_v.weight", [DIM, DIM], square()),
    // What the layer adds to the residual stream is zero: the embedding goes straight through.
    tensor("blk.0.attn_output.weight", [DIM, DIM], zeros(DIM * DIM)),
    tensor("blk.0.ffn_norm.weight", [DIM], ones),
    tensor("blk.0.ffn_gate.weight", [DIM, DIM], square()),
    tensor("blk.0.ffn_up.weight", [DIM, DIM], square()),
    tensor("blk.0.ffn_down.weight", [DIM, DIM], zeros(DIM * DIM)),
  ];
  const path = `${dir}/tool-caller.gguf`;
  await Deno.writeFile(path, writeGguf({ metadata, tensors }));
  return path;
}

const TOOLS = [{
  type: "function" as const,
  function: {
    name: "get_forecast",
    description: "The weather forecast for the next days",
    parameters: {
      type: "object",
      properties: { days: { type: "integer", minimum: 1, maximum: 7 } },
      required: ["days"],
    },
  },
}];

Deno.test("a model whose weights write a tool call: tool_choice auto, no grammar, parsed into tool_calls through the openai client, streaming and not", async () => {
  const dir = await Deno.makeTempDir({ prefix: "llmserve-tool-caller-" });
  try {
    const model = await chosenWeightsModel(dir);
    const server = await spawnUntilListening([
      "run",
      "--allow-all",
      MAIN,
      "serve",
      "--model",
      model,
      "--port",
      "0",
      "--backend",
      "cpu",
      "--kv-memory",
      "16MiB",
      "--max-running",
      "2",
    ]);
    try {
      const client = new OpenAI({ baseURL: server.base + "/v1", apiKey: "unused", maxRetries: 0 });
      const request = {
        model: "tool-caller",
        messages: [{ role: "user" as const, content: "Will it rain this week?" }],
        tools: TOOLS,
        tool_choice: "auto" as const,
        temperature: 0,
        max_tokens: 40,
      };
      const done = await client.chat.completions.create(request);
      const choice = done.choices[0]!;
      assertEquals(choice.finish_reason, "tool_calls");
      assertEquals(choice.message.content, null);
      const calls = choice.message.tool_calls!;
      assertEquals(calls.length, 1);
      const call = calls[0]! as { id: string; function: { name: string; arguments: string } };
      assertEquals(call.function.name, "get_forecast");
      assertEquals(JSON.parse(call.function.arguments), { days: 3 });
      assert(call.id.length > 0);

      const stream = client.chat.completions.stream(request);
      const streamed = await stream.finalChatCompletion();
      assertEquals(streamed.choices[0]!.finish_reason, "tool_calls");
      const sc = streamed.choices[0]!.message.tool_calls![0]! as typeof call;
      assertEquals(sc.function.name, "get_forecast");
      assertEquals(JSON.parse(sc.function.arguments), { days: 3 });

      // With tool_choice "none" the same weights write the same text, which stays text.
      const none = await client.chat.completions.create({ ...request, tool_choice: "none" });
      assertEquals(none.choices[0]!.finish_reason, "stop");
      assertEquals(none.choices[0]!.message.tool_calls ?? [], []);
    } finally {
      server.child.kill("SIGTERM");
      await server.child.status;
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
