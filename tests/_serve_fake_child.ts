/**
 * Child process for the drain test: the real service over the real serving core on the fake
 * model, draining on SIGTERM. Prints "listening <port>" when ready and "drained <json>" before
 * exiting 0.
 */
import { createApp } from "../lib/http/app.ts";
import { serveService } from "../lib/http/serve.ts";
import { FakeCore } from "./_fake_core.ts";

const backend = new FakeCore({ tokenDelayMs: 20, contextLength: 1024 });
const service = createApp({ backend });
const running = await serveService(service, {
  hostname: "127.0.0.1",
  port: 0,
  drainTimeoutMs: Number(Deno.args[0] ?? "5000"),
  onListen: (addr) => console.log(`listening ${addr.port}`),
});
const result = await running.closed;
await backend.close();
console.log(`drained ${JSON.stringify(result)}`);
Deno.exit(0);
