/**
 * What the planner's cost model knows of this machine: how long one layer of a real model
 * takes on one thread of the CPU engine at 1 and at 32 rows, and what one message and one byte
 * cost on loopback NATS. `deno task plan --calibrate` measures it (lib/cli/plan_calibrate.ts);
 * plan_calibration.json beside this file is the one shipped, measured on the development
 * machine, with how it was measured in its `how` fields.
 */
import { z } from "zod";
import shipped from "./plan_calibration.json" with { type: "json" };

/** Where `--calibrate` writes when `--calibration` names no file. */
export const CALIBRATION_OUT = "plan-calibration.json";

const seconds = z.number().positive("must be a positive number of seconds");

export const CALIBRATION_SCHEMA = z.object({
  how: z.string(),
  machine: z.string(),
  measuredAt: z.string(),
  /** The file whose layers were timed. */
  model: z.string(),
  /** Weight bytes of one of its layers (their mean). */
  layerBytes: z.number().positive(),
  /** One layer's share of a decode step without the classifier, on one thread. */
  layerSeconds: z.object({ rows1: seconds, rows32: seconds }),
  classifierBytes: z.number().positive(),
  classifierSeconds: z.object({ rows1: seconds, rows32: seconds }),
  transport: z.object({
    how: z.string(),
    /** What one message costs besides its bytes (both ends' software, one way). */
    messageSeconds: seconds,
    /** What one more byte of a message costs (copies, framing), one way. */
    byteSeconds: seconds,
  }),
});

export type Calibration = z.infer<typeof CALIBRATION_SCHEMA>;

/** Validates a calibration's JSON, naming the file and the field on a problem. */
export function parseCalibration(json: unknown, source: string): Calibration {
  const r = CALIBRATION_SCHEMA.safeParse(json);
  if (r.success) return r.data;
  const lines = r.error.issues.map((i) =>
    `${i.path.join(".") || "(the whole file)"}: ${i.message}`
  );
  throw new Error(`Calibration ${source} is invalid:\n  ${lines.join("\n  ")}`);
}

/** The calibration shipped with the project (plan_calibration.json). */
export const SHIPPED_CALIBRATION: Calibration = parseCalibration(
  shipped,
  "lib/cluster/plan_calibration.json",
);
