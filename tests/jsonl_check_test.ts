/**
 * The streaming JSONL check of uploads: however the bytes are cut into chunks, it counts the
 * lines splitLines() finds in the whole text, and refuses bad UTF-8, a non-JSON line, a line
 * over the limit and one line too many, naming the line.
 */
import { assertEquals, assertThrows } from "@std/assert";
import { JsonlChecker } from "../lib/batch/jsonl_check.ts";
import { splitLines } from "../lib/batch/batch_lines.ts";
import { ApiError } from "../lib/http/errors.ts";

const LIMITS = { maxLines: 1000, maxLineBytes: 4096 };

/** Feeds `bytes` cut at the given offsets; returns the line count. */
function check(bytes: Uint8Array, cuts: number[], limits = LIMITS): number {
  const c = new JsonlChecker(limits);
  let at = 0;
  for (const cut of [...cuts, bytes.length]) {
    c.push(bytes.subarray(at, cut));
    at = cut;
  }
  return c.end();
}

/** A small deterministic generator, so a failure can be replayed. */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

Deno.test("the line count equals splitLines' on the whole text, whatever the chunking", () => {
  const rows = [
    '{"custom_id":"a","body":{"prompt":"héllo ✓ 𝄞"}}',
    "",
    "   ",
    '{"custom_id":"b"}\r',
    "\t",
    "[1,2,3]",
    '"just a string"',
    '{"custom_id":"c"}',
  ];
  for (const trailing of ["", "\n", "\r\n", "\n\n"]) {
    const text = rows.join("\n") + trailing;
    const bytes = new TextEncoder().encode(text);
    const want = splitLines(text).length;
    const next = rng(7 + trailing.length);
    for (let trial = 0; trial < 200; trial++) {
      const cuts = Array.from(
        { length: Math.floor(next() * 8) },
        () => Math.floor(next() * bytes.length),
      ).sort((x, y) => x - y);
      assertEquals(check(bytes, cuts), want, `cuts ${cuts} trailing ${JSON.stringify(trailing)}`);
    }
  }
});

Deno.test("bad UTF-8, a non-JSON line, a long line and one line too many are refused, naming the line", () => {
  const enc = (s: string) => new TextEncoder().encode(s);
  // A 3-byte character cut short, across a chunk boundary: still refused.
  const bad = new Uint8Array([...enc('{"a":1}\n{"b":"'), 0xe2, 0x9c, ...enc('"}\n')]);
  const e1 = assertThrows(() => check(bad, [15]), ApiError);
  assertEquals([e1.status, e1.message.includes("line 2")], [400, true]);
  // The same character whole, split between two chunks: fine.
  const good = new Uint8Array([...enc('{"a":1}\n{"b":"'), 0xe2, 0x9c, 0x93, ...enc('"}\n')]);
  assertEquals(check(good, [15, 16]), 2);

  const e2 = assertThrows(() => check(enc('{"a":1}\n\n{nope}\n'), [3]), ApiError);
  assertEquals(e2.status, 400);
  assertEquals(e2.message.startsWith("Line 3 is not valid JSON"), true, e2.message);

  const long = enc(`{"a":1}\n{"p":"${"x".repeat(5000)}"}\n`);
  const e3 = assertThrows(() => check(long, [100, 2000]), ApiError);
  assertEquals(e3.message.includes("Line 2") && e3.message.includes("4096"), true, e3.message);

  const three = enc("{}\n{}\n\n{}\n");
  assertEquals(check(three, [], { maxLines: 3, maxLineBytes: 64 }), 3);
  const e4 = assertThrows(
    () => check(enc("{}\n{}\n\n{}\n{}"), [], { maxLines: 3, maxLineBytes: 64 }),
    ApiError,
  );
  assertEquals(
    e4.message,
    "The file has at least 4 request lines; the limit is 3 (--batch-max-lines)",
  );
});
