/**
 * llama.cpp's `llama-server` as the peer of a benchmark: started on a free-ish loopback port
 * with the flags given, waited for until its /health answers, stopped by SIGTERM.
 */

/** A server a benchmark talks to over HTTP. */
export interface Side {
  readonly name: string;
  readonly base: string;
  stop(): Promise<void>;
}

/** Starts `<bin>/llama-server -m model ...args` and resolves once /health answers 200. */
export async function startLlamaServer(
  bin: string,
  model: string,
  args: readonly string[],
): Promise<Side> {
  const port = 18000 + Math.floor(Math.random() * 2000);
  const child = new Deno.Command(`${bin}/llama-server`, {
    args: ["-m", model, ...args, "--host", "127.0.0.1", "--port", String(port)],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const base = `http://127.0.0.1:${port}`;
  const stop = async () => {
    try {
      child.kill("SIGTERM");
    } catch { /* already gone */ }
    await child.status;
  };
  // Loading a 5 GB file on a busy machine takes a while; 5 minutes is a hang guard.
  for (let i = 0; i < 600; i++) {
    const ok = await fetch(`${base}/health`).then((r) => (r.body?.cancel(), r.ok), () => false);
    if (ok) return { name: "llama-server", base, stop };
    await new Promise((r) => setTimeout(r, 500));
  }
  await stop();
  throw new Error(`llama-server on ${model} did not answer /health within 5 minutes`);
}
