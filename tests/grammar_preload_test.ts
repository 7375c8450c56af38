import { assert, assertEquals, assertLess, assertStringIncludes } from "@std/assert";
import { GRAMMAR_LIMITS } from "../lib/grammar/grammar_limits.ts";
import { GrammarUnavailableError } from "../lib/grammar/constraint_error.ts";
import { startGrammarInBackground } from "../lib/compose/grammar_preload.ts";
import { parseByteSize } from "../lib/util/byte_size.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { compatPath } from "./harness/compat.ts";

const MIB = 1024 * 1024;

/** The 151,936-token vocabulary the issue measured. */
const QWEN = () => ["--model", compatPath("qwen2-like-q4_k_m")];

const SCHEMA = {
  type: "object",
  properties: { name: { type: "string", maxLength: 8 } },
  required: ["name"],
  additionalProperties: false,
};

async function constrained(base: string): Promise<Response> {
  return await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      messages: [{ role: "user", content: "name?" }],
      max_tokens: 40,
      temperature: 0,
      response_format: { type: "json_schema", json_schema: { name: "n", schema: SCHEMA } },
    }),
  });
}

Deno.test("a served model starts its grammar engine after the ready summary and reports its memory: resident growth and XGrammar's heap, plausible", async () => {
  const { child, base, log, logMatch } = await spawnCpuServer(QWEN());
  try {
    const ready = await logMatch(/\n {2}memory {4}.*\n/);
    assertStringIncludes(ready[0], "grammar engine starting in the background");
    const started = await logMatch(
      /memory {4}grammar engine \+(\S+ \S+) resident \(1 worker, XGrammar heap (\S+ \S+)\), ready in ([\d.]+) s/,
    );
    // A worker holds at least its tokenizer data; the whole start stays far below the budget.
    const resident = parseByteSize(started[1]!.replace(" ", ""));
    const heap = parseByteSize(started[2]!.replace(" ", ""));
    assert(resident >= 4 * MIB, `resident growth ${started[1]}`);
    assertLess(resident, GRAMMAR_LIMITS.workerMemoryBytes);
    assert(heap >= MIB && heap <= GRAMMAR_LIMITS.workerMemoryBytes, `heap ${started[2]}`);
    assert(started.index > ready.index, "the engine is said ready after the server");
    const res = await constrained(base);
    assertEquals(res.status, 200);
    const text = (await res.json()).choices[0].message.content;
    assertEquals(Object.keys(JSON.parse(text)), ["name"]);
  } finally {
    child.kill("SIGTERM");
    await child.status;
    await log();
  }
});

Deno.test("--grammar-preload=false leaves the grammar engine to the first constrained request, which still gets its JSON", async () => {
  const { child, base, log, logMatch } = await spawnCpuServer([
    ...QWEN(),
    "--grammar-preload=false",
  ]);
  let text = "";
  try {
    const ready = await logMatch(/\n {2}memory {4}.*\n/);
    assertStringIncludes(ready[0], "grammar engine on the first constrained request");
    const res = await constrained(base);
    assertEquals(res.status, 200);
    const content = (await res.json()).choices[0].message.content;
    assertEquals(Object.keys(JSON.parse(content)), ["name"]);
  } finally {
    child.kill("SIGTERM");
    await child.status;
    text = await log();
  }
  // Read after the process exited: no background start was logged during its whole life.
  assert(!text.includes("grammar engine +"), text);
});

Deno.test("with several models, each loaded model starts its grammar engine after its load line, which says so, and the next model its own after an unload", async () => {
  const { child, base, log, logMatch } = await spawnCpuServer([
    "--max-loaded-models",
    "1",
    ...QWEN(),
    "--model",
    compatPath("llama3-like-q4_k_m"),
  ]);
  let text = "";
  try {
    const first = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "qwen2-like-q4_k_m", prompt: "a", max_tokens: 1 }),
    });
    assertEquals(first.status, 200, await first.text());
    const loaded = await logMatch(/model qwen2-like-q4_k_m loaded in .*\n/);
    assertStringIncludes(loaded[0], "grammar engine starting in the background");
    const started = await logMatch(
      /model qwen2-like-q4_k_m: grammar engine \+(\S+ \S+) resident \(1 worker, XGrammar heap (\S+ \S+)\)/,
    );
    assert(started.index > loaded.index);
    assert(parseByteSize(started[2]!.replace(" ", "")) >= MIB, started[0]);
    // Loading the other model unloads this one (--max-loaded-models 1): its workers go with it.
    const other = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "llama3-like-q4_k_m", prompt: "a", max_tokens: 1 }),
    });
    assertEquals(other.status, 200, await other.text());
    await logMatch(/model qwen2-like-q4_k_m unloaded/);
    await logMatch(/model llama3-like-q4_k_m: grammar engine \+/);
  } finally {
    child.kill("SIGTERM");
    await child.status;
    text = await log();
  }
  assert(!text.includes("could not start"), text);
});

Deno.test("a background start that fails is logged with its reason and that the next constrained request tries again", async () => {
  const line = await new Promise<string>((resolve) =>
    startGrammarInBackground(
      () => Promise.reject(new GrammarUnavailableError("XGrammar's bundle is missing")),
      resolve,
      "model m: ",
    )
  );
  assertEquals(
    line,
    "model m: grammar engine could not start in the background (XGrammar's bundle is missing); the next constrained request tries again",
  );
});
