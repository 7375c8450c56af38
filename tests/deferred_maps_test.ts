import { assertEquals, assertRejects } from "@std/assert";
import { DeferredMaps, type Mappable } from "../kernels/webgpu/deferred_maps.ts";

/** Records each mapAsync call, and settles it when the test says. */
class RecordingBuffer implements Mappable {
  readonly modes: number[] = [];
  #settle = Promise.withResolvers<void>();
  constructor(private readonly fail?: Error) {}
  mapAsync(mode: number): Promise<void> {
    if (this.fail) throw this.fail;
    this.modes.push(mode);
    return this.#settle.promise;
  }
  resolve(): void {
    this.#settle.resolve();
  }
  reject(e: Error): void {
    this.#settle.reject(e);
  }
}

const READ = 1;

Deno.test("a step's buffers start mapping at the next flush (the next submit), not when it asks", async () => {
  const maps = new DeferredMaps(READ);
  const [a, b] = [new RecordingBuffer(), new RecordingBuffer()];
  let mapped = false;
  const done = maps.map([a, undefined, b]).then(() => (mapped = true));
  assertEquals([a.modes, b.modes], [[], []]);
  maps.flush();
  assertEquals([a.modes, b.modes], [[READ], [READ]]);
  a.resolve();
  await Promise.resolve();
  assertEquals(mapped, false, "resolved before every buffer was mapped");
  b.resolve();
  await done;
  assertEquals(mapped, true);
  maps.flush();
  assertEquals(a.modes.length, 1, "a second flush maps nothing twice");
});

Deno.test("with no submit after it, a step's buffers start mapping on the next timer tick", async () => {
  const maps = new DeferredMaps(READ);
  const a = new RecordingBuffer();
  const done = maps.map([a]);
  assertEquals(a.modes, []);
  // A zero-delay timer queued now runs after the one the mapping set (timers fire in order).
  await new Promise((r) => setTimeout(r, 0));
  assertEquals(a.modes, [READ]);
  a.resolve();
  await done;
});

Deno.test("a mapping that fails, at the call or later, rejects only its own step", async () => {
  const maps = new DeferredMaps(READ);
  const throws = new RecordingBuffer(new Error("buffer destroyed"));
  const later = new RecordingBuffer();
  const fine = new RecordingBuffer();
  const p1 = maps.map([throws]);
  const p2 = maps.map([later]);
  const p3 = maps.map([fine]);
  maps.flush();
  later.reject(new Error("device lost"));
  fine.resolve();
  await assertRejects(() => p1, Error, "buffer destroyed");
  await assertRejects(() => p2, Error, "device lost");
  await p3;
});

Deno.test("a mapping resolves with the time its mapping call returned, when the device had finished what came before", async () => {
  let clock = 5;
  // Deno's mapAsync waits on the device inside the call: here the wait moves the clock to 12.
  const waits: Mappable = {
    mapAsync: () => {
      clock = 12;
      return Promise.resolve();
    },
  };
  const maps = new DeferredMaps(READ, () => clock);
  const done = maps.map([waits]);
  clock = 7;
  maps.flush();
  clock = 30;
  assertEquals(await done, 12);
});
