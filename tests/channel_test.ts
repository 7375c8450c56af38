import { assert, assertEquals, assertRejects, assertThrows } from "@std/assert";
import { Channel, ChannelClosedError } from "../actors/channel.ts";

/** Lets pending promise callbacks run. */
async function settle(rounds = 5): Promise<void> {
  for (let i = 0; i < rounds; i++) await new Promise((r) => setTimeout(r, 0));
}

Deno.test("Channel() rejects a capacity that is not a non-negative integer", () => {
  const err = assertThrows(() => new Channel(-1), RangeError);
  assert(err.message.includes("received -1"), err.message);
  assertThrows(() => new Channel(1.5), RangeError);
});

Deno.test("Channel.send() waits while the channel is full and resumes when a value is taken", async () => {
  const ch = new Channel<number>(2);
  await ch.send(1);
  await ch.send(2);
  let thirdSent = false;
  const third = ch.send(3).then(() => (thirdSent = true));
  await settle();
  assertEquals(thirdSent, false, "send must wait while the buffer holds capacity values");
  assertEquals(ch.size, 2);
  assertEquals((await ch.receive()).value, 1);
  await third;
  assertEquals(thirdSent, true);
  assertEquals([(await ch.receive()).value, (await ch.receive()).value], [2, 3]);
});

Deno.test("Channel.trySend() reports a full channel without sending", () => {
  const ch = new Channel<string>(1);
  assertEquals(ch.trySend("a"), true);
  assertEquals(ch.trySend("b"), false);
  assertEquals(ch.size, 1);
});

Deno.test("Channel with capacity 0 hands each value straight to a receiver", async () => {
  const ch = new Channel<number>(0);
  assertEquals(ch.trySend(1), false, "no receiver waiting, so nothing can be sent");
  let delivered = false;
  const sent = ch.send(7).then(() => (delivered = true));
  await settle();
  assertEquals(delivered, false);
  assertEquals((await ch.receive()).value, 7);
  await sent;
  assertEquals(delivered, true);
  const waiting = ch.receive();
  assertEquals(ch.trySend(8), true, "a waiting receiver takes the value at once");
  assertEquals((await waiting).value, 8);
});

Deno.test("Channel.close() lets receivers drain buffered values, then ends their loops", async () => {
  const ch = new Channel<number>(4);
  await ch.send(1);
  await ch.send(2);
  ch.close();
  assertEquals(ch.closed, true);
  const got: number[] = [];
  for await (const v of ch) got.push(v);
  assertEquals(got, [1, 2]);
  assertEquals(await ch.receive(), { value: undefined, done: true });
});

Deno.test("Channel.close() ends receivers that are waiting", async () => {
  const ch = new Channel<number>(1);
  const a = ch.receive();
  const b = ch.receive();
  ch.close();
  assertEquals(await a, { value: undefined, done: true });
  assertEquals(await b, { value: undefined, done: true });
});

Deno.test("Channel.send() on a closed channel throws ChannelClosedError", async () => {
  const ch = new Channel<number>(1);
  ch.close();
  assertThrows(() => ch.trySend(1), ChannelClosedError);
  await assertRejects(() => ch.send(1), ChannelClosedError);
});

Deno.test("Channel.close() rejects senders still waiting for room", async () => {
  const ch = new Channel<number>(1);
  await ch.send(1);
  const blocked = ch.send(2);
  ch.close();
  await assertRejects(() => blocked, ChannelClosedError);
  const got: number[] = [];
  for await (const v of ch) got.push(v);
  assertEquals(got, [1], "the rejected sender's value is not delivered");
});

Deno.test("Channel keeps each producer's order and loses nothing with many producers and consumers", async () => {
  const producers = 8, perProducer = 500, consumers = 5;
  const ch = new Channel<[number, number]>(3);
  const received: [number, number][][] = Array.from({ length: consumers }, () => []);
  const consumerLoops = received.map(async (into) => {
    for await (const item of ch) {
      into.push(item);
      // Consumers run at uneven speeds so the buffer fills and empties.
      if ((item[1] + into.length) % 7 === 0) await new Promise((r) => setTimeout(r, 0));
    }
  });
  let maxBuffered = 0;
  await Promise.all(Array.from({ length: producers }, async (_, p) => {
    for (let i = 0; i < perProducer; i++) {
      await ch.send([p, i]);
      maxBuffered = Math.max(maxBuffered, ch.size);
    }
  }));
  ch.close();
  await Promise.all(consumerLoops);
  assert(maxBuffered <= 3, `buffer grew past its capacity: ${maxBuffered}`);
  const all = received.flat();
  assertEquals(all.length, producers * perProducer);
  for (let p = 0; p < producers; p++) {
    const mine = all.filter(([q]) => q === p).map(([, i]) => i);
    assertEquals(mine.length, perProducer);
    assertEquals(new Set(mine).size, perProducer, `producer ${p} lost or duplicated values`);
  }
  // Each consumer sees one producer's values in the order they were sent.
  for (const into of received) {
    for (let p = 0; p < producers; p++) {
      const seq = into.filter(([q]) => q === p).map(([, i]) => i);
      for (let k = 1; k < seq.length; k++) {
        assert(seq[k]! > seq[k - 1]!, `consumer saw ${seq} out of order`);
      }
    }
  }
  assert(received.every((r) => r.length > 0), "every consumer should have received work");
});
