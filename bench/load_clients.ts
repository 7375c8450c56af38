/**
 * Benchmark clients: one generation over the WebSocket protocol or the OpenAI streaming HTTP
 * API, timed on the client side (what a user sees, network and framing included).
 */
import type { WorkItem } from "./workload.ts";

/** What one request experienced. Times are performance.now() milliseconds. */
export interface RequestRecord {
  readonly index: number;
  readonly sentAt: number;
  /** Sent to first token; absent when no token came. */
  ttftMs?: number;
  /** Gaps between successive token events. */
  readonly itlMs: number[];
  /** Sent to the final event (done or error). */
  e2eMs?: number;
  promptTokens: number;
  outputTokens: number;
  /** Token ids streamed (WebSocket only: the OpenAI stream carries text). */
  readonly tokenIds: number[];
  finishReason?: string;
  /** Error code (server's `code`, "http_<status>" or "connection") when it failed. */
  error?: string;
  /** Sent to an error event inside a stream that had begun (HTTP 200). */
  errorAtMs?: number;
  /** Retry-After header of a 503, in seconds. */
  retryAfter?: number;
}

export interface SamplingSpec {
  readonly temperature: number;
  readonly seed: number;
  readonly priority?: "interactive" | "batch";
  /** Generate max_tokens whatever the model says (both llama-server and we take ignore_eos). */
  readonly ignoreEos?: boolean;
}

function newRecord(index: number): RequestRecord {
  return {
    index,
    sentAt: performance.now(),
    itlMs: [],
    promptTokens: 0,
    outputTokens: 0,
    tokenIds: [],
  };
}

/** Marks the arrival of `n` tokens at `now`. */
function onTokens(r: RequestRecord, n: number, last: { t: number }): void {
  const now = performance.now();
  if (r.ttftMs === undefined) r.ttftMs = now - r.sentAt;
  else r.itlMs.push(now - last.t);
  last.t = now;
  r.outputTokens += n;
}

interface Pending {
  readonly record: RequestRecord;
  readonly last: { t: number };
  readonly resolve: (r: RequestRecord) => void;
}

/**
 * One WebSocket to /v1/stream carrying any number of generations, told apart by id. A socket
 * that closes fails its open generations with "connection".
 */
export class WsConnection {
  #ws: WebSocket;
  #pending = new Map<string, Pending>();
  #next = 0;
  #closed = false;

  private constructor(ws: WebSocket) {
    this.#ws = ws;
    ws.onmessage = (e) => this.#onFrame(JSON.parse(String(e.data)));
    ws.onclose = () => this.#failAll("connection");
    ws.onerror = () => {};
  }

  /** Opens a socket to `wsUrl` (ws://host:port/v1/stream). */
  static open(wsUrl: string): Promise<WsConnection> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl);
      ws.onopen = () => resolve(new WsConnection(ws));
      ws.onerror = (e) =>
        reject(new Error(`Cannot open ${wsUrl}: ${(e as ErrorEvent).message ?? "error"}`));
    });
  }

  /** True once the socket closed (by either side). */
  get closed(): boolean {
    return this.#closed;
  }

  /** Generations awaiting their final frame. */
  get live(): number {
    return this.#pending.size;
  }

  /** Runs one generation; resolves on its done or error frame (never rejects). */
  generate(index: number, item: WorkItem, s: SamplingSpec): Promise<RequestRecord> {
    const id = `g${this.#next++}`;
    const record = newRecord(index);
    if (this.#closed) return Promise.resolve({ ...record, error: "connection" });
    return new Promise((resolve) => {
      this.#pending.set(id, { record, last: { t: record.sentAt }, resolve });
      this.#ws.send(JSON.stringify({
        type: "generate",
        id,
        ...(item.messages ? { messages: item.messages } : { prompt: item.prompt ?? "" }),
        max_tokens: item.maxTokens,
        temperature: s.temperature,
        seed: s.seed,
        ...(s.priority ? { priority: s.priority } : {}),
      }));
    });
  }

  /** Asks the server to cancel a live generation (it still ends with its done frame). */
  cancel(index: number): void {
    for (const [id, p] of this.#pending) {
      if (p.record.index === index) this.#ws.send(JSON.stringify({ type: "cancel", id }));
    }
  }

  close(): void {
    if (this.#closed) return;
    this.#ws.close();
    this.#failAll("connection");
  }

  #onFrame(f: { type: string; id?: string; [k: string]: unknown }): void {
    const p = f.id === undefined ? undefined : this.#pending.get(f.id);
    if (!p) return;
    const r = p.record;
    if (f.type === "started") r.promptTokens = f.prompt_tokens as number;
    else if (f.type === "token") {
      r.tokenIds.push(...(f.token_ids as number[]));
      onTokens(r, (f.token_ids as number[]).length, p.last);
    } else if (f.type === "done" || f.type === "error") {
      r.e2eMs = performance.now() - r.sentAt;
      if (f.type === "done") {
        r.finishReason = f.finish_reason as string;
        const usage = f.usage as { completion_tokens: number; prompt_tokens: number };
        r.outputTokens = usage.completion_tokens;
        if (usage.prompt_tokens > 0) r.promptTokens = usage.prompt_tokens;
      } else r.error = f.code as string;
      this.#pending.delete(f.id!);
      p.resolve(r);
    }
  }

  #failAll(code: string): void {
    this.#closed = true;
    for (const p of this.#pending.values()) {
      p.record.error ??= code;
      p.record.e2eMs = performance.now() - p.record.sentAt;
      p.resolve(p.record);
    }
    this.#pending.clear();
  }
}

/**
 * A pool of sockets for open-loop load: each generation goes to the least busy socket, and a
 * new socket opens when all carry `perSocket` (the server limits generations per socket).
 */
export class WsPool {
  #conns: WsConnection[] = [];
  constructor(readonly wsUrl: string, readonly perSocket = 32) {}

  async generate(index: number, item: WorkItem, s: SamplingSpec): Promise<RequestRecord> {
    this.#conns = this.#conns.filter((c) => !c.closed);
    let conn = this.#conns.reduce<WsConnection | undefined>(
      (a, c) => (!a || c.live < a.live ? c : a),
      undefined,
    );
    if (!conn || conn.live >= this.perSocket) {
      conn = await WsConnection.open(this.wsUrl);
      this.#conns.push(conn);
    }
    return await conn.generate(index, item, s);
  }

  close(): void {
    for (const c of this.#conns) c.close();
    this.#conns = [];
  }
}

/**
 * One generation over POST /v1/completions (or /v1/chat/completions for chat items) with
 * stream: true, reading the SSE chunks as they come. Every chunk without a finish reason is a
 * token event.
 */
export async function httpGenerate(
  base: string,
  index: number,
  item: WorkItem,
  s: SamplingSpec,
  headers: Record<string, string> = {},
): Promise<RequestRecord> {
  const r = newRecord(index);
  const last = { t: r.sentAt };
  const chat = item.messages !== undefined;
  const body = {
    ...(chat ? { messages: item.messages } : { prompt: item.prompt ?? "" }),
    max_tokens: item.maxTokens,
    temperature: s.temperature,
    seed: s.seed,
    ...(s.priority ? { priority: s.priority } : {}),
    ...(s.ignoreEos ? { ignore_eos: true } : {}),
    stream: true,
    stream_options: { include_usage: true },
  };
  let res: Response;
  try {
    res = await fetch(`${base}/v1/${chat ? "chat/completions" : "completions"}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
  } catch {
    r.error = "connection";
    r.e2eMs = performance.now() - r.sentAt;
    return r;
  }
  if (!res.ok) {
    const text = await res.text();
    let code = `http_${res.status}`;
    try {
      code = JSON.parse(text).error.code ?? code;
    } catch { /* not an error envelope */ }
    r.error = code;
    const retry = res.headers.get("retry-after");
    if (retry !== null) r.retryAfter = Number(retry);
    r.e2eMs = performance.now() - r.sentAt;
    return r;
  }
  let buffered = "";
  let outputTokens = 0;
  const decoder = new TextDecoder();
  try {
    for await (const bytes of res.body!) {
      buffered += decoder.decode(bytes, { stream: true });
      let cut: number;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, cut).trim();
        buffered = buffered.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          r.error = chunk.error.code ?? "stream_error";
          r.errorAtMs ??= performance.now() - r.sentAt;
          continue;
        }
        if (chunk.usage) {
          r.promptTokens = chunk.usage.prompt_tokens;
          outputTokens = chunk.usage.completion_tokens;
        }
        const choice = chunk.choices?.[0];
        if (!choice) continue;
        if (choice.finish_reason) r.finishReason = choice.finish_reason;
        // The chat stream's first chunk only announces the role.
        else if (!(chat && choice.delta?.role && !choice.delta?.content)) onTokens(r, 1, last);
      }
    }
  } catch {
    r.error ??= "connection";
  }
  r.e2eMs = performance.now() - r.sentAt;
  if (outputTokens > 0) r.outputTokens = outputTokens;
  return r;
}
