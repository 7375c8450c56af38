import { hash32 } from "../util/rng.ts";
import type { BatchEndpoint, BatchLine, BatchValidationError } from "./batch_types.ts";

/** The request lines of a JSONL file: every non-blank line (a trailing newline is optional). */
export function splitLines(text: string): { text: string; number: number }[] {
  const out: { text: string; number: number }[] = [];
  const rows = text.split("\n");
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i]!.replace(/\r$/, "");
    if (row.trim() !== "") out.push({ text: row, number: i + 1 });
  }
  return out;
}

function problem(code: string, message: string, line: number, param: string | null = null) {
  return { code, message, param, line };
}

/**
 * Reads an input file into request lines, checking what OpenAI checks when it validates a
 * batch: each line a JSON object with a unique string `custom_id`, `method` POST, the batch's
 * `url`, and a `body` object. Any problem fails the whole batch (the list names each line, up
 * to 20). What a body asks for is not checked here: a bad body gets, when its line runs, the
 * error the same HTTP request would get, and the batch goes on.
 */
export function parseBatchLines(
  text: string,
  endpoint: BatchEndpoint,
): { lines: BatchLine[]; errors: BatchValidationError[] } {
  const lines: BatchLine[] = [];
  const errors: BatchValidationError[] = [];
  const ids = new Map<string, number>();
  const rows = splitLines(text);
  if (rows.length === 0) {
    errors.push({
      code: "empty_file",
      message: "The input file has no request lines",
      param: null,
      line: null,
    });
  }
  for (const { text: row, number } of rows) {
    if (errors.length >= 20) break;
    let v: unknown;
    try {
      v = JSON.parse(row);
    } catch (e) {
      errors.push(
        problem(
          "invalid_json_line",
          `Line ${number} is not valid JSON: ${(e as Error).message}`,
          number,
        ),
      );
      continue;
    }
    if (v === null || typeof v !== "object" || Array.isArray(v)) {
      errors.push(problem("invalid_json_line", `Line ${number} is not a JSON object`, number));
      continue;
    }
    const o = v as Record<string, unknown>;
    const unknown = Object.keys(o).filter((k) =>
      !["custom_id", "method", "url", "body"].includes(k)
    );
    if (unknown.length > 0) {
      errors.push(
        problem(
          "invalid_request",
          `Line ${number} has unknown field(s) ${
            unknown.map((k) => `'${k}'`).join(", ")
          }; a line has custom_id, method, url and body`,
          number,
          unknown[0]!,
        ),
      );
      continue;
    }
    if (typeof o.custom_id !== "string" || o.custom_id.length === 0 || o.custom_id.length > 512) {
      errors.push(
        problem(
          "missing_custom_id",
          `Line ${number}: 'custom_id' must be a string of 1 to 512 characters; got ${
            JSON.stringify(o.custom_id)?.slice(0, 60)
          }`,
          number,
          "custom_id",
        ),
      );
      continue;
    }
    const earlier = ids.get(o.custom_id);
    if (earlier !== undefined) {
      errors.push(
        problem(
          "duplicate_custom_id",
          `Line ${number}: custom_id ${
            JSON.stringify(o.custom_id)
          } is already used on line ${earlier}; each line needs its own`,
          number,
          "custom_id",
        ),
      );
      continue;
    }
    ids.set(o.custom_id, number);
    if (o.method !== "POST") {
      errors.push(
        problem(
          "invalid_method",
          `Line ${number}: 'method' must be "POST"; got ${JSON.stringify(o.method)}`,
          number,
          "method",
        ),
      );
      continue;
    }
    if (o.url !== endpoint) {
      errors.push(
        problem(
          "mismatched_url",
          `Line ${number}: 'url' must be the batch's endpoint "${endpoint}"; got ${
            JSON.stringify(o.url)
          }`,
          number,
          "url",
        ),
      );
      continue;
    }
    if (o.body === null || typeof o.body !== "object" || Array.isArray(o.body)) {
      errors.push(
        problem(
          "invalid_body",
          `Line ${number}: 'body' must be a JSON object (the request); got ${
            JSON.stringify(o.body)?.slice(0, 60)
          }`,
          number,
          "body",
        ),
      );
      continue;
    }
    lines.push({
      index: lines.length,
      customId: o.custom_id,
      body: o.body as Record<string, unknown>,
    });
  }
  return { lines, errors };
}

/**
 * The seed of a line that gives none: a function of the batch id and the line's index only,
 * so the line draws the same tokens when a restarted server runs it again.
 */
export function derivedSeed(batchId: string, index: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < batchId.length; i++) {
    h = Math.imul(h ^ batchId.charCodeAt(i), 0x01000193) >>> 0;
  }
  return hash32(h, index);
}
