/**
 * Child process for the drain test: the real service over the fake core, draining on
 * SIGTERM. Prints "listening <port>" when ready and "drained <json>" before exiting 0.
 */
import { createApp } from "../lib/http/app.ts";
import { serveService } from "../lib/http/serve.ts";
import { FakeBackend } from "./_fake_backend.ts";

const service = createApp({ backend: new FakeBackend({ tokenDelayMs: 20, traceSteps: true }) });
const running = await serveService(service, {
  hostname: "127.0.0.1",
  port: 0,
  drainTimeoutMs: Number(Deno.args[0] ?? "5000"),
  onListen: (addr) => console.log(`listening ${addr.port}`),
});
const result = await running.closed;
console.log(`drained ${JSON.stringify(result)}`);
Deno.exit(0);
