/**
 * `serve`'s settings apart from the server itself, so that the launcher (`main.ts launch
 * serve`) validates them and derives the permissions without loading the server's module
 * graph: it stays the server's parent all its life, and every module it loads is memory it
 * keeps.
 */
import type { RunNeeds } from "./permissions.ts";
import type { Config } from "./config.ts";
import { type Env, parseSettings } from "./flag_parser.ts";
import { infoText } from "./help.ts";
import { readModelsConfig } from "./models_config.ts";

/** What `--help` or `--version` print, or undefined for a run. */
export function serveInfo(argv: readonly string[]): string | undefined {
  return infoText("serve", argv);
}

/** What a server with this configuration touches, for the launcher's permissions. */
export function serveNeeds(c: Config): RunNeeds {
  const fromFile = c.modelsConfig === undefined ? [] : readModelsConfig(c.modelsConfig);
  return {
    model: c.model,
    models: [
      ...c.models,
      ...fromFile.map((e) => e.model),
      ...(c.similarCacheModel === undefined ? [] : [c.similarCacheModel]),
    ],
    ...(c.modelsConfig === undefined ? {} : { readFiles: [c.modelsConfig] }),
    tokenizer: c.tokenizer,
    modelsDir: c.modelsDir,
    host: c.host,
    nats: c.nats,
    natsCreds: c.natsCreds,
    chatTemplate: c.chatTemplate,
    batchQueue: { dataDir: c.dataDir },
  };
}

/** Parses `serve` flags into the validated configuration. Exported for tests. */
export function parseServeArgs(argv: readonly string[], env?: Env): Config {
  return parseSettings("serve", argv, env);
}
