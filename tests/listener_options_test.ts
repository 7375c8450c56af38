import { assertEquals } from "@std/assert";
import { listenerOptions } from "../lib/cli/listener_options.ts";
import { parseRouterArgs } from "../lib/cli/router.ts";
import { parseServeArgs } from "../lib/cli/serve_args.ts";

Deno.test("listenerOptions() maps the listener's settings from seconds to ms, the connection cap from the open-file limit unless given", () => {
  const config = parseServeArgs([
    "--host",
    "0.0.0.0",
    "--port",
    "9000",
    "--drain-timeout",
    "7",
    "--header-timeout",
    "2",
    "--body-timeout",
    "30",
    "--keep-alive-timeout",
    "4",
  ], () => undefined);
  assertEquals(listenerOptions(config, 256), {
    hostname: "0.0.0.0",
    port: 9000,
    drainTimeoutMs: 7000,
    // 256 descriptors less the reserve: 64 and a quarter of the limit.
    maxConnections: 128,
    headerTimeoutMs: 2000,
    bodyTimeoutMs: 30_000,
    keepAliveTimeoutMs: 4000,
  });
  // 1024 - (64 + 256), the same without a known limit.
  assertEquals(listenerOptions(config, 1024).maxConnections, 704);
  assertEquals(listenerOptions(config, undefined).maxConnections, 704);
  const capped = parseServeArgs(["--max-connections", "50"], () => undefined);
  assertEquals(listenerOptions(capped, 256).maxConnections, 50);
});

Deno.test("listenerOptions() gives the router the listener settings its environment sets (it used to keep only host, port and drain)", () => {
  const env: Record<string, string> = {
    LLMSERVE_HEADER_TIMEOUT: "3",
    LLMSERVE_BODY_TIMEOUT: "20",
    LLMSERVE_KEEP_ALIVE_TIMEOUT: "1",
    LLMSERVE_MAX_CONNECTIONS: "40",
  };
  const config = parseRouterArgs(["--nats", "nats://127.0.0.1:4222"], (n) => env[n]);
  const o = listenerOptions(config, 1024);
  assertEquals(
    [o.headerTimeoutMs, o.bodyTimeoutMs, o.keepAliveTimeoutMs, o.maxConnections],
    [3000, 20_000, 1000, 40],
  );
});
