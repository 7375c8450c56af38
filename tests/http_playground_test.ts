// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import { chromium } from "npm:playwright-core@1.65.1";
import { assertEquals } from "@std/assert";
import { startService, waitUntil } from "./_http_harness.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { compatPath } from "./harness/compat.ts";

/** The Chromium `deno task test` unpacks from npm (.ci/needs.ts) and names in CHROMIUM_PATH. */
function chromiumPath(): string {
  const path = Deno.env.get("CHROMIUM_PATH");
  if (path === undefined) {
    throw new Error(
      "CHROMIUM_PATH is unset: run this file through `deno task test tests/http_playground_test.ts`, " +
        "which provides Chromium, or set CHROMIUM_PATH to a Chromium binary",
    );
  }
  try {
    Deno.statSync(path);
  } catch {
    throw new Error(`CHROMIUM_PATH=${path}: no such file`);
  }
  return path;
}

Deno.test("the playground streams a prompt's tokens, cancels another, and shows the scheduler", async () => {
  await using svc = await startService(
    { tokenDelayMs: 25, contextLength: 4096, kvBlocksTotal: 77 },
    { statsIntervalMs: 100 },
  );
  const browser = await chromium.launch({
    executablePath: chromiumPath(),
    // Root in a container has no user namespaces for Chromium's sandbox.
    args: ["--no-sandbox"],
  });
  try {
    const page = await browser.newPage();
    const pageErrors: string[] = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    await page.goto(svc.base + "/");
    // Page-side checks are strings: the test is type-checked without the DOM library.
    const textIs = (sel: string, text: string) =>
      page.waitForFunction(
        `document.querySelector(${JSON.stringify(sel)})?.textContent === ${JSON.stringify(text)}`,
      );
    await textIs("#stat-conn", "open");
    await textIs("#stat-kv", "0 / 77");

    // First generation: tokens appear while it runs, then it finishes at max tokens.
    await page.fill("#prompt", "Once upon a time");
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "12");
    await page.click("#start");
    await page.waitForSelector('.gen[data-id="g1"][data-state="running"] .out:not(:empty)');
    await page.waitForSelector('.gen[data-id="g1"][data-state="length"]');
    const req = svc.backend.requests[0]!;
    assertEquals(
      req.prompt,
      svc.backend.tokenize("Once upon a time", { bos: true, special: false }),
    );
    assertEquals(req.sampling.temperature, 0);
    assertEquals(req.maxTokens, 12);
    const want = svc.backend.continuation("Once upon a time", 12, req.sampling).text;
    assertEquals(await page.textContent('.gen[data-id="g1"] .out'), want);

    // Second generation: long; the scheduler panel shows it running; Cancel stops it.
    await page.fill("#max-tokens", "2000");
    await page.click("#start");
    await page.waitForSelector('.gen[data-id="g2"][data-state="running"] .out:not(:empty)');
    await textIs("#stat-running", "1");
    await page.waitForFunction(`document.querySelector("#stat-kv").textContent !== "0 / 77"`);
    await page.click("#cancel");
    await page.waitForSelector('.gen[data-id="g2"][data-state="cancelled"]');
    await waitUntil(() => svc.backend.active === 0, "the cancelled generation to be released");
    await textIs("#stat-kv", "0 / 77");
    const tokensShown =
      (await page.textContent('.gen[data-id="g2"] .out'))!.trim().split(/\s+/).length;
    assertEquals(tokensShown < 2000, true);
    assertEquals(pageErrors, []);
    await page.close();
  } finally {
    await browser.close();
  }
  await waitUntil(() => svc.service.sockets === 0, "the page's socket to close");
});

Deno.test("the playground's chat mode, sampling controls, model line, prompts, timings and phone layout", async () => {
  await using svc = await startService(
    { tokenDelayMs: 2, contextLength: 4096, modelName: "stories260K" },
    { servedModelNames: ["tiny-stories"] },
  );
  const browser = await chromium.launch({ executablePath: chromiumPath(), args: ["--no-sandbox"] });
  let shots: string | undefined;
  try {
    for (
      const [size, viewport] of [
        ["desktop", { width: 1280, height: 900 }],
        ["phone", { width: 390, height: 844 }],
      ] as const
    ) {
      const page = await browser.newPage({ viewport });
      const pageErrors: string[] = [];
      page.on("pageerror", (e) => pageErrors.push(String(e)));
      await page.goto(svc.base + "/");
      const textIs = (sel: string, text: string) =>
        page.waitForFunction(
          `document.querySelector(${JSON.stringify(sel)})?.textContent === ${JSON.stringify(text)}`,
        );
      await textIs("#stat-conn", "open");
      // The model's served name and context come from GET /props.
      await textIs("#model-name", "tiny-stories");
      await textIs("#model-context", "4096");
      // This server has no result cache; the stats feed says so.
      await textIs("#stat-cache", "off");

      // Raw completion with every sampling control set.
      const before = svc.backend.requests.length;
      await page.fill("#prompt", "the cat sat");
      await page.fill("#temperature", "0.7");
      await page.fill("#top-p", "0.9");
      await page.fill("#top-k", "40");
      await page.fill("#max-tokens", "6");
      await page.fill("#seed", "1234");
      await page.fill("#stop", "zzz, \\n");
      await page.click("#start");
      const id1 = `g1`;
      await page.waitForSelector(`.gen[data-id="${id1}"][data-state="length"]`);
      const req = svc.backend.requests[before]!;
      assertEquals(req.prompt, svc.backend.tokenize("the cat sat", { bos: true, special: false }));
      assertEquals(req.sampling.temperature, 0.7);
      assertEquals(req.sampling.topP, 0.9);
      assertEquals(req.sampling.topK, 40);
      assertEquals(req.maxTokens, 6);
      assertEquals(req.stop, ["zzz", "\n"]);
      const want = svc.backend.continuation("the cat sat", 6, req.sampling).text;
      assertEquals(await page.textContent(`.gen[data-id="${id1}"] .out`), want);
      // The card shows its prompt and the done frame's timings.
      assertEquals(await page.textContent(`.gen[data-id="${id1}"] .prompt`), "the cat sat");
      const timings = (await page.textContent(`.gen[data-id="${id1}"] .timings`))!;
      for (const part of ["TTFT", "queued", "prefill", "decode", "total", "prompt"]) {
        assertEquals(timings.includes(part), true, timings);
      }

      // Chat mode: two turns; the second sends the first turn and its answer as history.
      await page.click("#mode-chat");
      await page.fill("#stop", "");
      await page.fill("#system", "Be brief.");
      await page.fill("#prompt", "Tell me a story");
      await page.click("#start");
      await page.waitForSelector(`.gen[data-id="g2"][data-state="length"]`);
      const firstAnswer = (await page.textContent(`.gen[data-id="g2"] .out`))!;
      await page.fill("#prompt", "And then?");
      await page.click("#start");
      await page.waitForSelector(`.gen[data-id="g3"][data-state="length"]`);
      const chat = svc.backend.requests.at(-1)!;
      // The fake core has no template, so the server's plain chat format is the oracle.
      assertEquals(
        chat.prompt,
        svc.backend.tokenize(
          `System: Be brief.\nUser: Tell me a story\nAssistant: ${firstAnswer}\nUser: And then?\nAssistant:`,
          { bos: true, special: false },
        ),
      );
      const shown = (await page.textContent(`.gen[data-id="g3"] .prompt`))!;
      assertEquals(shown.includes("user: And then?"), true, shown);
      assertEquals(shown.includes("system: Be brief."), true, shown);

      // Nothing wider than the viewport (no sideways scrolling on a phone).
      const overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth",
      );
      assertEquals(overflow, 0, `${size}: the page is ${overflow}px wider than the viewport`);
      // A fresh temp dir, not a fixed /tmp path another user's run may already own.
      shots ??= await Deno.makeTempDir({ prefix: "playground_screenshots_" });
      await page.screenshot({ path: `${shots}/playground-${size}.png`, fullPage: true });
      assertEquals(pageErrors, []);
      await page.close();
    }
  } finally {
    await browser.close();
    if (shots !== undefined) console.log(`screenshots in ${shots}`);
  }
  await waitUntil(() => svc.service.sockets === 0, "the pages' sockets to close");
});

Deno.test("on a server of several models the playground picks the model: its line, and its text", async () => {
  const [a, b] = ["stories260K-q4_1", "stories260K-q5_1"];
  const server = await spawnCpuServer(["--model", compatPath(a), "--model", compatPath(b)]);
  const browser = await chromium.launch({ executablePath: chromiumPath(), args: ["--no-sandbox"] });
  try {
    // The oracle: the same greedy prompt through /v1/completions, naming the model.
    const completion = async (model: string) => {
      const res = await fetch(`${server.base}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 12, temperature: 0 }),
      });
      assertEquals(res.status, 200);
      return (await res.json()).choices[0].text as string;
    };
    const page = await browser.newPage();
    const pageErrors: string[] = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    await page.goto(server.base + "/");
    await page.waitForSelector("#model-picker:not([hidden])");
    assertEquals(await page.$$eval("#model-pick option", (os) => os.map((o) => o.textContent)), [
      a,
      b,
    ]);
    await page.selectOption("#model-pick", b);
    await page.waitForFunction(
      `document.querySelector("#model-name")?.textContent === ${JSON.stringify(b)}`,
    );
    await page.waitForFunction(`document.querySelector("#stat-conn")?.textContent === "open"`);
    await page.fill("#prompt", "Once upon a time");
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "12");
    await page.click("#start");
    await page.waitForSelector('.gen[data-id="g1"][data-state="length"]', { timeout: 60_000 });
    assertEquals(await page.textContent('.gen[data-id="g1"] .out'), await completion(b));
    assertEquals(pageErrors, []);
  } finally {
    await browser.close();
    server.child.kill("SIGTERM");
    await server.child.status;
  }
  // The ready summary points at the playground too.
  const log = await server.log();
  assertEquals(/url .*\(playground, with a model picker;/.test(log), true, log);
});
