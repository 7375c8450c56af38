/**
 * The kinds of value a setting takes, as zod schemas that read the text a flag, a variable or
 * a `--models-config` entry holds. Their messages name no setting: the parser prefixes the
 * flag or the variable the value came from, and the value received.
 */
import { z } from "zod";
import { parseByteSize } from "../util/byte_size.ts";
import { parseKeepAlive } from "../util/duration.ts";

/**
 * A number read from text. z.coerce alone reads an empty text as 0, so `--port` given without
 * a value would listen on a random port and `--temperature` alone would sample greedily: an
 * empty text is no number here.
 */
function fromText<T extends z.ZodType>(schema: T) {
  return z.preprocess((v) => typeof v === "string" && v.trim() === "" ? Number.NaN : v, schema);
}

const number = (error = "must be a number") => z.coerce.number({ error });

/** A whole number above 0, at most `max` where given. */
export function positiveInt(max?: number) {
  const n = number().int("must be an integer").positive("must be positive");
  return fromText(max === undefined ? n : n.max(max, `must be at most ${max}`));
}

/** A number in [min, max]; `above` makes the lower bound exclusive. */
export function numberIn(min: number, max: number, above = false) {
  const n = number();
  const low = above ? n.gt(min, `must be above ${min}`) : n.min(min, `must be at least ${min}`);
  return fromText(max === Infinity ? low : low.max(max, `must be at most ${max}`));
}

/** A whole number in [min, max]. */
export function intIn(min: number, max: number) {
  return fromText(
    number().int("must be an integer").min(min, `must be ${min} to ${max}`).max(
      max,
      `must be ${min} to ${max}`,
    ),
  );
}

/** A number of seconds, 0 or more. */
export const secondsOrZero = () =>
  fromText(number("must be a number").nonnegative("must be 0 or more seconds"));

/** A TCP port; 0 picks a free one. */
export const port = () => intIn(0, 65535);

/** A switch: the flag alone (true), or a variable set to true, false, 1 or 0. */
export function toggle() {
  return z.union([
    z.boolean(),
    z.enum(["true", "false", "1", "0"], { error: "expected true, false, 1 or 0" }).transform((v) =>
      v === "true" || v === "1"
    ),
  ]);
}

/** A positive number of seconds. */
export const seconds = () =>
  fromText(number("must be a number of seconds").positive("must be positive"));

/** A byte size such as 64MiB, 1.5GB or 1048576. */
export function byteSize() {
  return z.string().transform((s, ctx) => toBytes(s, ctx));
}

/** A byte size, or `auto` (undefined: the server sizes it). */
export function byteSizeOrAuto() {
  return z.string().transform((s, ctx) =>
    s.trim().toLowerCase() === "auto" ? undefined : toBytes(s, ctx)
  );
}

/** A duration (30s, 5m, 1h, a number of seconds; negative: forever), in milliseconds. */
export function duration() {
  return z.string().transform((s, ctx) => {
    const ms = parseKeepAlive(s);
    if (typeof ms === "number") return ms;
    ctx.addIssue({ code: "custom", message: ms });
    return z.NEVER;
  });
}

/** A non-empty text. */
export const text = () => z.string().min(1, "cannot be empty");

function toBytes(s: string, ctx: z.RefinementCtx): number {
  try {
    return parseByteSize(s);
  } catch (e) {
    ctx.addIssue({ code: "custom", message: (e as Error).message });
    return z.NEVER;
  }
}
