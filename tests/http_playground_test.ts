// deno-lint-ignore no-import-prefix -- not in the import map (deno.json is the lead's); pinned here
import { chromium } from "npm:playwright-core@1.65.1";
import { assertEquals } from "@std/assert";
import { fakeToken } from "./_fake_backend.ts";
import { startService, waitUntil } from "./_http_harness.ts";

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
  await using svc = startService(
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
    assertEquals(req.prompt, "Once upon a time");
    assertEquals(req.sampling.temperature, 0);
    assertEquals(req.maxTokens, 12);
    let want = "";
    for (let i = 0; i < 12; i++) want += fakeToken("Once upon a time", req.sampling.seed, i).text;
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
