import { dequantize } from "../../lib/model/dequantize.ts";
import { NO_EXTRA_STEPS } from "../../lib/model/architecture.ts";
import type { ModelConfig } from "../../lib/model/model_config.ts";
import type { Tensor } from "../../lib/model/tensor.ts";
import type { ModelWeights } from "../../lib/model/weights.ts";

/** One block's weights expanded to f32, row-major [outFeatures, inFeatures] for matrices. */
export interface DenseLayer {
  readonly attnNorm: Float32Array;
  readonly wq: Float32Array;
  readonly wk: Float32Array;
  readonly wv: Float32Array;
  readonly wo: Float32Array;
  readonly ffnNorm: Float32Array;
  readonly wGate: Float32Array;
  readonly wDown: Float32Array;
  readonly wUp: Float32Array;
  /** Present exactly when the model's qkvBias step is on. */
  readonly bias?: { readonly q: Float32Array; readonly k: Float32Array; readonly v: Float32Array };
  /** Present exactly when the model's qkNorm step is on. */
  readonly headNorm?: { readonly q: Float32Array; readonly k: Float32Array };
}

/** A model's weights expanded to f32 once, for the CPU reference. */
export interface DenseWeights {
  readonly tokenEmbedding: Float32Array;
  readonly layers: readonly DenseLayer[];
  readonly outputNorm: Float32Array;
  /** The same array as tokenEmbedding when the classifier is tied. */
  readonly output: Float32Array;
}

function expand(t: Tensor, shape: readonly number[]): Float32Array {
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new Error(
      `Cannot prepare CPU weights: tensor '${t.name}' has shape [${
        t.shape.join(", ")
      }], expected [${shape.join(", ")}]`,
    );
  }
  return dequantize(t);
}

/**
 * Dequantizes every tensor to f32, checking each shape against the config. A tied classifier
 * shares the embedding's array.
 *
 * ```ts
 * import { assertEquals } from "@std/assert";
 * import { loadModel } from "../../lib/model/load_model.ts";
 *
 * const model = await loadModel("stories260K-q8_0.gguf"); // Q8_0 weights
 * const dense = denseWeights(model.config, model.weights);
 * assertEquals(dense.layers.length, model.config.nLayers);
 * assertEquals(dense.tokenEmbedding.length, model.config.vocabSize * model.config.dim);
 * ```
 */
export function denseWeights(config: ModelConfig, w: ModelWeights): DenseWeights {
  const { dim, hiddenDim, nHeads, nKvHeads, headDim, vocabSize, nLayers } = config;
  if (w.layers.length !== nLayers) {
    throw new Error(
      `Cannot prepare CPU weights: config says ${nLayers} layers, weights hold ${w.layers.length}`,
    );
  }
  const qDim = nHeads * headDim;
  const kvDim = nKvHeads * headDim;
  const tokenEmbedding = expand(w.tokenEmbedding, [vocabSize, dim]);
  const steps = config.steps ?? NO_EXTRA_STEPS;
  const needed = (t: Tensor | undefined, what: string, l: number): Tensor => {
    if (!t) {
      throw new Error(
        `Cannot prepare CPU weights: the ${what} step is on but layer ${l} has no ${what} tensors`,
      );
    }
    return t;
  };
  return {
    tokenEmbedding,
    layers: w.layers.map((l, i) => ({
      attnNorm: expand(l.attnNorm, [dim]),
      wq: expand(l.wq, [qDim, dim]),
      wk: expand(l.wk, [kvDim, dim]),
      wv: expand(l.wv, [kvDim, dim]),
      wo: expand(l.wo, [dim, qDim]),
      ffnNorm: expand(l.ffnNorm, [dim]),
      wGate: expand(l.wGate, [hiddenDim, dim]),
      wDown: expand(l.wDown, [dim, hiddenDim]),
      wUp: expand(l.wUp, [hiddenDim, dim]),
      ...(steps.qkvBias
        ? {
          bias: {
            q: expand(needed(l.qBias, "qkvBias", i), [qDim]),
            k: expand(needed(l.kBias, "qkvBias", i), [kvDim]),
            v: expand(needed(l.vBias, "qkvBias", i), [kvDim]),
          },
        }
        : {}),
      ...(steps.qkNorm
        ? {
          headNorm: {
            q: expand(needed(l.qNorm, "qkNorm", i), [headDim]),
            k: expand(needed(l.kNorm, "qkNorm", i), [headDim]),
          },
        }
        : {}),
    })),
    outputNorm: expand(w.outputNorm, [dim]),
    output: w.output === w.tokenEmbedding ? tokenEmbedding : expand(w.output, [vocabSize, dim]),
  };
}
