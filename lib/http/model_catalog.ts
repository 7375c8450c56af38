/**
 * The one catalog of what a front serves: the names a request may give (each model's name and
 * its aliases), the 404 of a name nobody serves, and the /v1/models entries. A server of one
 * model, a server of several and both routers answer from it.
 */
import type { Hono } from "hono";
import { ApiError, preview } from "./errors.ts";
import type { CatalogModel, ModelPhase } from "./model_directory.ts";

/** The names a request may give for a model: its own, then its aliases. */
export function namesOf(m: CatalogModel): string[] {
  return [m.name, ...(m.aliases ?? [])];
}

/**
 * The model a name stands for: a model's own name first, else the model one of whose aliases it
 * is (a model's own name wins over another's alias); undefined when none.
 */
export function findModel(
  catalog: readonly CatalogModel[],
  asked: string,
): CatalogModel | undefined {
  return catalog.find((m) => m.name === asked) ??
    catalog.find((m) => m.aliases?.includes(asked));
}

/** The 404 of a model nobody here serves (as vLLM answers), naming every name that is served. */
export function unknownModel(asked: unknown, served: readonly string[]): ApiError {
  return new ApiError(
    "model_not_found",
    `The model ${preview(asked)} does not exist; this server serves ${
      served.map((n) => `"${n}"`).join(", ")
    }`,
    "model",
  );
}

/**
 * A model's /v1/models entry under `id` (its name or an alias; `root` is the name, vLLM's
 * field). With `phase` (a front that loads models), whether it is loaded, as Ollama's
 * /api/ps says; OpenAI clients ignore what they do not know.
 */
export function modelEntry(id: string, m: CatalogModel, created: number, phase?: ModelPhase) {
  return {
    id,
    object: "model",
    created,
    owned_by: "llmserve",
    root: m.root ?? m.name,
    ...(m.contextLength === undefined ? {} : { max_model_len: m.contextLength }),
    // How its tool calls are written: its template's own syntax, or the generic format.
    ...(m.toolFormat === undefined ? {} : { tool_format: m.toolFormat }),
    ...(phase === undefined ? {} : { loaded: phase === "loaded", phase }),
    ...(m.bytes === undefined ? {} : { size_bytes: m.bytes }),
    ...(m.format === undefined ? {} : { format: m.format }),
    ...(m.architecture === undefined ? {} : { architecture: m.architecture }),
    ...(m.quantization === undefined ? {} : { quantization: m.quantization }),
  };
}

export interface ModelRoutesOptions {
  /** What is served, the default model first (read at each request). */
  readonly catalog: () => readonly CatalogModel[];
  /** Unix seconds reported as each model's `created`. */
  readonly createdAt: number;
  /** A model's phase where the front loads models (a server of several). */
  readonly phaseOf?: (name: string) => ModelPhase | undefined;
}

/** GET /v1/models and GET /v1/models/<id>: every name served, each an entry of its own. */
export function registerModelRoutes(app: Hono, o: ModelRoutesOptions): void {
  const entry = (id: string, m: CatalogModel) =>
    modelEntry(
      id,
      m,
      o.createdAt,
      o.phaseOf === undefined ? undefined : o.phaseOf(m.name) ?? "unloaded",
    );
  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: o.catalog().flatMap((m) => namesOf(m).map((id) => entry(id, m))),
    }));
  app.get("/v1/models/:model{.+}", (c) => {
    const id = c.req.param("model");
    const catalog = o.catalog();
    const m = findModel(catalog, id);
    if (m === undefined) throw unknownModel(id, catalog.flatMap(namesOf));
    return c.json(entry(id, m));
  });
}
