/**
 * Web pages and the server: a page on another site, or one reached through a rebound DNS
 * name, cannot drive it; its own playground and listed origins can. Requests are written by
 * hand (rawHttp) because fetch() keeps Host and Origin to itself.
 */
import { assert, assertEquals, assertMatch } from "@std/assert";
import { OriginPolicy, sameOrigin } from "../lib/http/origin.ts";
import { rawHttp, startService } from "./_http_harness.ts";

const BODY = JSON.stringify({ prompt: "hi", max_tokens: 2 });

function post(
  host: string,
  headers: Record<string, string>,
  path = "/v1/completions",
  body = BODY,
): string {
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  return `POST ${path} HTTP/1.1\r\nHost: ${host}\r\n${lines}Content-Length: ${
    new TextEncoder().encode(body).byteLength
  }\r\nConnection: close\r\n\r\n${body}`;
}

function get(host: string, path: string, headers: Record<string, string> = {}): string {
  const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("");
  return `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n${lines}Connection: close\r\n\r\n`;
}

function upgrade(host: string, headers: Record<string, string> = {}): string {
  return get(host, "/v1/stream", {
    Upgrade: "websocket",
    Connection: "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
    ...headers,
  }).replace("Connection: close\r\n", "");
}

Deno.test("OriginPolicy: own origin, listed origins and globs pass; other pages and rebound names do not", () => {
  const p = new OriginPolicy(["http://localhost:*", "https://app.example.com"], ["llm.internal"]);
  const own = "127.0.0.1:8000";
  assertEquals(p.check(own, undefined), null, "no Origin: not a page's script");
  assertEquals(p.check(own, "http://127.0.0.1:8000"), null, "same origin");
  assertEquals(p.check(own, "http://localhost:5173"), null, "glob");
  assertEquals(p.check(own, "https://app.example.com"), null, "listed");
  assertMatch(p.check(own, "https://evil.example")!, /Origin "https:\/\/evil.example" may not/);
  assertMatch(p.check(own, "http://127.0.0.1:9999")!, /may not/, "another port is another origin");
  assertMatch(p.check(own, "null")!, /may not/, "sandboxed frames and file://");
  assertMatch(p.check("attacker.example:8000", undefined)!, /Host "attacker.example:8000"/);
  for (const host of ["localhost:8000", "[::1]:8000", "10.1.2.3", "LLM.internal:80"]) {
    assertEquals(p.check(host, undefined), null, host);
  }
  assert(!p.hostAllowed("999.1.1.1"), "not an IPv4 literal");
  // A rebinding page is same-origin with itself, but its Host is its own name: refused.
  assertMatch(p.check("rebind.example:8000", "http://rebind.example:8000")!, /Host/);
  assert(sameOrigin("http://localhost", "localhost:80"), "default port");
  assert(!new OriginPolicy(["*"]).check(own, "https://anything.example"));
});

Deno.test("a cross-origin text/plain POST (no preflight needed) is refused with 403 and never runs", async () => {
  await using svc = await startService();
  const host = new URL(svc.base).host;
  const res = await rawHttp(
    svc.base,
    post(host, { Origin: "https://evil.example", "Content-Type": "text/plain" }),
  );
  assertEquals(res.status, 403);
  const err = JSON.parse(res.body).error;
  assertEquals([err.code, err.type], ["forbidden_origin", "permission_error"]);
  assertMatch(err.message, /--cors-origin/);
  // The same body from the server's own origin is refused too, for its content type.
  const own = await rawHttp(
    svc.base,
    post(host, { Origin: `http://${host}`, "Content-Type": "text/plain;charset=UTF-8" }),
  );
  assertEquals(own.status, 415);
  assertEquals(JSON.parse(own.body).error.code, "unsupported_media_type");
  assertMatch(JSON.parse(own.body).error.message, /received "text\/plain;charset=UTF-8"/);
  assertEquals(svc.backend.requests.length, 0, "no generation ran");
  // application/json from the own origin runs.
  const ok = await rawHttp(
    svc.base,
    post(host, { Origin: `http://${host}`, "Content-Type": "application/json; charset=utf-8" }),
  );
  assertEquals(ok.status, 200, ok.body);
  assertEquals(svc.backend.requests.length, 1);
});

Deno.test("--cors-origin: a listed origin gets CORS headers and its preflight answered; others are refused", async () => {
  await using svc = await startService({}, { corsOrigins: ["http://localhost:*"] });
  const host = new URL(svc.base).host;
  const preflight = (origin: string) =>
    `OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: ${host}\r\nOrigin: ${origin}\r\n` +
    "Access-Control-Request-Method: POST\r\n" +
    "Access-Control-Request-Headers: content-type, authorization\r\nConnection: close\r\n\r\n";
  const ok = await rawHttp(svc.base, preflight("http://localhost:5173"));
  assertEquals(ok.status, 204, ok.head);
  assertMatch(ok.head, /access-control-allow-origin: http:\/\/localhost:5173/i);
  assertMatch(ok.head, /access-control-allow-headers: authorization,content-type/i);
  assertMatch(ok.head, /access-control-allow-methods: GET,POST,OPTIONS/i);
  const refused = await rawHttp(svc.base, preflight("https://evil.example"));
  assertEquals(refused.status, 403);
  assert(!/access-control-allow-origin/i.test(refused.head));
  const call = await rawHttp(
    svc.base,
    post(host, { Origin: "http://localhost:5173", "Content-Type": "application/json" }),
  );
  assertEquals(call.status, 200, call.body);
  assertMatch(call.head, /access-control-allow-origin: http:\/\/localhost:5173/i);
  assertMatch(call.head, /vary: origin/i);
});

Deno.test("Host: a DNS name the server was not configured with is refused (DNS rebinding), IPs and localhost pass", async () => {
  await using svc = await startService({}, { allowedHosts: ["llm.internal"] });
  const port = new URL(svc.base).port;
  for (const path of ["/", "/metrics", "/v1/models"]) {
    const res = await rawHttp(svc.base, get(`rebind.attacker.example:${port}`, path));
    assertEquals(res.status, 403, path);
    assertEquals(JSON.parse(res.body).error.code, "forbidden_host");
    assertMatch(JSON.parse(res.body).error.message, /--allowed-host/);
  }
  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `llm.internal:${port}`]) {
    assertEquals((await rawHttp(svc.base, get(host, "/v1/models"))).status, 200, host);
  }
});

Deno.test("WebSocket upgrades: cross-origin refused with 403, same-origin and listed accepted, bad handshakes 400, draining 503", async () => {
  await using svc = await startService({}, { corsOrigins: ["https://app.example.com"] });
  const host = new URL(svc.base).host;
  const cross = await rawHttp(svc.base, upgrade(host, { Origin: "https://evil.example" }));
  assertEquals(cross.status, 403);
  for (const origin of [`http://${host}`, "https://app.example.com"]) {
    const res = await rawHttp(svc.base, upgrade(host, { Origin: origin }));
    assertEquals(res.status, 101, origin);
  }
  const noKey = await rawHttp(
    svc.base,
    upgrade(host).replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""),
  );
  assertEquals(noKey.status, 400, "a missing Sec-WebSocket-Key is the client's fault, not a 500");
  const v8 = await rawHttp(svc.base, upgrade(host, { "Sec-WebSocket-Version": "8" }));
  assertEquals(v8.status, 426);
  assertMatch(v8.head, /sec-websocket-version: 13/i);
  await svc.service.drain({ timeoutMs: 10 });
  const late = await rawHttp(svc.base, upgrade(host));
  assertEquals(late.status, 503, "after SIGTERM an upgrade is refused, not accepted and failed");
  assertMatch(late.head, /retry-after: 1/i);
});

Deno.test("a wrong method on a route is 405 with Allow, not 404", async () => {
  await using svc = await startService();
  for (
    const [method, path, allow] of [
      ["GET", "/v1/completions", "POST"],
      ["GET", "/v1/chat/completions", "POST"],
      ["POST", "/health", "GET, HEAD"],
      ["DELETE", "/v1/models", "GET, HEAD"],
      ["PUT", "/v1/models/fake-llama", "GET, HEAD"],
    ]
  ) {
    const res = await fetch(svc.base + path, { method });
    const body = await res.json();
    assertEquals(res.status, 405, `${method} ${path}`);
    assertEquals(res.headers.get("allow"), allow);
    assertEquals(body.error.code, "method_not_allowed");
    assertMatch(body.error.message, new RegExp(`${path} does not take ${method}; use ${allow}`));
  }
  assertEquals((await (await fetch(svc.base + "/v2/nothing")).json()).error.code, "not_found");
});

Deno.test("seeds: every safe integer (|seed| <= 2^53 - 1) is accepted, 2^53 is refused naming the limit", async () => {
  await using svc = await startService();
  const ask = (seed: number) =>
    fetch(svc.base + "/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: `{"prompt":"hi","max_tokens":1,"seed":${seed}}`,
    });
  for (const seed of [Number.MAX_SAFE_INTEGER, Number.MIN_SAFE_INTEGER]) {
    const res = await ask(seed);
    assertEquals(res.status, 200, `${seed}: ${await res.clone().text()}`);
    await res.body?.cancel();
  }
  const res = await ask(2 ** 53);
  const err = (await res.json()).error;
  assertEquals([res.status, err.param], [400, "seed"]);
  assertMatch(err.message, /9007199254740992/);
});
