import { DEFAULT_LIMITS } from "../lib/engine/limits.ts";
import { assertEquals, assertThrows } from "@std/assert";
import { maxKeepAlive, resolveConfig } from "../lib/cli/config.ts";

const noEnv = () => undefined;

Deno.test("resolveConfig() fills defaults", () => {
  const c = resolveConfig({}, noEnv);
  assertEquals(c.model, "stories260K");
  assertEquals(c.port, 8000);
  assertEquals(c.kvMemory, undefined); // "auto": sized from the model and the device
  assertEquals(c.apiKey, []);
});

Deno.test("resolveConfig() lets flags win over the environment", () => {
  const env = (n: string) =>
    ({ LLMSERVE_PORT: "9001", LLMSERVE_HOST: "0.0.0.0" } as Record<string, string>)[n];
  const c = resolveConfig({ port: "9002" }, env);
  assertEquals(c.port, 9002);
  assertEquals(c.host, "0.0.0.0");
});

Deno.test("resolveConfig() splits comma-separated API keys from the environment", () => {
  const env = (n: string) => n === "LLMSERVE_API_KEYS" ? "key-one-123, key-two-456" : undefined;
  assertEquals(resolveConfig({}, env).apiKey, ["key-one-123", "key-two-456"]);
});

Deno.test("resolveConfig() names every invalid setting and the value received", () => {
  const err = assertThrows(() =>
    resolveConfig({ port: "eighty", kvMemory: "12 zz", backend: "tpu" }, noEnv)
  );
  const msg = (err as Error).message;
  for (const part of ["--port", '"eighty"', "--kv-memory", '"12 zz"', "--backend", '"tpu"']) {
    assertEquals(msg.includes(part), true, `message lacks ${part}: ${msg}`);
  }
});

Deno.test("resolveConfig() bounds the pipeline depth to 1..maxPipelineDepth, and leaves it to the engine when unset", () => {
  const most = DEFAULT_LIMITS.maxPipelineDepth;
  assertEquals(most, 16);
  assertEquals(resolveConfig({}, noEnv).pipelineDepth, undefined);
  assertEquals(resolveConfig({ pipelineDepth: String(most) }, noEnv).pipelineDepth, most);
  assertThrows(
    () => resolveConfig({ pipelineDepth: String(most + 1) }, noEnv),
    Error,
    `at most ${most}`,
  );
  assertThrows(() => resolveConfig({ pipelineDepth: "0" }, noEnv), Error, "--pipeline-depth");
});

Deno.test("resolveConfig() names the flag or environment variable the user set, and each value once", () => {
  const fromFlags =
    (assertThrows(() => resolveConfig({ kvMemory: "abc", maxBatchTokens: "0" }, noEnv)) as Error)
      .message;
  for (const part of ["--kv-memory:", "--max-batch-tokens:"]) {
    assertEquals(fromFlags.includes(part), true, `message lacks ${part}: ${fromFlags}`);
  }
  assertEquals(fromFlags.split('"abc"').length - 1, 1, `"abc" should appear once: ${fromFlags}`);
  const env = (n: string) => n === "LLMSERVE_MAX_RUNNING" ? "many" : undefined;
  const fromEnv = (assertThrows(() => resolveConfig({}, env)) as Error).message;
  assertEquals(fromEnv.includes("LLMSERVE_MAX_RUNNING"), true, fromEnv);
  // A rejected API key is named by position, never echoed.
  const keys =
    (assertThrows(() => resolveConfig({ apiKey: ["ok-key-123", "short"] }, noEnv)) as Error)
      .message;
  assertEquals(keys.includes("--api-key"), true, keys);
  assertEquals(keys.includes("short"), false, keys);
});

Deno.test("resolveConfig() names a bad environment value by its variable and the flag it stands for", () => {
  const env = (n: string) => n === "LLMSERVE_BLOCK_SIZE" ? "-3" : undefined;
  const msg = (assertThrows(() => resolveConfig({}, env)) as Error).message;
  assertEquals(
    msg,
    'Invalid configuration:\n  LLMSERVE_BLOCK_SIZE (--block-size): must be positive (received "-3")',
  );
  // The message never falls back to the internal camelCase name.
  assertEquals(msg.includes("blockSize"), false, msg);
  const port =
    (assertThrows(() =>
      resolveConfig({}, (n) => n === "LLMSERVE_PORT" ? "eighty" : undefined)
    ) as Error)
      .message;
  assertEquals(
    port,
    'Invalid configuration:\n  LLMSERVE_PORT (--port): must be a number (received "eighty")',
  );
});

Deno.test("resolveConfig() refuses an API key with a space at start-up (it could never match 'Bearer <key>'), without echoing it", () => {
  const err = assertThrows(
    () => resolveConfig({ apiKey: ["good-key-123", "secret with space"] }, noEnv),
    Error,
  );
  const msg = (err as Error).message;
  assertEquals(msg.includes("--api-key #2"), true, msg);
  assertEquals(msg.includes("without spaces"), true, msg);
  assertEquals(msg.includes("secret with space"), false, "the key is not echoed");
});

Deno.test("resolveConfig() takes --cors-origin and --allowed-host repeated, or comma-separated from the environment", () => {
  const env = (n: string) =>
    ({
      LLMSERVE_CORS_ORIGINS: "http://localhost:*, https://app.example.com",
      LLMSERVE_ALLOWED_HOSTS: "llm.internal",
    } as Record<string, string>)[n];
  const c = resolveConfig({}, env);
  assertEquals(c.corsOrigin, ["http://localhost:*", "https://app.example.com"]);
  assertEquals(c.allowedHost, ["llm.internal"]);
  assertEquals(resolveConfig({ corsOrigin: "*" }, noEnv).corsOrigin, ["*"]);
  assertThrows(
    () => resolveConfig({ corsOrigin: ["https://ok.example", "evil.example/path"] }, noEnv),
    Error,
    "--cors-origin: an origin is scheme://host[:port] (globs with * allowed, e.g. http://localhost:*), 'null', or '*' (received \"evil.example/path\")",
  );
});

Deno.test("resolveConfig() has timeouts like mature servers' (header 60 s, body 60 s, keep-alive 5 s) and no fixed connection limit", () => {
  const c = resolveConfig({}, noEnv);
  assertEquals([c.headerTimeout, c.bodyTimeout, c.keepAliveTimeout], [60, 60, 5]);
  assertEquals(c.maxConnections, undefined, "derived from the open-file limit at start-up");
  assertEquals(resolveConfig({ maxConnections: "100" }, noEnv).maxConnections, 100);
  assertThrows(() => resolveConfig({ headerTimeout: "0" }, noEnv), Error, "--header-timeout");
});

Deno.test("--max-keep-alive caps a request's keep_alive: a day by default (or --keep-alive if longer), -1 for no cap, never below --keep-alive", () => {
  const cap = (flags: Record<string, string>) =>
    maxKeepAlive(resolveConfig(flags, () => undefined));
  const HOUR = 3_600_000;
  assertEquals(cap({}), 24 * HOUR);
  assertEquals(cap({ keepAlive: "48h" }), 48 * HOUR);
  assertEquals(cap({ keepAlive: "-1" }), Infinity);
  assertEquals(cap({ maxKeepAlive: "30m" }), HOUR / 2);
  assertEquals(cap({ maxKeepAlive: "-1" }), Infinity);
  assertThrows(
    () => cap({ keepAlive: "2h", maxKeepAlive: "1h" }),
    Error,
    "--keep-alive 2h is longer than --max-keep-alive 1h; raise --max-keep-alive",
  );
  assertThrows(
    () => resolveConfig({ maxKeepAlive: "soon" }, () => undefined),
    Error,
    '--max-keep-alive: expected a number of seconds or a duration like "30s"',
  );
});
