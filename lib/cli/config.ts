import { z } from "zod";
import { parseByteSize } from "../util/byte_size.ts";

/**
 * Every setting of the server and the CLI, with the environment variable that can also set
 * it. Command-line flags win over the environment, which wins over the defaults.
 */
export const SETTINGS = {
  model: { env: "LLMSERVE_MODEL", help: "model path, https:// URL or known name" },
  tokenizer: { env: "LLMSERVE_TOKENIZER", help: "llama2.c tokenizer.bin for a .bin checkpoint" },
  modelsDir: { env: "MODELS_DIR", help: "where downloaded models are kept" },
  backend: { env: "LLMSERVE_BACKEND", help: "webgpu | cpu | auto" },
  contextLength: { env: "LLMSERVE_CONTEXT_LENGTH", help: "override the model's context length" },
  host: { env: "LLMSERVE_HOST", help: "address to listen on" },
  port: { env: "LLMSERVE_PORT", help: "port to listen on (0 picks a free one)" },
  kvMemory: { env: "LLMSERVE_KV_MEMORY", help: "memory for the paged KV cache, e.g. 256MiB" },
  blockSize: { env: "LLMSERVE_BLOCK_SIZE", help: "tokens per KV block" },
  maxBatchTokens: { env: "LLMSERVE_MAX_BATCH_TOKENS", help: "tokens computed per step at most" },
  maxRunning: { env: "LLMSERVE_MAX_RUNNING", help: "sequences in one step at most" },
  maxWaiting: { env: "LLMSERVE_MAX_WAITING", help: "queued requests before answering overloaded" },
  pipelineDepth: { env: "LLMSERVE_PIPELINE_DEPTH", help: "steps submitted ahead of their results" },
  apiKey: { env: "LLMSERVE_API_KEYS", help: "accepted API keys (env: comma-separated)" },
  drainTimeout: {
    env: "LLMSERVE_DRAIN_TIMEOUT",
    help: "seconds to let in-flight requests finish on SIGTERM",
  },
} as const;

export type SettingName = keyof typeof SETTINGS;

// Messages name no setting: the caller prefixes the flag or variable the value came from.
const positiveInt = () =>
  z.coerce.number({ error: "must be a number" }).int("must be an integer").positive(
    "must be positive",
  );

export const ConfigSchema = z.object({
  model: z.string().min(1).default("stories260K"),
  tokenizer: z.string().min(1).optional(),
  modelsDir: z.string().min(1).optional(),
  backend: z.enum(["webgpu", "cpu", "auto"]).default("auto"),
  contextLength: positiveInt().optional(),
  host: z.string().min(1).default("127.0.0.1"),
  port: z.coerce.number({ error: "must be a number" }).int("must be an integer").min(
    0,
    "must be 0 to 65535",
  ).max(65535, "must be 0 to 65535").default(8000),
  kvMemory: z.string().default("256MiB").transform((s, ctx) => {
    try {
      return parseByteSize(s);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  }),
  blockSize: positiveInt().default(16),
  maxBatchTokens: positiveInt().default(512),
  maxRunning: positiveInt().default(64),
  maxWaiting: positiveInt().default(256),
  // Deeper pipelines hide more readback latency (measured on llvmpipe: 2 -> 147, 3 -> 198,
  // 4 -> 264 tokens/s single-stream) at the cost of steps computed past a stop.
  pipelineDepth: positiveInt().max(8, "must be at most 8").default(3),
  apiKey: z.array(z.string().min(8, "API keys must have at least 8 characters")).default([]),
  drainTimeout: z.coerce.number({ error: "must be a number" }).nonnegative(
    "must be 0 or more seconds",
  ).default(30),
});

export type Config = z.infer<typeof ConfigSchema>;

/**
 * Builds the configuration from parsed flags and the environment, and validates it. Throws an
 * Error whose message lists every invalid setting with the value received.
 */
export function resolveConfig(
  flags: Partial<Record<SettingName, unknown>>,
  env: (name: string) => string | undefined = (n) => Deno.env.get(n),
): Config {
  const raw: Record<string, unknown> = {};
  for (const [name, { env: envName }] of Object.entries(SETTINGS)) {
    const fromFlag = flags[name as SettingName];
    const fromEnv = env(envName);
    if (fromFlag !== undefined) raw[name] = fromFlag;
    else if (fromEnv !== undefined && fromEnv !== "") {
      raw[name] = name === "apiKey"
        ? fromEnv.split(",").map((s) => s.trim()).filter(Boolean)
        : fromEnv;
    }
  }
  if (raw.apiKey !== undefined && !Array.isArray(raw.apiKey)) raw.apiKey = [raw.apiKey];
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) {
    const lines = parsed.error.issues.map((i) => {
      const name = String(i.path[0]) as SettingName;
      // Name what the user typed: the kebab-case flag, or the variable (with the flag it
      // stands for) when the value came from the environment.
      const flag = flagName(name);
      const where = flags[name] !== undefined
        ? flag
        : SETTINGS[name] === undefined
        ? flag
        : `${SETTINGS[name].env} (${flag})`;
      // API keys are secrets: say which one, never echo it.
      if (name === "apiKey") return `${where} #${Number(i.path[1] ?? 0) + 1}: ${i.message}`;
      const received = JSON.stringify(raw[name]);
      return i.message.includes(received)
        ? `${where}: ${i.message}`
        : `${where}: ${i.message} (received ${received})`;
    });
    throw new Error(`Invalid configuration:\n  ${lines.join("\n  ")}`);
  }
  return parsed.data;
}

/** `maxBatchTokens` -> `--max-batch-tokens`. */
export function flagName(name: string): string {
  return "--" + name.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase());
}
