import { z } from "zod";
import { type F32Bounds, f32Problem } from "./f32_problem.ts";

/**
 * A zod number within `b` both as a double and as the f32 the engine computes with; the value
 * is passed on unchanged. Every float sampling field of every request shape (HTTP bodies,
 * batch lines, WebSocket frames, the cluster's NATS messages) is one of these.
 */
export function f32Number(b: F32Bounds = {}) {
  let s = z.number();
  if (b.gt !== undefined) s = s.gt(b.gt);
  if (b.min !== undefined) s = s.min(b.min);
  if (b.max !== undefined) s = s.max(b.max);
  return s.superRefine((v, ctx) => {
    const problem = f32Problem(v, b);
    if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
  });
}
