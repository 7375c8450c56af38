import type { z } from "zod";
import { ApiError, preview } from "./errors.ts";

/** `messages[0].role` from zod's path ["messages", 0, "role"] (OpenAI's `param` spelling). */
export function paramPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const key of path) {
    if (typeof key === "number") out += `[${key}]`;
    else out += out.length === 0 ? String(key) : `.${String(key)}`;
  }
  return out;
}

function valueAt(root: unknown, path: readonly PropertyKey[]): unknown {
  let v: unknown = root;
  for (const key of path) {
    if (v === null || typeof v !== "object") return undefined;
    v = (v as Record<PropertyKey, unknown>)[key];
  }
  return v;
}

/** A zod issue's message as a 400 quotes it: "Invalid input: " dropped, lower-case first. */
export function issueReason(message: string): string {
  const reason = message.replace(/^Invalid input: /, "");
  return `${reason[0]?.toLowerCase() ?? ""}${reason.slice(1)}`;
}

/**
 * Parses `data` with `schema`, or throws a 400 naming the first offending field and the value
 * received, e.g. "Invalid 'temperature': too big: expected number to be <=2; got 5".
 */
export function parseWith<S extends z.ZodType>(schema: S, data: unknown): z.output<S> {
  const result = schema.safeParse(data);
  if (result.success) return result.data;
  const issue = result.error.issues[0];
  if (issue === undefined) throw new ApiError("invalid_request", "Invalid request");
  if (issue.code === "unrecognized_keys") {
    const keys = issue.keys;
    const where = paramPath(issue.path);
    const param = where.length > 0 ? `${where}.${keys[0]}` : String(keys[0]);
    throw new ApiError(
      "invalid_request",
      `Unknown field${keys.length > 1 ? "s" : ""} ${keys.map((k) => `'${k}'`).join(", ")}` +
        (where.length > 0 ? ` in '${where}'` : ""),
      param,
    );
  }
  const param = paramPath(issue.path);
  const received = valueAt(data, issue.path);
  // "got undefined" reads like a value the client sent: say the field is missing instead.
  if (issue.code === "invalid_type" && received === undefined && param.length > 0) {
    throw new ApiError(
      "invalid_request",
      `Missing required field '${param}' (expected ${issue.expected})`,
      param,
    );
  }
  const what = param.length > 0 ? `'${param}'` : "request";
  throw new ApiError(
    "invalid_request",
    `Invalid ${what}: ${issueReason(issue.message)}; got ${preview(received)}`,
    param.length > 0 ? param : null,
  );
}
