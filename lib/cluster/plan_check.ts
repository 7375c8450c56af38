/**
 * The hook the predicted-against-measured check of real runs calls: a layout run on this
 * machine, its processes talking over loopback, predicted with the shipped calibration.
 */
import { type Calibration, SHIPPED_CALIBRATION } from "./plan_calibration.ts";
import type { PlanCluster } from "./plan_hosts.ts";
import type { PlanModel } from "./plan_model.ts";
import { type Layout, type PlanOptions, type Prediction, predictLayout } from "./plan_layouts.ts";

/** `processes` processes of `threads` threads each on one machine, over loopback. */
export function loopbackCluster(
  processes: number,
  threads: number,
  memoryBytes: number,
): PlanCluster {
  return {
    hosts: Array.from({ length: processes }, (_, i) => ({
      name: `process ${i + 1}`,
      memoryBytes,
      threads,
      speed: 1,
    })),
    link: { bandwidthBytesPerSecond: Infinity, latencySeconds: 0 },
  };
}

/**
 * What `layout` is predicted to do here with `threads` threads per process: its tokens/s at 1
 * and at `o.sequences` sequences, to set beside a bench's measured ones.
 */
export function predictHere(
  model: PlanModel,
  layout: Layout,
  threads: number,
  o: PlanOptions,
  cal: Calibration = SHIPPED_CALIBRATION,
): Prediction | { refused: string } {
  const processes = layout.tp * layout.pp * layout.dp;
  // Memory is not what such a check is about: the machine holds every process.
  return predictLayout(model, loopbackCluster(processes, threads, Infinity), cal, layout, o);
}
