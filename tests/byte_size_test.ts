import { assertEquals, assertThrows } from "@std/assert";
import { formatBytes, parseByteSize } from "../lib/util/byte_size.ts";

Deno.test("parseByteSize() reads binary and decimal units", () => {
  assertEquals(parseByteSize("256MiB"), 256 * 1024 * 1024);
  assertEquals(parseByteSize("1.5 GB"), 1_500_000_000);
  assertEquals(parseByteSize("4096"), 4096);
  assertEquals(parseByteSize("2kib"), 2048);
});

Deno.test("parseByteSize() names the bad input", () => {
  assertThrows(() => parseByteSize("12 parsecs"), Error, 'received "12 parsecs"');
  assertThrows(() => parseByteSize("-5MiB"), Error, "Cannot parse byte size");
});

Deno.test("formatBytes() picks a binary unit", () => {
  assertEquals(formatBytes(512), "512 B");
  assertEquals(formatBytes(256 * 1024 * 1024), "256.0 MiB");
  assertEquals(formatBytes(3 * 1024 ** 3), "3.0 GiB");
});
