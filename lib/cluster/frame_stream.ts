/**
 * Length-prefixed frames over a byte stream (the direct TCP link between pipeline stages):
 * each frame is a little-endian u32 byte count, then that many bytes. A peer that announces
 * more than `maxBytes` is refused before anything is allocated.
 */

/** Bytes of the length prefix. */
const PREFIX = 4;

/** Writes one frame (its prefix and bytes in one write where they fit). */
export async function writeFrame(w: Deno.Conn, bytes: Uint8Array): Promise<void> {
  const out = new Uint8Array(PREFIX + bytes.byteLength);
  new DataView(out.buffer).setUint32(0, bytes.byteLength, true);
  out.set(bytes, PREFIX);
  let done = 0;
  while (done < out.length) done += await w.write(out.subarray(done));
}

/**
 * Writes frames to one connection one after another, whoever sends them (a link's answers,
 * pongs and gathers are sent from different tasks): a frame is never interleaved with another.
 * A failed write rejects its own promise only; later frames are still tried.
 */
export class FrameWriter {
  #tail: Promise<void> = Promise.resolve();

  constructor(readonly conn: Deno.Conn) {}

  /** Queues `bytes` as one frame; resolves once it is written. */
  write(bytes: Uint8Array): Promise<void> {
    const done = this.#tail.then(() => writeFrame(this.conn, bytes));
    this.#tail = done.catch(() => {});
    return done;
  }

  /** Resolves once every frame queued so far is written or failed. */
  idle(): Promise<void> {
    return this.#tail;
  }
}

/**
 * Reads frames from a connection in order. next() gives the next frame, or undefined when the
 * peer closed the connection between frames; a close inside a frame is an error.
 */
export class FrameReader {
  #buf = new Uint8Array(64 * 1024);
  #start = 0;
  #end = 0;

  constructor(readonly conn: Deno.Conn, readonly maxBytes: number) {}

  async next(): Promise<Uint8Array | undefined> {
    if (!(await this.#fill(PREFIX))) return undefined;
    const n = new DataView(this.#buf.buffer, this.#start, PREFIX).getUint32(0, true);
    if (n > this.maxBytes) {
      throw new Error(`A frame of ${n} bytes was announced; at most ${this.maxBytes} are taken`);
    }
    if (!(await this.#fill(PREFIX + n))) {
      throw new Error(`The connection closed inside a frame of ${n} bytes`);
    }
    const frame = this.#buf.slice(this.#start + PREFIX, this.#start + PREFIX + n);
    this.#start += PREFIX + n;
    return frame;
  }

  /** Until `n` bytes are buffered; false when the peer closed before any of them came. */
  async #fill(n: number): Promise<boolean> {
    if (this.#end - this.#start >= n) return true;
    if (this.#buf.length - this.#start < n) {
      const grown = this.#buf.length >= n
        ? new Uint8Array(this.#buf.length)
        : new Uint8Array(Math.max(n, 2 * this.#buf.length));
      grown.set(this.#buf.subarray(this.#start, this.#end));
      this.#end -= this.#start;
      this.#start = 0;
      this.#buf = grown;
    }
    const had = this.#end - this.#start;
    while (this.#end - this.#start < n) {
      const got = await this.conn.read(this.#buf.subarray(this.#end));
      if (got === null) {
        if (this.#end - this.#start === had && had === 0) return false;
        throw new Error(`The connection closed after ${this.#end - this.#start} of ${n} bytes`);
      }
      this.#end += got;
    }
    return true;
  }
}
