import { type AppOptions, createApp, type ServiceApp } from "../lib/http/app.ts";
import { type RunningServer, type ServeOptions, serveService } from "../lib/http/serve.ts";
import { RequestLog } from "../lib/http/request_log.ts";
import { FakeCore, type FakeCoreOptions } from "./_fake_core.ts";
import { assertEquals } from "@std/assert";

/**
 * A real server on 127.0.0.1 and a free port, over the real serving core on the fake model.
 * Disposing it stops both, and fails the test if the engine restarted with no fault injected.
 */
export interface TestService extends AsyncDisposable {
  readonly backend: FakeCore;
  readonly service: ServiceApp;
  readonly base: string;
  readonly wsUrl: string;
}

export async function startService(
  fake: FakeCoreOptions | FakeCore = {},
  app: Omit<AppOptions, "backend"> = {},
  serve: Partial<ServeOptions> = {},
): Promise<TestService & { readonly server: RunningServer }> {
  const backend = fake instanceof FakeCore ? fake : new FakeCore(fake);
  // Request-log lines would clutter test output; tests of the log pass their own.
  const service = createApp({ backend, requestLog: new RequestLog("text", () => {}), ...app });
  const server = await serveService(service, {
    hostname: "127.0.0.1",
    port: 0,
    drainTimeoutMs: 1000,
    signals: [],
    ...serve,
  });
  const { port } = server.addr;
  return {
    backend,
    service,
    server,
    base: `http://127.0.0.1:${port}`,
    wsUrl: `ws://127.0.0.1:${port}/v1/stream`,
    async [Symbol.asyncDispose]() {
      service.close();
      await server.stop();
      await backend.close();
      if (!backend.injectsFaults) {
        assertEquals(backend.restarts, 0, "the engine restarted with no fault injected");
      }
    },
  };
}

/** Polls `cond` until true; fails with `what` after `timeoutMs`. */
export async function waitUntil(
  cond: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 3000,
): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await cond())) {
    if (performance.now() > end) {
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** One sample value from Prometheus text, e.g. metricValue(text, 'llm_kv_blocks_used'). */
export function metricValue(text: string, series: string): number | undefined {
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const at = line.lastIndexOf(" ");
    if (at > 0 && line.slice(0, at) === series) return Number(line.slice(at + 1));
  }
  return undefined;
}

export async function scrape(base: string, headers: HeadersInit = {}): Promise<string> {
  const res = await fetch(`${base}/metrics`, { headers });
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}: ${await res.text()}`);
  return await res.text();
}

export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** Parses an SSE body into its `data:` payloads (JSON-decoded except "[DONE]"). */
export function parseSse(text: string): unknown[] {
  const out: unknown[] = [];
  for (const block of text.split("\n\n")) {
    const line = block.trim();
    if (line.length === 0) continue;
    if (!line.startsWith("data: ")) {
      throw new Error(`Not an SSE data event: ${JSON.stringify(line)}`);
    }
    const payload = line.slice(6);
    out.push(payload === "[DONE]" ? "[DONE]" : JSON.parse(payload));
  }
  return out;
}

/** A WebSocket client that queues incoming JSON frames for the test to take in order. */
export class TestSocket {
  readonly ws: WebSocket;
  readonly frames: Array<Record<string, unknown>> = [];
  #waiters: Array<() => void> = [];
  readonly closed: Promise<CloseEvent>;

  private constructor(ws: WebSocket) {
    this.ws = ws;
    ws.onmessage = (e) => {
      this.frames.push(JSON.parse(e.data as string));
      for (const w of this.#waiters.splice(0)) w();
    };
    this.closed = new Promise((resolve) => {
      ws.addEventListener("close", (e) => {
        resolve(e);
        for (const w of this.#waiters.splice(0)) w();
      });
    });
  }

  static async open(url: string, headers?: Record<string, string>): Promise<TestSocket> {
    // Deno's WebSocket takes extra handshake headers (e.g. Authorization) as a second argument.
    const ws = headers === undefined
      ? new WebSocket(url)
      : new WebSocket(url, { headers } as unknown as string[]);
    const sock = new TestSocket(ws);
    await new Promise<void>((resolve, reject) => {
      ws.addEventListener("open", () => resolve(), { once: true });
      ws.addEventListener(
        "error",
        (e) => reject(new Error(`WebSocket failed: ${(e as ErrorEvent).message}`)),
        { once: true },
      );
    });
    return sock;
  }

  send(frame: unknown): void {
    this.ws.send(typeof frame === "string" ? frame : JSON.stringify(frame));
  }

  /** Removes and returns the first queued frame matching `pred`, waiting for it if needed. */
  async take(
    pred: (f: Record<string, unknown>) => boolean = () => true,
    timeoutMs = 3000,
  ): Promise<Record<string, unknown>> {
    const end = performance.now() + timeoutMs;
    for (;;) {
      const i = this.frames.findIndex(pred);
      if (i >= 0) return this.frames.splice(i, 1)[0]!;
      const left = end - performance.now();
      if (left <= 0 || this.ws.readyState === WebSocket.CLOSED) {
        throw new Error(
          `No matching frame within ${timeoutMs} ms; queued: ${
            JSON.stringify(this.frames).slice(0, 500)
          }`,
        );
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
  }

  /** All frames for `id` up to and including its done/error frame. */
  async collect(id: string, timeoutMs = 5000): Promise<Array<Record<string, unknown>>> {
    const out: Array<Record<string, unknown>> = [];
    for (;;) {
      const f = await this.take((f) => f.id === id, timeoutMs);
      out.push(f);
      if (f.type === "done" || f.type === "error") return out;
    }
  }

  async close(): Promise<void> {
    if (this.ws.readyState !== WebSocket.CLOSED) this.ws.close();
    await this.closed;
  }
}

/**
 * Sends `request` (a whole HTTP/1.1 request as text, which lets a test set Host, Origin and
 * other headers fetch() keeps to itself) on a fresh connection and reads until the server
 * closes it.
 */
export async function rawHttp(
  base: string,
  request: string,
): Promise<{ status: number; head: string; body: string }> {
  const u = new URL(base);
  const conn = await Deno.connect({ hostname: u.hostname, port: Number(u.port) });
  try {
    await conn.write(new TextEncoder().encode(request));
    let text = "";
    const buf = new Uint8Array(65536);
    for (;;) {
      const n = await conn.read(buf).catch(() => null);
      if (n === null) break;
      text += new TextDecoder().decode(buf.subarray(0, n));
      // Enough once a Content-Length body (or an upgrade's head) is complete.
      const end = text.indexOf("\r\n\r\n");
      if (end >= 0) {
        const len = /\r\ncontent-length:\s*(\d+)/i.exec(text.slice(0, end));
        if (/^HTTP\/1\.1 101/.test(text)) break;
        if (len && text.length - end - 4 >= Number(len[1])) break;
      }
    }
    const end = text.indexOf("\r\n\r\n");
    return {
      status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0),
      head: end < 0 ? text : text.slice(0, end),
      body: end < 0 ? "" : text.slice(end + 4),
    };
  } finally {
    try {
      conn.close();
    } catch { /* closed by the server */ }
  }
}

/**
 * A completion body naming `model` whose prompt holds a byte that is not UTF-8 (0xFF): a
 * lenient decoder would serve it as U+FFFD, a prompt the client never sent.
 */
export function invalidUtf8Completion(model: string): RequestInit {
  const head = new TextEncoder().encode(`{"model":"${model}","prompt":"Once `);
  const tail = new TextEncoder().encode(`","max_tokens":2}`);
  return {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: new Uint8Array([...head, 0xff, ...tail]),
  };
}

/** A front's answer to invalidUtf8Completion: 400 `invalid_json`, naming UTF-8. */
export async function assertRefusesInvalidUtf8(res: Response): Promise<void> {
  const body = await res.json();
  assertEquals(
    [res.status, body.error?.code, /not valid UTF-8/.test(body.error?.message)],
    [400, "invalid_json", true],
    JSON.stringify(body),
  );
}
