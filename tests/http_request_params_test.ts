/**
 * The one parameter table (lib/http/request_params.ts) against every layer that spells its
 * parameters: for each row, the values at its limits and just past them go through HTTP (both
 * endpoints), the WebSocket, a Batch line and the NATS decoder, and every layer accepts or
 * refuses each alike, a refusal with the text the row's own schema gives. The limits are read
 * from the table, so a layer that kept a limit of its own fails here.
 */
import { assert, assertEquals, assertStringIncludes } from "@std/assert";
import { BatchQueue } from "../lib/batch/batch_queue.ts";
import { decodeMessage, encodeMessage, ReplicaRequest } from "../lib/cluster/messages.ts";
import { parseGenerateArgs } from "../lib/cli/generate.ts";
import {
  type Limits,
  PARAM_FIELDS,
  type ParamName,
  type ParamRow,
  PARAMS,
} from "../lib/http/request_params.ts";
import { issueReason } from "../lib/http/validation.ts";
import { pageCells, parameterCells, PARAMETERS_DOC } from "../.ci/parameters_doc.ts";
import { postJson, startService, TestSocket } from "./_http_harness.ts";

interface Case {
  readonly name: ParamName;
  readonly value: unknown;
  /** What the row's schema says: accepted, or the issue message it refuses with. */
  readonly refusal: string | undefined;
}

/** The values at a row's limits and one step past each, from the row alone. */
function boundaries(limits: Limits): unknown[] {
  const around = (l: { kind: "int" | "float"; min?: number; max?: number }) => {
    const step = l.kind === "int" ? 1 : 1e-3;
    const out: number[] = [];
    if (l.min !== undefined) out.push(l.min, l.min - step);
    if (l.max !== undefined) out.push(l.max, l.max + step);
    return out;
  };
  switch (limits.kind) {
    case "int":
    case "float":
      return around(limits);
    case "bool":
      return [true, false, 1];
    case "enum":
      return [...limits.values, "urgent"];
    case "strings":
      return [[], Array(limits.maxItems).fill("zz"), Array(limits.maxItems + 1).fill("zz")];
    case "ids":
      return [[], Array(limits.maxItems).fill(3), Array(limits.maxItems + 1).fill(3)];
    case "bias":
      return around(limits.values).map((v) => ({ "5": v }));
  }
}

function cases(): Case[] {
  const out: Case[] = [];
  for (const name of Object.keys(PARAMS) as ParamName[]) {
    for (const value of boundaries(PARAMS[name].limits)) {
      const r = PARAM_FIELDS[name].safeParse(value);
      out.push({ name, value, refusal: r.success ? undefined : r.error.issues[0]!.message });
    }
  }
  return out;
}

/** The fields a case adds to a request: logprobs on where top_logprobs needs it. */
function chatFields(c: Case): Record<string, unknown> {
  if (c.name === "top_logprobs") return { logprobs: true, top_logprobs: c.value };
  return { [c.name]: c.value };
}
function completionFields(c: Case): Record<string, unknown> | undefined {
  // /v1/completions spells top_logprobs `logprobs` (an integer), and has no boolean one.
  if (c.name === "top_logprobs") return { logprobs: c.value };
  if (c.name === "logprobs") return undefined;
  return { [c.name]: c.value };
}

/**
 * A row's other OpenAI spellings, read from its own wire column, with the endpoints that take
 * each ("(chat)": the chat endpoint only). top_logprobs and logprobs are spelled per endpoint by
 * chatFields/completionFields; n_predict is left out, as its -1 ("up to the context") makes it a
 * union with its own message.
 */
function openAiAliases(name: ParamName): { field: string; paths: string[] }[] {
  if (name === "top_logprobs" || name === "logprobs") return [];
  const row: ParamRow = PARAMS[name];
  return row.openai.map((s) => ({ s, field: s.split(" ")[0]! }))
    .filter(({ field }) => field !== name && field !== "n_predict")
    .map(({ s, field }) => ({
      field,
      paths: s.includes("(chat")
        ? ["chat/completions"]
        : s.includes("(completions")
        ? ["completions"]
        : ["chat/completions", "completions"],
    }));
}

/** A row's other WebSocket spellings (its ws column lists them). */
function wsAliases(name: ParamName): string[] {
  const row: ParamRow = PARAMS[name];
  return row.ws?.split(", ").filter((f) => f !== name) ?? [];
}

const label = (c: Case) => `${c.name} = ${JSON.stringify(c.value)?.slice(0, 40)}`;

function expectAnswer(where: string, c: Case, status: number, message: string | undefined) {
  if (c.refusal === undefined) {
    assertEquals(status, 200, `${where}: ${label(c)} should be accepted: ${message}`);
  } else {
    assertEquals(status, 400, `${where}: ${label(c)} should be refused`);
    assertStringIncludes(message ?? "", issueReason(c.refusal), `${where}: ${label(c)}`);
  }
}

Deno.test("every row's limits and just past them: accepted or refused alike, with the same text, by HTTP, the WebSocket, a Batch line and the NATS decoder", async () => {
  const all = cases();
  // The table itself must say something: each row has a value accepted and one refused.
  for (const name of Object.keys(PARAMS) as ParamName[]) {
    const mine = all.filter((c) => c.name === name);
    assert(mine.some((c) => c.refusal === undefined), `${name}: no accepted boundary`);
    assert(mine.some((c) => c.refusal !== undefined), `${name}: no refused boundary`);
  }
  const dataDir = await Deno.makeTempDir({ prefix: "request_params_test_" });
  const batches = new BatchQueue({
    dataDir,
    maxInFlight: 4,
    maxFileBytes: 1 << 20,
    maxLines: 1000,
    maxActive: 4,
    maxUploads: 2,
    maxUploadsPerKey: 2,
    maxStorageBytes: 1 << 26,
    maxFiles: 100,
    retentionMs: Infinity,
  });
  try {
    await using svc = await startService({}, { extend: batches.attach });
    const base = { max_tokens: 2, temperature: 0 };
    const batchLines: string[] = [];
    for (const [i, c] of all.entries()) {
      const chat = { ...base, messages: [{ role: "user", content: "hi" }], ...chatFields(c) };
      const fields = completionFields(c);
      const completion = fields && { ...base, prompt: "hi", ...fields };
      for (const [path, body] of [["chat/completions", chat], ["completions", completion]]) {
        if (body === undefined) continue;
        const res = await postJson(`${svc.base}/v1/${path}`, body);
        const json = await res.json();
        expectAnswer(`/v1/${path}`, c, res.status, json.error?.message);
      }
      for (const { field, paths } of openAiAliases(c.name)) {
        for (const path of paths) {
          const body = path === "completions"
            ? { ...base, prompt: "hi", [field]: c.value }
            : { ...base, messages: [{ role: "user", content: "hi" }], [field]: c.value };
          const res = await postJson(`${svc.base}/v1/${path}`, body);
          const json = await res.json();
          expectAnswer(`/v1/${path} as ${field}`, c, res.status, json.error?.message);
        }
      }
      batchLines.push(JSON.stringify({
        custom_id: `case-${i}`,
        method: "POST",
        url: "/v1/chat/completions",
        body: chat,
      }));
    }

    const ws = await TestSocket.open(svc.wsUrl);
    for (const [i, c] of all.entries()) {
      const row: ParamRow = PARAMS[c.name];
      if (row.ws === null) continue;
      ws.send({ type: "generate", id: `g${i}`, prompt: "hi", ...base, ...chatFields(c) });
      const end = (await ws.collect(`g${i}`)).at(-1)!;
      const refused = end.type === "error";
      expectAnswer("WebSocket", c, refused ? 400 : 200, end.message as string | undefined);
      for (const field of wsAliases(c.name)) {
        ws.send({ type: "generate", id: `a${i}`, prompt: "hi", ...base, [field]: c.value });
        const end = (await ws.collect(`a${i}`)).at(-1)!;
        const refused = end.type === "error";
        expectAnswer(`WebSocket as ${field}`, c, refused ? 400 : 200, end.message as string);
      }
    }
    await ws.close();

    // One batch of every case; each line's answer is the HTTP one.
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", new File([batchLines.join("\n")], "cases.jsonl"));
    const file = await (await fetch(`${svc.base}/v1/files`, { method: "POST", body: form }))
      .json();
    let batch = await (await postJson(`${svc.base}/v1/batches`, {
      input_file_id: file.id,
      endpoint: "/v1/chat/completions",
      completion_window: "24h",
    })).json();
    const deadline = performance.now() + 30_000;
    while (batch.status !== "completed") {
      assert(performance.now() < deadline, `the batch did not finish: ${JSON.stringify(batch)}`);
      await new Promise((r) => setTimeout(r, 20));
      batch = await (await fetch(`${svc.base}/v1/batches/${batch.id}`)).json();
    }
    const answers = new Map<string, { status_code: number; body: any }>();
    for (const fileId of [batch.output_file_id, batch.error_file_id]) {
      if (fileId === null || fileId === undefined) continue;
      const text = await (await fetch(`${svc.base}/v1/files/${fileId}/content`)).text();
      for (const line of text.split("\n").filter((l) => l !== "")) {
        const o = JSON.parse(line);
        answers.set(o.custom_id, o.response);
      }
    }
    for (const [i, c] of all.entries()) {
      const a = answers.get(`case-${i}`);
      if (a === undefined) throw new Error(`Batch line: ${label(c)} has no answer`);
      expectAnswer("Batch line", c, a.status_code, a.body?.error?.message);
    }
  } finally {
    await batches.close();
    await Deno.remove(dataDir, { recursive: true });
  }

  // The NATS decoder: the router's generate message with the case's value at the row's path.
  for (const c of all) {
    const row: ParamRow = PARAMS[c.name];
    if (row.nats === null || row.natsAs !== undefined) continue;
    const message: Record<string, any> = {
      type: "generate",
      stream: "s",
      replyTo: "r",
      prompt: [1, 2],
      maxTokens: 2,
      sampling: { temperature: 0, topK: 0, topP: 1, minP: 0, seed: 0 },
      stop: [],
      priority: "interactive",
      requestId: "x",
      logprobs: c.name === "top_logprobs",
      credit: 8,
    };
    const path = row.nats.split(".");
    let at = message;
    for (const key of path.slice(0, -1)) at = at[key] ??= {};
    at[path.at(-1)!] = c.value;
    const got = decodeMessage(ReplicaRequest, encodeMessage(message));
    if (c.refusal === undefined) {
      assert(got.ok, `NATS: ${label(c)} should be accepted: ${!got.ok && got.error}`);
    } else {
      if (got.ok) throw new Error(`NATS: ${label(c)} should be refused`);
      assertStringIncludes(got.error, `${row.nats}: ${c.refusal}`, `NATS: ${label(c)}`);
    }
  }
});

Deno.test("the generate command's sampling flags take the table's limits and defaults", () => {
  const flags = Object.entries(PARAMS).filter(([, r]) => r.cli !== null) as [
    ParamName,
    ParamRow,
  ][];
  assert(flags.length >= 5);
  const defaults = parseGenerateArgs(["--prompt", "x"]);
  assert(!("error" in defaults), JSON.stringify(defaults));
  for (const [name, row] of flags) {
    const flag = row.cli!.split(",")[0]!.trim();
    // The settings table's name of the flag: --max-tokens is maxTokens.
    const key = flag.slice(2).replace(/-(.)/g, (_, ch: string) => ch.toUpperCase()) as
      & keyof typeof defaults
      & ("maxTokens" | "temperature" | "topK" | "topP" | "minP" | "seed");
    if (row.default !== undefined) assertEquals(defaults[key], row.default, flag);
    for (const value of boundaries(row.limits)) {
      const r = PARAM_FIELDS[name].safeParse(value);
      const got = parseGenerateArgs(["--prompt", "x", flag, String(value)]);
      if (r.success) {
        assert(!("error" in got), `${flag} ${value}: ${"error" in got && got.error}`);
        assertEquals(got[key], value, `${flag} ${value}`);
      } else {
        if (!("error" in got)) throw new Error(`${flag} ${value} should be refused`);
        assertStringIncludes(got.error, `${flag}: ${r.error.issues[0]!.message}`);
      }
    }
  }
});

Deno.test("docs/parameters.md shows every row of the table, with its spellings, limits and default", async () => {
  const page = await Deno.readTextFile(new URL(`../${PARAMETERS_DOC}`, import.meta.url));
  assertEquals(
    pageCells(page),
    parameterCells(),
    `${PARAMETERS_DOC} is out of date: deno run --allow-read --allow-write=docs --allow-run .ci/parameters_doc.ts`,
  );
  // The page's cells come from the table's own limits: a row's refused boundary value is
  // outside the range the page states for it.
  for (const [i, name] of (Object.keys(PARAMS) as ParamName[]).entries()) {
    const limits: Limits = PARAMS[name].limits;
    if (limits.kind !== "int" && limits.kind !== "float") continue;
    const values = pageCells(page)[i]![5]!;
    if (limits.min !== undefined) assertStringIncludes(values, String(limits.min), name);
    if (limits.max !== undefined) assertStringIncludes(values, String(limits.max), name);
  }
});
