import { assert, assertEquals } from "@std/assert";
import { ReplicaRegistry } from "../lib/cluster/replica_registry.ts";
import type { Heartbeat } from "../lib/cluster/messages.ts";

function beat(replica: string, over: Partial<Heartbeat> = {}): Heartbeat {
  return {
    type: "heartbeat",
    replica,
    beat: 0,
    intervalMs: 250,
    stalledMs: 0,
    draining: false,
    model: "m",
    load: {
      running: 0,
      waiting: 0,
      maxRunning: 4,
      maxWaiting: 4,
      kvBlocksUsed: 0,
      kvBlocksTotal: 10,
      streams: 0,
      prefixQueryTokens: 0,
      prefixHitTokens: 0,
    },
    prefix: { blockSize: 16, hashes: [] },
    streamIds: [],
    ...over,
  };
}

Deno.test("a replica leaves the rotation when silent past the bound, draining, or stalled", () => {
  let now = 0;
  const reg = new ReplicaRegistry({ staleAfterMs: 1500, now: () => now });
  reg.onHeartbeat(beat("a"));
  reg.onHeartbeat(beat("b"));
  assertEquals(reg.inRotation().map((v) => v.id), ["a", "b"]);
  now = 1400;
  reg.onHeartbeat(beat("b"));
  now = 1600;
  assertEquals(reg.inRotation().map((v) => v.id), ["b"], "a: silent for 1600 ms > 1500");
  reg.onHeartbeat(beat("b", { draining: true }));
  assertEquals(reg.inRotation(), []);
  reg.onHeartbeat(beat("c", { stalledMs: 20_000 }));
  assertEquals(reg.inRotation(), [], "c's figures are 20 s old: its main thread hangs");
  reg.model = "m";
  assertEquals(reg.onHeartbeat(beat("y", { model: "other" })), undefined);
});

Deno.test("routed prompts count as cached until a beat reports them, or for 30 s", () => {
  let now = 0;
  const reg = new ReplicaRegistry({ now: () => now });
  reg.onHeartbeat(beat("a"));
  reg.noteRouted("a", [11, 12]);
  const cachedOf = () => reg.get("a")!.cached;
  assert(cachedOf().has(11));
  // Beats that do not have them yet (a slow prefill) keep them assumed.
  now = 5000;
  reg.onHeartbeat(beat("a", { prefix: { blockSize: 16, hashes: [11] } }));
  assert(cachedOf().has(11) && cachedOf().has(12));
  assertEquals(reg.get("a")!.pending.has(11), false, "11 is confirmed");
  now = 31_000;
  reg.onHeartbeat(beat("a", { prefix: { blockSize: 16, hashes: [11] } }));
  assert(cachedOf().has(11));
  assertEquals(cachedOf().has(12), false, "12 never showed up in 30 s");
  assertEquals(reg.get("a")!.routed, 1);
});

Deno.test("replicas of two files with one name do not share a rotation: the model's identity decides", () => {
  const reg = new ReplicaRegistry({ now: () => 0 });
  // Heard before the router knew its model: both recorded.
  reg.onHeartbeat(beat("bin", { model: "stories260K", modelId: "1057-aa-ctx512" }));
  reg.onHeartbeat(beat("gguf", { model: "stories260K", modelId: "1185-bb-ctx128" }));
  reg.model = "stories260K";
  reg.modelId = "1057-aa-ctx512";
  assertEquals(reg.inRotation().map((v) => v.id), ["bin"]);
  reg.onHeartbeat(beat("gguf", { model: "stories260K", modelId: "1185-bb-ctx128" }));
  reg.onHeartbeat(beat("bin2", { model: "stories260K", modelId: "1057-aa-ctx512" }));
  assertEquals(reg.inRotation().map((v) => v.id), ["bin", "bin2"]);
});

Deno.test("a router is not ready while every replica in rotation is full, and ready again when one has room", () => {
  const reg = new ReplicaRegistry({ staleAfterMs: 1500, now: () => 0 });
  assertEquals(reg.readinessProblems(), ["no replica in rotation"]);
  const full = { ...beat("a").load, running: 4, waiting: 4 };
  reg.onHeartbeat(beat("a", { load: full }));
  reg.onHeartbeat(beat("b", { load: { ...full, running: 4, waiting: 3 } }));
  assertEquals(reg.readinessProblems(), [], "b has room for one more");
  reg.onHeartbeat(beat("b", { load: full }));
  assertEquals(reg.readinessProblems(), [
    "every replica is full (16 requests running or waiting, capacity 16)",
  ]);
  reg.onHeartbeat(beat("a", { load: { ...full, waiting: 0 } }));
  assertEquals(reg.readinessProblems(), []);
});

Deno.test("a replica of several models: its entry for the router's model gives the load, the hashes and whether it is loaded", () => {
  let now = 0;
  const reg = new ReplicaRegistry({ now: () => now, model: "y" });
  const multi = (replica: string, models: Heartbeat["models"], running = 0) =>
    beat(replica, {
      model: "x",
      models,
      load: { ...beat(replica).load, running, maxRunning: 4, maxWaiting: 4 },
    });
  // "a" has y loaded with 2 running (and 3 more running for x); "b" serves y, not loaded.
  reg.onHeartbeat(multi("a", [
    { name: "x", phase: "loaded", running: 3, waiting: 0, hashes: [1] },
    { name: "y", phase: "loaded", running: 2, waiting: 0, hashes: [7, 8] },
  ], 5));
  reg.onHeartbeat(
    multi("b", [{ name: "x", phase: "unloaded" }, { name: "y", phase: "unloaded" }], 1),
  );
  assertEquals(
    reg.onHeartbeat(multi("c", [{ name: "x", phase: "loaded" }])),
    undefined,
    "c does not serve y",
  );
  const byId = Object.fromEntries(reg.candidates(() => [7, 8], new Set()).map((c) => [c.id, c]));
  assertEquals(byId.a!.load, 2, "y's own scheduler");
  assertEquals(byId.a!.capacity, 8);
  assertEquals(byId.a!.matchedBlocks, 2);
  assertEquals(byId.a!.loaded, true);
  assertEquals(byId.b!.load, 1, "the replica's total: a new scheduler on a busy machine");
  assertEquals(byId.b!.capacity, 9);
  assertEquals(byId.b!.loaded, false);
  // Work sent to b makes it warm (it loads y) until a beat says loaded, or for 30 s.
  reg.noteRouted("b", []);
  assertEquals(reg.candidates(() => [], new Set()).find((c) => c.id === "b")!.loaded, true);
  now = 31_000;
  reg.onHeartbeat(multi("b", [{ name: "x", phase: "unloaded" }, { name: "y", phase: "unloaded" }]));
  assertEquals(reg.candidates(() => [], new Set()).find((c) => c.id === "b")!.loaded, false);
  reg.onHeartbeat(multi("b", [{ name: "y", phase: "loading" }]));
  assertEquals(
    reg.candidates(() => [], new Set()).find((c) => c.id === "b")!.loaded,
    true,
    "loading counts",
  );
});
