import { assertEquals } from "@std/assert";
import { Hono } from "hono";
import { RouteTable } from "../lib/http/route_table.ts";
import { metricValue, startService } from "./_http_harness.ts";

Deno.test("RouteTable reads hono's registered routes: labels, Allow, middleware left out", () => {
  const app = new Hono();
  app.use("*", async (_c, next) => await next());
  app.get("/health", (c) => c.text("ok"));
  app.post("/v1/completions", (c) => c.text("ok"));
  app.get("/v1/models/:model{.+}", (c) => c.text("ok"));
  app.get("/v1/batches/:id", (c) => c.text("ok"));
  app.post("/v1/batches/:id/cancel", (c) => c.text("ok"));
  const routes = new RouteTable(() => app.routes);
  assertEquals(routes.label("GET", "/health"), "/health");
  assertEquals(routes.label("HEAD", "/health"), "/health");
  assertEquals(routes.label("POST", "/health"), "/health", "a wrong method keeps the route label");
  assertEquals(routes.label("GET", "/v1/models/org/name"), "/v1/models/:model");
  assertEquals(routes.label("GET", "/nothing/here"), "unmatched", "middleware is no route");
  assertEquals(routes.allowed("/health"), "GET, HEAD");
  assertEquals(routes.allowed("/v1/completions"), "POST");
  assertEquals(routes.allowed("/v1/batches/b1/cancel"), "POST");
  assertEquals(routes.allowed("/v1/batches/b1"), "GET, HEAD");
  assertEquals(routes.allowed("/nothing"), undefined);
  assertEquals(routes.patternFor("HEAD", "/health"), "/health");
  assertEquals(routes.patternFor("POST", "/health"), undefined);
});

Deno.test("routes mounted through extend get their own label and 405 with Allow", async () => {
  await using svc = await startService({}, {
    extend: (app) => {
      app.post("/v1/things/:id", (c) => c.json({ id: c.req.param("id") }));
    },
  });
  const ok = await fetch(svc.base + "/v1/things/t1", { method: "POST" });
  assertEquals(await ok.json(), { id: "t1" });
  const wrong = await fetch(svc.base + "/v1/things/t1");
  assertEquals(wrong.status, 405);
  assertEquals(wrong.headers.get("allow"), "POST");
  assertEquals((await wrong.json()).error.code, "method_not_allowed");
  const text = svc.service.metrics.render();
  for (const status of ["200", "405"]) {
    const method = status === "200" ? "POST" : "GET";
    assertEquals(
      metricValue(
        text,
        `llm_http_requests_total{method="${method}",route="/v1/things/:id",status="${status}"}`,
      ),
      1,
      text.split("\n").filter((l) => l.startsWith("llm_http_requests_total")).join("\n"),
    );
  }
});

Deno.test("a JSON body whose Content-Length passes the limit is 413 on every route, extend's too", async () => {
  let reached = false;
  await using svc = await startService({}, {
    maxBodyBytes: 64,
    extend: (app) => {
      app.post("/v1/things", (c) => {
        reached = true;
        return c.json({});
      });
    },
  });
  const big = JSON.stringify({ prompt: "x".repeat(100) });
  for (const path of ["/v1/completions", "/tokenize", "/v1/things"]) {
    const res = await fetch(svc.base + path, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: big,
    });
    assertEquals(res.status, 413, path);
    assertEquals((await res.json()).error.code, "payload_too_large");
  }
  assertEquals(reached, false, "the route never ran");
  // Other media pass to the route (the batch file upload has a limit of its own).
  const form = await fetch(svc.base + "/v1/things", { method: "POST", body: "x".repeat(100) });
  await form.body?.cancel();
  assertEquals(reached, true);
});
