/**
 * Helpers for the reliability tests: the CPU reference generation (the oracle for what a
 * request must produce), and a WebSocket client that keeps every frame in arrival order.
 */
import { GREEDY, type SamplingParams } from "../lib/engine/engine.ts";
import { loadModel } from "../lib/model/load_model.ts";
import { CpuEngine } from "../kernels/reference/cpu_engine.ts";
import { referenceGenerate } from "../kernels/reference/reference_generate.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import type { Model } from "../lib/model/weights.ts";
import { modelFile } from "./harness/model_files.ts";

export const MODEL_NAME = "stories260K-ctx512.gguf";

/** The generation parameters a test sends (WebSocket field names). */
export interface GenParams {
  readonly prompt: string;
  readonly max_tokens: number;
  readonly temperature: number;
  readonly top_p?: number;
  readonly seed?: number;
}

/**
 * What the served model must produce for `p`, computed alone by referenceGenerate on a fresh
 * CPU engine: the token ids up to max_tokens or EOS (EOS itself is not streamed).
 */
export class Reference {
  #cache = new Map<string, number[]>();
  private constructor(readonly model: Model, readonly tokenizer: Tokenizer) {}

  static async load(): Promise<Reference> {
    const model = await loadModel(modelFile(MODEL_NAME));
    return new Reference(model, new Tokenizer(model.tokenizer!));
  }

  async tokens(p: GenParams): Promise<number[]> {
    const key = JSON.stringify(p);
    const hit = this.#cache.get(key);
    if (hit) return hit;
    const sampling: SamplingParams = p.temperature <= 0 ? GREEDY : {
      temperature: p.temperature,
      topK: 0,
      topP: p.top_p ?? 1,
      minP: 0,
      seed: (p.seed ?? 0) >>> 0,
    };
    const ids = this.tokenizer.encode(p.prompt, { bos: true });
    const engine = new CpuEngine(this.model.config, this.model.weights, {
      numBlocks: 40,
      blockSize: 16,
    });
    const { tokens } = await referenceGenerate(engine, ids, p.max_tokens, sampling, {
      stopTokens: [this.tokenizer.eosId],
    });
    engine.dispose();
    if (tokens.at(-1) === this.tokenizer.eosId) tokens.pop();
    this.#cache.set(key, tokens);
    return tokens;
  }

  text(ids: readonly number[]): string {
    return this.tokenizer.decode(ids);
  }
}

export type Frame = { type: string; id?: string; [k: string]: any };

/** A WebSocket to /v1/stream that records every server frame, in order. */
export class FrameClient {
  readonly frames: Frame[] = [];
  readonly closed: Promise<CloseEvent>;
  #waiters: { check: () => boolean; resolve: () => void }[] = [];

  private constructor(readonly ws: WebSocket) {
    ws.onmessage = (e) => {
      this.frames.push(JSON.parse(String(e.data)));
      this.#waiters = this.#waiters.filter((w) => (w.check() ? (w.resolve(), false) : true));
    };
    this.closed = new Promise((r) => ws.addEventListener("close", (e) => r(e as CloseEvent)));
  }

  static async open(url: string): Promise<FrameClient> {
    const ws = new WebSocket(url);
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error(`Cannot open ${url}`));
    });
    return new FrameClient(ws);
  }

  send(frame: Frame | string | Uint8Array): void {
    this.ws.send(
      typeof frame === "string" || frame instanceof Uint8Array ? frame : JSON.stringify(frame),
    );
  }

  generate(id: string, p: GenParams, extra: Record<string, unknown> = {}): void {
    this.send({ type: "generate", id, ...p, ...extra });
  }

  /** Frames about generation `id`. */
  of(id: string): Frame[] {
    return this.frames.filter((f) => f.id === id);
  }

  /** The token ids streamed for `id`. */
  tokens(id: string): number[] {
    return this.of(id).filter((f) => f.type === "token").flatMap((f) => f.token_ids as number[]);
  }

  /**
   * The final frame of `id` (done, or an error ending it), if it came. An unknown_id error
   * answers a cancel that raced the end; it ends nothing.
   */
  final(id: string): Frame | undefined {
    const frames = this.of(id);
    return frames.find((f) => f.type === "done") ??
      frames.find((f) => f.type === "error" && f.code !== "unknown_id");
  }

  /** Resolves once `check` holds; fails after `timeoutMs` saying `what`. */
  until(check: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
    if (check()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`)),
        timeoutMs,
      );
      this.#waiters.push({ check, resolve: () => (clearTimeout(timer), resolve()) });
    });
  }

  /** Resolves once every id has its final frame. */
  finished(ids: readonly string[], timeoutMs = 20_000): Promise<void> {
    return this.until(
      () => ids.every((id) => this.final(id) !== undefined),
      `the final frames of ${ids.length} generations`,
      timeoutMs,
    );
  }

  close(): void {
    this.ws.close();
  }
}
