import type { Gpu } from "./device.ts";
import type { StepPlan } from "../../lib/engine/engine.ts";
import { maskWords } from "../../lib/engine/token_mask.ts";

/**
 * Token masks on the device (constrained decoding): one buffer the sampler reads, a flag per
 * sample (0: not masked) then a row of ceil(vocab / 32) words per sample. Each step packs its
 * flags and only its masked rows into its own region of a staging buffer, and the step's
 * commands copy them into place before its sampler runs, so several steps in one submit each
 * see their own masks (as the step metadata does).
 */
export class TokenMaskUpload {
  readonly buffer: GPUBuffer;
  readonly rows: number;
  readonly words: number;
  readonly #staging: GPUBuffer;
  readonly #cpu: Uint32Array<ArrayBuffer>;
  #used = 0;

  constructor(gpu: Gpu, vocab: number, maxSeqs: number, maxStepsPerSubmit: number) {
    this.rows = maxSeqs;
    this.words = maskWords(vocab);
    const bytes = (maxSeqs + maxSeqs * this.words) * 4;
    this.buffer = gpu.device.createBuffer({
      size: bytes,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST,
      label: "token masks",
    });
    this.#cpu = new Uint32Array(maxStepsPerSubmit * (bytes / 4));
    this.#staging = gpu.device.createBuffer({
      size: this.#cpu.byteLength,
      usage: GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC,
      label: "token mask staging",
    });
  }

  /** Starts packing a submit's steps. */
  begin(): void {
    this.#used = 0;
  }

  /** Packs one step's masks (its sampling entries in plan order) and encodes their copies. */
  encode(enc: GPUCommandEncoder, plan: StepPlan): void {
    const masks = plan.seqs.filter((s) => s.sample).map((s) => s.tokenMask);
    if (masks.length === 0) return;
    const at = this.#used;
    let next = at + masks.length;
    masks.forEach((m, i) => {
      this.#cpu[at + i] = m ? 1 : 0;
      if (!m) return;
      this.#cpu.set(m, next);
      enc.copyBufferToBuffer(
        this.#staging,
        next * 4,
        this.buffer,
        (this.rows + i * this.words) * 4,
        this.words * 4,
      );
      next += this.words;
    });
    enc.copyBufferToBuffer(this.#staging, at * 4, this.buffer, 0, masks.length * 4);
    this.#used = next;
  }

  /** Uploads what the packed steps need; call before their submit. */
  flush(queue: GPUQueue): void {
    if (this.#used > 0) queue.writeBuffer(this.#staging, 0, this.#cpu, 0, this.#used);
  }

  destroy(): void {
    this.buffer.destroy();
    this.#staging.destroy();
  }
}
