/** A calibration, model and link for the planner's tests, each term a round number. */
import type { Calibration } from "../lib/cluster/plan_calibration.ts";
import type { PlanModel } from "../lib/cluster/plan_model.ts";

/**
 * A layer of 1 MB read in 1 ms at 1 row (1 GB/s) and 8 ms at 32 rows (0.25 ns per byte and
 * row): memory-bound up to 4 rows. The 2 MB classifier: 4 ms at 1 row, 64 ms at 32 (1 ns).
 */
export const CAL: Calibration = {
  how: "by hand",
  machine: "none",
  measuredAt: "",
  model: "none",
  layerBytes: 1e6,
  layerSeconds: { rows1: 1e-3, rows32: 8e-3 },
  classifierBytes: 2e6,
  classifierSeconds: { rows1: 4e-3, rows32: 64e-3 },
  transport: { how: "by hand", messageSeconds: 1e-4, byteSeconds: 1e-9 },
};

/** Two layers of 1 MB; q 2 heads of 4, one K/V head; a 2 MB classifier apart from the embedding. */
export const MODEL: PlanModel = {
  name: "tiny",
  dim: 8,
  hiddenDim: 16,
  nHeads: 2,
  nKvHeads: 1,
  headDim: 4,
  vocabSize: 10,
  layerBytes: [1e6, 1e6],
  embeddingBytes: 5e5,
  classifierBytes: 2e6,
  tiedClassifier: false,
};

/** 100 MB/s and 1 ms: a byte costs 10 ns on the wire and 1 ns in the transport. */
export const LINK = { bandwidthBytesPerSecond: 1e8, latencySeconds: 1e-3 };
