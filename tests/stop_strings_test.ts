import { assertEquals } from "@std/assert";
import { StopMatcher } from "../lib/core/stop_strings.ts";
import { prng } from "./_scheduler_harness.ts";

/** Streams `text` in the given pieces; returns what was emitted and whether it stopped. */
function stream(stops: string[], pieces: string[]): { out: string; stopped: boolean } {
  const m = new StopMatcher(stops);
  let out = "";
  for (const p of pieces) {
    const r = m.push(p);
    out += r.text;
    if (r.stopped) return { out, stopped: true };
  }
  return { out: out + m.flush(), stopped: false };
}

Deno.test("StopMatcher.push() holds back a possible stop-string start until the next piece decides", () => {
  const m = new StopMatcher(["\n\n", "END"]);
  assertEquals(m.push("Hello\n"), { text: "Hello", stopped: false });
  assertEquals(m.push("World E"), { text: "\nWorld ", stopped: false });
  assertEquals(m.push("N"), { text: "", stopped: false });
  assertEquals(m.push("D and more"), { text: "", stopped: true });
  assertEquals(m.push("x"), { text: "", stopped: true }, "nothing passes after a stop");
  assertEquals(m.flush(), "");
});

Deno.test("StopMatcher.flush() releases held text that never became a stop string", () => {
  const m = new StopMatcher(["STOP"]);
  assertEquals(m.push("abc ST"), { text: "abc ", stopped: false });
  assertEquals(m.flush(), "ST");
});

Deno.test("StopMatcher cuts at the earliest stop string, whichever is listed first", () => {
  assertEquals(stream(["cd", "b"], ["abcd"]), { out: "a", stopped: true });
  assertEquals(
    stream(["", "x"], ["ab"]),
    { out: "ab", stopped: false },
    "empty stop strings are ignored",
  );
});

Deno.test("StopMatcher stops as soon as a stop string is complete, not at one that would start earlier later", () => {
  // After "b\n\na" the text holds "\na": generation ends there, although "\n\nab" (starting one
  // character earlier) would have completed with the next piece.
  assertEquals(stream(["\n\nab", "\na"], ["b", "\n\na", "b"]), { out: "b\n", stopped: true });
  assertEquals(stream(["\n\nab", "\na"], ["b", "\n\nab"]), { out: "b", stopped: true });
});

Deno.test("StopMatcher gives the same cut as searching each streamed prefix of the text", () => {
  const r = prng(7);
  for (let trial = 0; trial < 3000; trial++) {
    const text = Array.from({ length: r(40) }, () => "ab\n"[r(3)]!).join("");
    const stops = Array.from(
      { length: 1 + r(3) },
      () => Array.from({ length: 1 + r(4) }, () => "ab\n"[r(3)]!).join(""),
    );
    const pieces: string[] = [];
    for (let i = 0; i < text.length;) {
      const n = r(5);
      pieces.push(text.slice(i, i + n));
      i += n;
    }
    // Oracle: the first prefix (at a piece boundary) containing a stop string decides; the cut is
    // at the earliest occurrence in that prefix.
    let want = { out: text, stopped: false };
    let end = 0;
    for (const p of pieces) {
      end += p.length;
      const prefix = text.slice(0, end);
      const cut = Math.min(...stops.map((s) => prefix.indexOf(s)).filter((i) => i >= 0));
      if (Number.isFinite(cut)) {
        want = { out: text.slice(0, cut), stopped: true };
        break;
      }
    }
    assertEquals(stream(stops, pieces), want, JSON.stringify({ text, stops, pieces }));
  }
});

Deno.test("StopMatcher.matched names the stop string that ended the text: the earliest in it", () => {
  const m = new StopMatcher(["END", "\n\n"]);
  assertEquals(m.push("one\n"), { text: "one", stopped: false });
  assertEquals(m.matched, undefined, "nothing matched yet");
  // Both stops complete in this piece; "\n\n" starts first, so it is the one that ended it.
  assertEquals(m.push("\nEND"), { text: "", stopped: true });
  assertEquals(m.matched, "\n\n");
  const n = new StopMatcher(["\n\n", "END"]);
  assertEquals(n.push("xEND\n\n").stopped, true);
  assertEquals(n.matched, "END");
});
