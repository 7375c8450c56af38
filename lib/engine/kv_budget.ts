import type { ModelConfig } from "../model/model_config.ts";
import { formatBytes } from "../util/byte_size.ts";
import { DEFAULT_LIMITS } from "./limits.ts";

/** Bytes one KV block takes across all layers (K and V; f32 unless told otherwise). */
export function kvBlockBytes(config: ModelConfig, blockSize: number, bytesPerElement = 4): number {
  return 2 * config.nLayers * blockSize * config.nKvHeads * config.headDim * bytesPerElement;
}

/** Whole KV blocks a byte budget holds (f32 elements unless told otherwise). */
export function kvBlocksIn(
  bytes: number,
  config: ModelConfig,
  blockSize: number,
  bytesPerElement = 4,
): number {
  return Math.floor(bytes / kvBlockBytes(config, blockSize, bytesPerElement));
}

/** What the KV cache may use, from the flags and the machine. */
export interface KvRequest {
  readonly blockSize: number;
  /** `--kv-memory` in bytes; absent: sized from the model and the limits below. */
  readonly kvMemory?: number;
  /** Sequences that may run at once: the automatic size aims at a full context for each. */
  readonly maxRunning: number;
  /** Largest buffer one layer's K (or V) pool may be: the device's binding limit (WebGPU). */
  readonly maxPoolBytes?: number;
  /**
   * Memory free for the cache (host memory after the weights were read); the automatic size
   * takes at most a quarter, or at most UNKNOWN_MEMORY_CAP when this is unknown.
   */
  readonly availableMemory?: number;
  /** Bytes of one cached element: 4 (f32, the default) or 2 (f16). */
  readonly bytesPerElement?: number;
  /** A hard cap on the whole cache (what the CPU engine's 4 GiB WebAssembly memories leave). */
  readonly maxBytes?: number;
  /**
   * The context was asked for (`--context-length`): a `kvMemory` that cannot hold one full
   * sequence of it is an error, where otherwise the context is shortened to what it holds.
   */
  readonly contextFixed?: boolean;
  /** How many CPU engine memories the model's layers (and so the cache) are split over. */
  readonly memories?: number;
}

/**
 * Free host memory (`MemAvailable` of /proc/meminfo on Linux), or undefined without the
 * permission (`--allow-sys=systemMemoryInfo`).
 */
export function availableMemory(): number | undefined {
  try {
    return Deno.systemMemoryInfo().available;
  } catch {
    return undefined;
  }
}

/** What an automatic cache may take when the free memory is unknown. */
export const UNKNOWN_MEMORY_CAP = 1024 * 2 ** 20;

/** The KV cache to allocate, and the context length it supports. */
export interface KvPlan {
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly bytes: number;
  /** The model's context, or less when an automatic cache cannot hold one full sequence. */
  readonly contextLength: number;
  /** How the size was chosen, for the start-up summary. */
  readonly why: string;
}

/**
 * Sizes the paged KV cache. With `kvMemory` it is that budget, refused when one full-context
 * sequence does not fit or a layer's pool exceeds the device's binding limit. Without it, it is
 * a full context for each of maxRunning sequences, capped by the binding limit and by a quarter
 * of the available memory; when even one full context does not fit under those caps, the
 * context is shortened to what does (a 128k-context Llama 3 file on a small device), and the
 * plan says so.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { loadModel } from "../model/load_model.ts";
 *
 * const { config } = await loadModel("stories260K.bin"); // a 512-token context
 * const plan = planKvCache(config, { blockSize: 16, maxRunning: 64, maxPoolBytes: 128 << 20 });
 * // A full context for each of 64 sequences (64 x 512 / 16 = 2048 blocks) and the scheduler's
 * // watermark of free blocks (1%: 21), under every cap.
 * assertEquals([plan.numBlocks, plan.contextLength], [2048 + 21, 512]);
 * assertEquals(plan.why, "auto: a full context for each of 64 sequences");
 * ```
 */
export function planKvCache(config: ModelConfig, req: KvRequest): KvPlan {
  const { blockSize } = req;
  const elt = req.bytesPerElement ?? 4;
  const blockBytes = kvBlockBytes(config, blockSize, elt);
  const poolBlockBytes = blockSize * config.nKvHeads * config.headDim * elt;
  const poolCap = req.maxPoolBytes === undefined
    ? Infinity
    : Math.floor(req.maxPoolBytes / poolBlockBytes);
  const totalCap = req.maxBytes === undefined ? Infinity : Math.floor(req.maxBytes / blockBytes);
  const contextBlocks = Math.ceil(config.contextLength / blockSize);
  const plan = (numBlocks: number, contextLength: number, why: string): KvPlan => ({
    numBlocks,
    blockSize,
    bytes: numBlocks * blockBytes,
    contextLength,
    why,
  });
  if (req.kvMemory !== undefined) {
    const numBlocks = Math.floor(req.kvMemory / blockBytes);
    if (numBlocks < contextBlocks && (req.contextFixed || numBlocks === 0)) {
      throw new Error(
        `--kv-memory ${
          formatBytes(req.kvMemory)
        } holds ${numBlocks} KV blocks; one full-context sequence (${config.contextLength} tokens) needs ${contextBlocks} (${
          formatBytes(contextBlocks * blockBytes)
        }); raise it, or lower --context-length`,
      );
    }
    if (numBlocks > totalCap) {
      throw new Error(
        `--kv-memory ${formatBytes(req.kvMemory)} does not fit in the CPU engine's ${
          (req.memories ?? 1) > 1 ? `${req.memories} memories` : "memory"
        } beside the model: use at most ${formatBytes(totalCap * blockBytes)}`,
      );
    }
    if (numBlocks > poolCap) {
      throw new Error(
        `--kv-memory ${formatBytes(req.kvMemory)} needs ${
          formatBytes(numBlocks * poolBlockBytes)
        } pools per layer, above the device's binding limit of ${
          formatBytes(req.maxPoolBytes!)
        }; use at most ${formatBytes(poolCap * blockBytes)}`,
      );
    }
    if (numBlocks >= contextBlocks) return plan(numBlocks, config.contextLength, "--kv-memory");
    // As auto does: the file's context (a 40k-token Qwen3) need not fit a small cache.
    const contextLength = numBlocks * blockSize;
    return plan(
      numBlocks,
      contextLength,
      `--kv-memory; context shortened from ${config.contextLength} to ${contextLength} tokens to fit one full sequence (pass --context-length to choose, or raise --kv-memory)`,
    );
  }
  // The scheduler keeps a watermark of blocks free for running sequences to grow into.
  const watermark = (n: number) => Math.ceil(n * DEFAULT_LIMITS.watermarkFraction);
  const wanted = contextBlocks * req.maxRunning + watermark(contextBlocks * req.maxRunning);
  const memoryBudget = req.availableMemory === undefined
    ? UNKNOWN_MEMORY_CAP
    : req.availableMemory / 4;
  const memoryCap = Math.floor(memoryBudget / blockBytes);
  const numBlocks = Math.max(1, Math.min(wanted, poolCap, totalCap, memoryCap));
  const by = numBlocks === wanted
    ? `a full context for each of ${req.maxRunning} sequences`
    : numBlocks === totalCap
    ? (req.memories ?? 1) > 1
      ? `the room beside the weights in the CPU engine's ${req.memories} WebAssembly memories (4 GiB each, a layer range in each)`
      : `the CPU engine's 4 GiB WebAssembly memory`
    : numBlocks === poolCap
    ? `the device's binding limit of ${formatBytes(req.maxPoolBytes!)} per layer pool`
    : req.availableMemory === undefined
    ? `${formatBytes(UNKNOWN_MEMORY_CAP)} (free memory unknown)`
    : `a quarter of the ${formatBytes(req.availableMemory)} of free memory`;
  const usable = numBlocks - watermark(numBlocks);
  if (usable >= contextBlocks) return plan(numBlocks, config.contextLength, `auto: ${by}`);
  const contextLength = Math.max(1, usable) * blockSize;
  return plan(
    numBlocks,
    contextLength,
    `auto: ${by}; context shortened from ${config.contextLength} to ${contextLength} tokens to fit one full sequence (pass --kv-memory and --context-length to choose)`,
  );
}
