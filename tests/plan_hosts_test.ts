/**
 * The planner's hosts and link: the compact `--hosts` syntax, bandwidths and latencies, and the
 * hosts file, whose errors name the field and the value received.
 */
import { assertEquals, assertThrows } from "@std/assert";
import {
  parseBandwidth,
  parseHostList,
  parseHostsFile,
  parseLatency,
} from "../lib/cluster/plan_hosts.ts";

const GIB = 2 ** 30;

Deno.test("--hosts groups: count, memory, threads and speed, one host and 1 thread by default", () => {
  assertEquals(parseHostList("4x16GiB@1thr").map((h) => [h.name, h.memoryBytes, h.threads]), [
    ["host 1", 16 * GIB, 1],
    ["host 2", 16 * GIB, 1],
    ["host 3", 16 * GIB, 1],
    ["host 4", 16 * GIB, 1],
  ]);
  assertEquals(parseHostList("2x8GB@4thr*1.5, 64GiB"), [
    { name: "host 1", memoryBytes: 8e9, threads: 4, speed: 1.5 },
    { name: "host 2", memoryBytes: 8e9, threads: 4, speed: 1.5 },
    { name: "host 3", memoryBytes: 64 * GIB, threads: 1, speed: 1 },
  ]);
});

Deno.test("a --hosts group that cannot be read says which and what the syntax is", () => {
  assertThrows(
    () => parseHostList("4x16GiB@fast"),
    Error,
    '"4x16GiB@fast" is not a host group: expected [COUNTx]MEMORY[@THREADSthr][*SPEED]',
  );
  assertThrows(() => parseHostList("0x16GiB"), Error, '"0x16GiB": the count, the threads');
  assertThrows(() => parseHostList("4x16 gigs"), Error, '"4x16 gigs": Cannot parse byte size');
  assertThrows(() => parseHostList("2000x1GiB"), Error, "2000 hosts; a plan takes at most 1024");
});

Deno.test("bandwidths in bits or bytes per second, latencies with their unit", () => {
  assertEquals(parseBandwidth("1Gbit/s"), 1.25e8);
  assertEquals(parseBandwidth("100Mb/s"), 1.25e7);
  assertEquals(parseBandwidth("100Mbps"), 1.25e7);
  assertEquals(parseBandwidth("1.2GB/s"), 1.2e9);
  assertEquals(parseBandwidth("loopback"), Infinity);
  assertThrows(() => parseBandwidth("fast"), Error, '"fast" is not a bandwidth: expected e.g.');
  assertThrows(() => parseBandwidth("0Gbit/s"), Error, '"0Gbit/s" is not a bandwidth');
  assertEquals(parseLatency("50ms"), 0.05);
  assertEquals(parseLatency("100us"), 1e-4);
  assertEquals(parseLatency("0"), 0);
  assertEquals(parseLatency("1s"), 1);
  // A bare number is ambiguous: seconds or milliseconds?
  assertThrows(() => parseLatency("5"), Error, '"5" is not a latency: expected e.g. 50ms');
});

Deno.test("a hosts file: groups by count and name, memory as text or bytes, its own link", () => {
  const f = parseHostsFile(
    JSON.stringify({
      hosts: [
        { name: "big", memory: "64GiB", threads: 8, speed: 2 },
        { name: "pi", count: 2, memory: 8e9 },
        { memory: "16GB" },
      ],
      link: { bandwidth: "10Gbit/s", latency: "0.1ms" },
    }),
    "hosts.json",
  );
  assertEquals(f.hosts, [
    { name: "big", memoryBytes: 64 * GIB, threads: 8, speed: 2 },
    { name: "pi 1", memoryBytes: 8e9, threads: 1, speed: 1 },
    { name: "pi 2", memoryBytes: 8e9, threads: 1, speed: 1 },
    { name: "host 4", memoryBytes: 16e9, threads: 1, speed: 1 },
  ]);
  assertEquals(f.link, { bandwidthBytesPerSecond: 1.25e9, latencySeconds: 1e-4 });
});

Deno.test("a hosts file's errors name the file, each bad field and the value received", () => {
  const bad = (json: unknown) => {
    try {
      parseHostsFile(typeof json === "string" ? json : JSON.stringify(json), "h.json");
    } catch (e) {
      return (e as Error).message;
    }
    throw new Error("accepted");
  };
  assertEquals(
    bad({ hosts: [{ memory: "16 gigs" }, { memory: "1GiB", threads: 0, speed: -1 }] }),
    "Hosts file h.json is invalid:\n" +
      '  hosts[0].memory: Cannot parse byte size: expected a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB), received "16 gigs"\n' +
      "  hosts[1].threads: must be at least 1 (received 0)\n" +
      "  hosts[1].speed: must be above 0 (received -1)",
  );
  assertEquals(
    bad({ hosts: [{ memory: "1GiB", cores: 4 }] }),
    'Hosts file h.json is invalid:\n  hosts[0]: Unrecognized key: "cores" (received {"memory":"1GiB","cores":4})',
  );
  assertEquals(
    bad({ hosts: [] }),
    "Hosts file h.json is invalid:\n  hosts: must list at least one host (received [])",
  );
  assertEquals(
    bad({ hosts: [{ memory: "1GiB" }], link: { bandwidth: "fast", latency: "1ms" } }),
    "Hosts file h.json is invalid:\n" +
      '  link.bandwidth: "fast" is not a bandwidth: expected e.g. 1Gbit/s, 100Mb/s, 100Mbps, 1.2GB/s or loopback',
  );
  assertEquals(bad("{hosts").startsWith("Hosts file h.json is not JSON: "), true);
});
