import type { ModelConfig } from "../model/model_config.ts";

/** Bytes one KV block takes across all layers (K and V, f32). */
export function kvBlockBytes(config: ModelConfig, blockSize: number): number {
  return 2 * config.nLayers * blockSize * config.nKvHeads * config.headDim * 4;
}

/** Whole KV blocks a byte budget holds. */
export function kvBlocksIn(bytes: number, config: ModelConfig, blockSize: number): number {
  return Math.floor(bytes / kvBlockBytes(config, blockSize));
}
