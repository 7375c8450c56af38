/**
 * What the grammar engine costs to start on a model's vocabulary: process RSS (/proc) around
 * building the packed vocabulary, starting the pool's first worker, and a second worker (two
 * compiles at once), with XGrammar's WebAssembly heap as each worker reports it.
 *
 *   deno run -A --v8-flags=--expose-gc bench/grammar_memory_bench.ts \
 *     [--model ../shared/models/compat/qwen2-like-q4_k_m.gguf]
 */
import { parseArgs } from "@std/cli/parse-args";
import { GrammarService } from "../lib/grammar/grammar_service.ts";
import { grammarVocabulary } from "../lib/grammar/grammar_vocabulary.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { formatBytes } from "../lib/util/byte_size.ts";

const args = parseArgs(Deno.args, {
  string: ["model"],
  default: { model: "../shared/models/compat/qwen2-like-q4_k_m.gguf" },
});

const rss = () => Deno.memoryUsage().rss;
const rows: string[] = [];
let last = rss();
let t = performance.now();
function step(what: string): void {
  (globalThis as { gc?: () => void }).gc?.();
  const now = rss();
  rows.push(
    `| ${what} | ${formatBytes(now)} | +${formatBytes(Math.max(0, now - last))} | ${
      (performance.now() - t).toFixed(0)
    } ms |`,
  );
  last = now;
  t = performance.now();
}

const model = await loadModel(args.model);
const tokenizer = new Tokenizer(model.tokenizer!);
step("model loaded");
const vocab = grammarVocabulary(tokenizer, model.config.vocabSize);
step(`packed vocabulary (${vocab.vocabSize} tokens, ${formatBytes(vocab.bytes.length)})`);
const grammars = await GrammarService.create(vocab);
step("first worker ready");
const schema = (n: number) => ({
  type: "json_schema" as const,
  schema: JSON.stringify({ type: "object", properties: { [`k${n}`]: { type: "string" } } }),
});
await Promise.all([grammars.compile(schema(1)), grammars.compile(schema(2))]);
step("second worker (two compiles at once)");
console.log(`| step | RSS | delta | time |\n|---|---|---|---|\n${rows.join("\n")}`);
console.log(`XGrammar heap per worker: ${grammars.heapBytes().map(formatBytes).join(", ")}`);
grammars.close();
