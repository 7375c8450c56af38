/** Where the CPU engine placed a layer's weights, as its step programs address them. */

/** A matrix as the kernels read it: its type code, address and shape. */
export interface Matrix {
  readonly type: number;
  readonly ptr: number;
  readonly rows: number;
  readonly cols: number;
}

export interface LayerPtrs {
  readonly attnNorm: number;
  readonly ffnNorm: number;
  readonly wq: Matrix;
  readonly wk: Matrix;
  readonly wv: Matrix;
  readonly wo: Matrix;
  readonly wGate: Matrix;
  readonly wUp: Matrix;
  readonly wDown: Matrix;
  readonly qBias: number;
  readonly kBias: number;
  readonly vBias: number;
  readonly qNorm: number;
  readonly kNorm: number;
}
