/**
 * The backends a user may name (`--backend`, a replica's rebuild, a model's engine): the one
 * list that the flags' validation, their help and the engine factory read. `auto` times a
 * decode step on `cpu` and `webgpu` and keeps the faster; `reference` is the float64 oracle.
 */
export const BACKENDS = ["auto", "cpu", "webgpu", "reference"] as const;

export type BackendChoice = typeof BACKENDS[number];
