/**
 * A server of several models with `--served-model-name alias=model` and the batch routes:
 * the alias replaces the file's name everywhere; each batch line runs on the model its body
 * names (loaded on demand), its answer equal to `generate`'s for that file; a line naming no
 * model gets the default one, an unknown one the 404 an HTTP request gets.
 */
import { assertEquals, assertStringIncludes } from "@std/assert";
import { compatPath, generateAlone as generateCompat } from "./harness/compat.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { until } from "./_cluster.ts";

const A = "stories260K-q4_1";
const C = "tinyllama-like-q4_0";
const ALIAS = "story";
const PROMPT = "Once upon a time";
const N = 12;

const generateAlone = (stem: string) => generateCompat(stem, PROMPT, N);

Deno.test("several models: aliases, and a batch whose lines name their models", async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "serve_models_batch_" });
  const [oracleA, oracleC, server] = await Promise.all([
    generateAlone(A),
    generateAlone(C),
    spawnCpuServer([
      "--model",
      compatPath(A),
      "--model",
      compatPath(C),
      "--served-model-name",
      `${ALIAS}=${A}`,
      "--data-dir",
      dir,
    ]),
  ]);
  const base = server.base;
  const complete = async (model: string) => {
    const res = await fetch(`${base}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: PROMPT, max_tokens: N, temperature: 0 }),
    });
    return { status: res.status, body: await res.json() };
  };
  try {
    await t.step("the alias replaces the file's name", async () => {
      const list = await (await fetch(`${base}/v1/models`)).json();
      assertEquals(list.data.map((m: { id: string }) => m.id), [ALIAS, C]);
      const r = await complete(ALIAS);
      assertEquals(r.status, 200, JSON.stringify(r.body));
      assertEquals(r.body.model, ALIAS);
      assertEquals(r.body.choices[0].text, oracleA);
      const old = await complete(A);
      assertEquals(old.status, 404);
      assertStringIncludes(old.body.error.message, `"${ALIAS}", "${C}"`);
      const h = await (await fetch(`${base}/health`)).json();
      assertEquals(Object.keys(h.models), [ALIAS, C]);
    });

    await t.step("each batch line runs on the model it names", async () => {
      const line = (id: string, model?: string) =>
        JSON.stringify({
          custom_id: id,
          method: "POST",
          url: "/v1/completions",
          body: {
            ...(model === undefined ? {} : { model }),
            prompt: PROMPT,
            max_tokens: N,
            temperature: 0,
          },
        });
      const jsonl =
        [line("a", ALIAS), line("c", C), line("unknown", "nope"), line("default")].join("\n") +
        "\n";
      const form = new FormData();
      form.append("purpose", "batch");
      form.append("file", new Blob([jsonl]), "requests.jsonl");
      const file = await (await fetch(`${base}/v1/files`, { method: "POST", body: form })).json();
      assertEquals(file.purpose, "batch");
      const created = await fetch(`${base}/v1/batches`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          input_file_id: file.id,
          endpoint: "/v1/completions",
          completion_window: "24h",
        }),
      });
      assertEquals(created.status, 200);
      const id = (await created.json()).id as string;
      let batch: Record<string, unknown> = {};
      await until("the batch to finish", async () => {
        batch = await (await fetch(`${base}/v1/batches/${id}`)).json();
        return ["completed", "failed"].includes(batch.status as string);
      }, 120_000);
      assertEquals(batch.status, "completed", JSON.stringify(batch));
      assertEquals(batch.request_counts, { total: 4, completed: 3, failed: 1 });
      const rows = async (fileId: unknown) =>
        Object.fromEntries(
          (await (await fetch(`${base}/v1/files/${fileId}/content`)).text()).trim().split("\n")
            .map((l) => JSON.parse(l)).map((r) => [r.custom_id, r.response]),
        );
      const out = await rows(batch.output_file_id);
      assertEquals(out.a.body.model, ALIAS);
      assertEquals(out.a.body.choices[0].text, oracleA);
      assertEquals(out.c.body.model, C);
      assertEquals(out.c.body.choices[0].text, oracleC);
      assertEquals(out.default.body.model, ALIAS, "a line naming no model gets the first");
      assertEquals(out.default.body.choices[0].text, oracleA);
      const errors = await rows(batch.error_file_id);
      assertEquals(errors.unknown.status_code, 404);
      assertEquals(errors.unknown.body.error.code, "model_not_found");
      assertStringIncludes(errors.unknown.body.error.message, `"${ALIAS}", "${C}"`);
    });
  } finally {
    server.child.kill("SIGTERM");
    await server.child.status;
    await Deno.remove(dir, { recursive: true });
  }
});
