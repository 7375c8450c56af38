/**
 * Child process for the drain test: the real service over the real serving core on the fake
 * model, draining on SIGTERM. Prints "listening <port>" when ready and "drained <json>" before
 * exiting 0. Arguments: the drain timeout in ms; optionally a number of generations N, after
 * whose first tokens every step is held until SIGTERM, so that all N are still running when
 * the signal comes however slow the machine; with a third argument "usr1" they are held until
 * SIGUSR1 instead, past SIGTERM.
 */
import { createApp } from "../lib/http/app.ts";
import { serveService } from "../lib/http/serve.ts";
import { FakeCore } from "./_fake_core.ts";

const holdAfter = Deno.args[1] === undefined ? undefined : Number(Deno.args[1]);
// "usr1": the held steps go on at SIGUSR1 instead of SIGTERM, so a test can act while draining.
const release = Deno.args[2] === "usr1" ? "SIGUSR1" : "SIGTERM";
const signalled = Promise.withResolvers<void>();
Deno.addSignalListener(release, () => signalled.resolve());
const sampled = new Set<number>();
const backend = new FakeCore({
  tokenDelayMs: 20,
  contextLength: 1024,
  ...(holdAfter === undefined ? {} : {
    holdWhen: (plan) => {
      const hold = sampled.size >= holdAfter;
      for (const s of plan.seqs) if (s.sample) sampled.add(s.seqId);
      return hold ? signalled.promise : undefined;
    },
  }),
});
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
