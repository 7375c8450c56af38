/**
 * The CPU engine's shared WebAssembly memories. The model bytes, KV cache and step buffers
 * live in them, so every worker thread of the pool reads them in place: the weights are read
 * from the file straight into them and are never copied again.
 *
 * wasm32 addresses at most 4 GiB, which bounds what one memory holds; a bigger model is split
 * by layer range over several (kernels/wasm/layer_split.ts). Pages are committed by the OS as
 * they are first written, so a KV cache sized for many sequences costs resident memory only as
 * its blocks fill.
 */
export const WASM_PAGE_BYTES = 65536;
const MAX_PAGES = 65536;
/** Below this address: the kernels' static data (Mathf's tables) and the pool's control words. */
export const HEAP_BASE = 1 << 20;
const ALIGN = 64;

/** A first-fit allocator over the shared memory, growing it as needed. */
export class WasmHeap {
  readonly memory = new WebAssembly.Memory({
    initial: HEAP_BASE / WASM_PAGE_BYTES,
    maximum: MAX_PAGES,
    shared: true,
  });
  /** The most this heap may hold: 4 GiB, or less where a test forces a model to split. */
  readonly maxBytes: number;
  /** Free ranges below #top, sorted by start. */
  #free: { start: number; size: number }[] = [];
  #top = HEAP_BASE;
  /** Every SharedArrayBuffer handed out over this memory (one per size it had). */
  readonly #buffers = new WeakSet<ArrayBufferLike>();

  /** The largest total one wasm32 memory can ever hold. */
  static readonly MAX_BYTES = MAX_PAGES * WASM_PAGE_BYTES;

  /** A heap of its own; owningHeap() finds it while it lives. */
  constructor(maxBytes = WasmHeap.MAX_BYTES) {
    if (!(Number.isInteger(maxBytes) && maxBytes > HEAP_BASE && maxBytes <= WasmHeap.MAX_BYTES)) {
      throw new Error(
        `A CPU engine memory holds ${
          HEAP_BASE + 1
        }..${WasmHeap.MAX_BYTES} bytes, received ${maxBytes}`,
      );
    }
    this.maxBytes = maxBytes;
    live.push(new WeakRef(this));
  }

  /** Bytes that can still be allocated above the top (freed ranges below it not counted). */
  get room(): number {
    return this.maxBytes - this.#top;
  }

  /** Bytes below the top of the heap (allocated or freed for reuse). */
  get used(): number {
    return this.#top - this.#free.reduce((n, f) => n + f.size, 0);
  }

  /** Reserves `bytes` (rounded up to 64) and returns their address. */
  alloc(bytes: number, what: string): number {
    const size = Math.max(ALIGN, Math.ceil(bytes / ALIGN) * ALIGN);
    const i = this.#free.findIndex((f) => f.size >= size);
    if (i >= 0) {
      const f = this.#free[i]!;
      const start = f.start;
      if (f.size === size) this.#free.splice(i, 1);
      else this.#free[i] = { start: f.start + size, size: f.size - size };
      return start;
    }
    const start = this.#top;
    const end = start + size;
    if (end > this.maxBytes) {
      throw new Error(
        `Cannot allocate ${what} (${size} bytes) in a CPU engine memory: it would end at ${end} bytes, past its cap of ${this.maxBytes} bytes; ${this.used} bytes are in use`,
      );
    }
    const have = this.memory.buffer.byteLength;
    if (end > have) this.memory.grow(Math.ceil((end - have) / WASM_PAGE_BYTES));
    this.#top = end;
    return start;
  }

  /** Returns a range from alloc() for reuse (zeroing is the next owner's business). */
  free(start: number, bytes: number): void {
    const size = Math.max(ALIGN, Math.ceil(bytes / ALIGN) * ALIGN);
    this.#free.push({ start, size });
    this.#free.sort((a, b) => a.start - b.start);
    const merged: { start: number; size: number }[] = [];
    for (const f of this.#free) {
      const last = merged[merged.length - 1];
      if (last && last.start + last.size === f.start) last.size += f.size;
      else merged.push({ ...f });
    }
    const last = merged[merged.length - 1];
    if (last && last.start + last.size === this.#top) {
      this.#top = last.start;
      merged.pop();
    }
    this.#free = merged;
  }

  /** The memory's current buffer (a new object after each growth; older ones stay valid). */
  get buffer(): SharedArrayBuffer {
    const b = this.memory.buffer as unknown as SharedArrayBuffer;
    this.#buffers.add(b);
    return b;
  }

  /** A fresh byte array at a new address: what the model loader reads a file into. */
  bytes(length: number, what: string): Uint8Array {
    const ptr = this.alloc(length, what); // may grow the memory: take the buffer after
    return new Uint8Array(this.buffer, ptr, length);
  }

  /** Whether `view` lies in this memory (then its address is its byteOffset). */
  owns(view: ArrayBufferView): boolean {
    return this.#buffers.has(view.buffer);
  }

  u8(ptr: number, n: number): Uint8Array {
    return new Uint8Array(this.buffer, ptr, n);
  }
  f32(ptr: number, n: number): Float32Array {
    return new Float32Array(this.buffer, ptr, n);
  }
  i32(ptr: number, n: number): Int32Array {
    return new Int32Array(this.buffer, ptr, n);
  }
}

const shared: WasmHeap[] = [];
/** Every heap made, the process's and others (a test's small ones), for owningHeap(). */
const live: WeakRef<WasmHeap>[] = [];

/**
 * The process's i-th heap, created on first use: a model split over several memories has its
 * i-th layer range in heap i; every model that fits in one memory shares heap 0.
 */
export function wasmHeap(i = 0): WasmHeap {
  while (shared.length <= i) shared.push(new WasmHeap());
  return shared[i]!;
}

/** The heap holding `view`, if any. */
export function owningHeap(view: ArrayBufferView): WasmHeap | undefined {
  for (const r of live) {
    const h = r.deref();
    if (h?.owns(view)) return h;
  }
  return undefined;
}
