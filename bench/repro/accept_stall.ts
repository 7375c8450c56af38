/**
 * Minimal reproduction: Deno 2.9.6's node:net stops accepting for good once an accept failed
 * for want of file descriptors (EMFILE). lib/http/serve.ts works around it (AcceptWatch).
 *
 *   sh -c 'ulimit -n 64; exec npx -y deno@2.9.6 run -A bench/repro/accept_stall.ts'
 *
 * (the hard limit: Deno raises its soft limit to the hard one at start) prints, on Debian 12
 * x86-64, after the client's own "Too many open files" error:
 *
 *   after the flood, with descriptors free again (25 open): TIMEOUT, TIMEOUT, TIMEOUT
 *   after listening again: ok
 *
 * node:http's server emits no "error" for the failed accept either.
 */
import http from "node:http";

const CLIENT = `const conns = [];
for (let i = 0; i < 200; i++) conns.push(await Deno.connect({ hostname: "127.0.0.1", port: PORT }));`;

const server = http.createServer((_req, res) => res.end("ok"));
server.on("error", (e) => console.log(`server error: ${e.message}`));
server.listen(0, "127.0.0.1", async () => {
  const port = (server.address() as { port: number }).port;
  // Another process under the same limit: it connects until it runs out itself.
  await new Deno.Command(Deno.execPath(), {
    args: ["eval", CLIENT.replace("PORT", String(port))],
  }).output();
  await new Promise((r) => setTimeout(r, 1500));
  const get = () =>
    Promise.race([
      fetch(`http://127.0.0.1:${port}/`).then((r) => r.text(), (e) => `error ${e.message}`),
      new Promise<string>((r) => setTimeout(() => r("TIMEOUT"), 2000)),
    ]);
  const open = [...Deno.readDirSync("/proc/self/fd")].length;
  const after = [await get(), await get(), await get()];
  console.log(
    `after the flood, with descriptors free again (${open} open): ${after.join(", ")}`,
  );
  server.close();
  server.listen(port, "127.0.0.1", async () => {
    console.log(`after listening again: ${await get()}`);
    Deno.exit(0);
  });
});
