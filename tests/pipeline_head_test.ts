/**
 * `deno task start --pipeline-parallel-size 2` as a real process: it starts its own
 * nats-server and stage process, and answers exactly as a one-process server does.
 */
import { assert, assertEquals, assertStringIncludes, assertThrows } from "@std/assert";
import { metricValue, scrape } from "./_http_harness.ts";
import { spawnCpuServer } from "./_serve_child.ts";
import { evenRanges } from "../lib/cli/pipeline_head.ts";
import { compatPath } from "./harness/compat.ts";
import { rng } from "./_gpu.ts";
import { otlpAttr, startOtlpCollector } from "./_otlp_collector.ts";
import { STAGE_HEARTBEAT_MISSES, STAGE_HEARTBEAT_MS } from "../lib/cluster/stage_messages.ts";

interface Answer {
  readonly text: string;
  readonly logprobs: readonly number[];
}

async function complete(base: string, prompt: string, seed?: number): Promise<Answer> {
  const r = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      prompt,
      max_tokens: 12,
      logprobs: 1,
      ...(seed === undefined ? { temperature: 0 } : { temperature: 0.9, seed }),
    }),
  });
  const body = await r.json();
  if (r.status !== 200) throw new Error(`${r.status}: ${JSON.stringify(body)}`);
  const c = body.choices[0];
  return { text: c.text, logprobs: c.logprobs.token_logprobs };
}

/** 16 prompts at once, half greedy and half seeded, then the first alone. */
async function answers(base: string): Promise<Answer[]> {
  const rand = rng(3);
  const words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "far", "away"];
  const prompts = Array.from(
    { length: 16 },
    () =>
      Array.from(
        { length: 3 + Math.floor(rand() * 8) },
        () => words[Math.floor(rand() * words.length)],
      ).join(" "),
  );
  const together = await Promise.all(
    prompts.map((p, i) => complete(base, p, i % 2 ? i : undefined)),
  );
  return [...together, await complete(base, prompts[0]!)];
}

/** The residual width (n_embd) of each compat model (compat/README.md). */
const WIDTH: Record<string, number> = { "llama3-like-q4_k_m": 256, "qwen2-like-q4_k_m": 128 };

for (const name of ["llama3-like-q4_k_m", "qwen2-like-q4_k_m"]) {
  Deno.test(`PP 2 started by the server (its own nats-server and stage process) answers 16 concurrent and 1 lone request, greedy and seeded, with the one-process server's tokens and logprobs (${name})`, async () => {
    const flags = ["--model", compatPath(name), "--threads", "1"];
    const single = await spawnCpuServer(flags);
    let want: Answer[];
    try {
      want = await answers(single.base);
    } finally {
      single.child.kill("SIGTERM");
      await single.child.status;
    }
    const pp = await spawnCpuServer([...flags, "--pipeline-parallel-size", "2"]);
    try {
      await pp.logMatch(/backend\s+pipeline of 2 cpu stages/);
      assertEquals(await answers(pp.base), want);
      // Per-stage series: the second stage was sent whole f32 rows of the model's width.
      const m = await scrape(pp.base);
      const at = (name: string, stage: number) =>
        metricValue(m, `${name}{stage="${stage}"}`) ?? NaN;
      const steps = at("llm_pipeline_stage_steps_total", 1);
      assert(steps > 0 && steps === at("llm_pipeline_stage_steps_total", 0), m);
      assert(at("llm_pipeline_stage_seconds_total", 1) > 0, m);
      assertEquals(at("llm_pipeline_stage_bytes_total", 0), 0);
      const bytes = at("llm_pipeline_stage_bytes_total", 1);
      assert(bytes > 0 && bytes % (4 * WIDTH[name]!) === 0, `${bytes} bytes`);
      // At rest no micro-batch waits at any stage; each stage idled for a share of the work,
      // and at every instant of work some stage was busy, so the busy shares cover it.
      assertEquals([
        at("llm_pipeline_stage_queue_depth", 0),
        at("llm_pipeline_stage_queue_depth", 1),
      ], [0, 0]);
      const bubbles = [0, 1].map((s) => at("llm_pipeline_stage_bubble_fraction", s));
      assert(bubbles.every((b) => b >= 0 && b < 1), `bubble fractions ${bubbles}`);
      assert((1 - bubbles[0]!) + (1 - bubbles[1]!) >= 1 - 1e-9, `bubble fractions ${bubbles}`);
    } finally {
      pp.child.kill("SIGTERM");
      await pp.child.status;
    }
    // Stopped with the server: its stage and nats-server.
    const log = await pp.log();
    assertEquals(/stage stage-\w+: stopped/.test(log), true, log);
  });
}

Deno.test("TP 2 started by the server (its own nats-server and `stage --tp-rank 1/2` process) answers 16 concurrent and 1 lone request, greedy and seeded, with the one-process server's tokens and logprobs (llama3-like: its one KV head on both ranks); TP with PP is refused", async () => {
  const flags = ["--model", compatPath("llama3-like-q4_k_m"), "--threads", "1"];
  const single = await spawnCpuServer(flags);
  let want: Answer[];
  try {
    want = await answers(single.base);
  } finally {
    single.child.kill("SIGTERM");
    await single.child.status;
  }
  const tp = await spawnCpuServer([...flags, "--tensor-parallel-size", "2"]);
  try {
    await tp.logMatch(/backend\s+tensor parallelism over 2 cpu ranks/);
    assertEquals(await answers(tp.base), want);
  } finally {
    tp.child.kill("SIGTERM");
    await tp.child.status;
  }
  const log = await tp.log();
  assertEquals(/stage stage-\w+: stopped/.test(log), true, log);
  const both = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-all",
      "main.ts",
      "serve",
      ...flags,
      "--tp",
      "2",
      "--pp",
      "2",
      "--port",
      "0",
    ],
    stdout: "null",
    stderr: "piped",
  }).output();
  assertEquals(both.code !== 0, true);
  assertStringIncludes(new TextDecoder().decode(both.stderr), "TP × PP is not built yet");
});

Deno.test("evenRanges splits layers into contiguous ranges, the first ones one longer; more stages than layers is refused", () => {
  assertEquals(evenRanges(5, 2), [{ start: 0, end: 3 }, { start: 3, end: 5 }]);
  assertEquals(evenRanges(16, 4).map((r) => r.end - r.start), [4, 4, 4, 4]);
  assertThrows(() => evenRanges(2, 3), Error, "Cannot split 2 layers into 3 pipeline stages");
});

/** A streamed completion's text; `onFirst` is called when its first token arrives. */
async function streamed(base: string, prompt: string, seed: number, onFirst: () => void) {
  const r = await fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: 48, temperature: 0.9, seed, stream: true }),
  });
  let text = "", buf = "";
  const decoder = new TextDecoder();
  for await (const chunk of r.body!) {
    buf += decoder.decode(chunk, { stream: true });
    const lines = buf.split("\n");
    buf = lines.pop()!;
    for (const line of lines) {
      if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
      const ev = JSON.parse(line.slice(6));
      if (ev.error) throw new Error(JSON.stringify(ev.error));
      text += ev.choices[0].text;
      if (text !== "") onFirst();
    }
  }
  return text;
}

/** The process ids of `pid`'s children whose command line contains `part`. */
async function childrenOf(pid: number, part: string): Promise<number[]> {
  const ids = (await Deno.readTextFile(`/proc/${pid}/task/${pid}/children`)).trim().split(/\s+/);
  const out: number[] = [];
  for (const id of ids.filter(Boolean)) {
    const cmd = await Deno.readTextFile(`/proc/${id}/cmdline`).catch(() => "");
    if (cmd.includes(part)) out.push(Number(id));
  }
  return out;
}

for (const layout of ["--pipeline-parallel-size", "--tensor-parallel-size"]) {
  Deno.test(`kill -9 of the stage process mid-stream at 8 streams (${layout} 2): the server starts it again, recomputes the sequences, and all 8 answers equal an uninterrupted run`, async () => {
    const flags = [
      "--model",
      compatPath("qwen2-like-q4_k_m"),
      "--threads",
      "1",
      layout,
      "2",
    ];
    const prompts = Array.from({ length: 8 }, (_, i) => `the cat number ${i} sat on a mat and`);
    const run = async (kill: boolean) => {
      const pp = await spawnCpuServer(flags);
      try {
        await pp.logMatch(/stage stage-\w+: attached/);
        const [stage] = await childrenOf(pp.child.pid, "\0stage\0");
        let killed: Promise<void> | undefined;
        const first = () => {
          if (!kill || killed) return;
          killed = Promise.resolve().then(() => Deno.kill(stage!, "SIGKILL"));
        };
        const texts = await Promise.all(
          prompts.map((p, i) => streamed(pp.base, p, 100 + i, first)),
        );
        if (kill) {
          await pp.logMatch(/failed \(epoch 0\)/); // the head saw the stage go
          assertEquals((await childrenOf(pp.child.pid, "\0stage\0")).length, 1);
        }
        return texts;
      } finally {
        pp.child.kill("SIGTERM");
        await pp.child.status;
      }
    };
    const want = await run(false);
    assertEquals(await run(true), want);
  });
}

for (const layout of ["--pipeline-parallel-size", "--tensor-parallel-size"]) {
  Deno.test(`a stage process stopped mid-stream (kill -STOP, ${layout} 2) is declared dead by the heartbeat within its bound, ended and started again, and all 8 answers equal an uninterrupted run`, async () => {
    const flags = [
      "--model",
      compatPath("qwen2-like-q4_k_m"),
      "--threads",
      "1",
      layout,
      "2",
    ];
    // Noticed within the misses' pings and the tick that finds them unanswered, plus a margin for
    // this loaded machine's scheduling.
    const boundMs = (STAGE_HEARTBEAT_MISSES + 1) * STAGE_HEARTBEAT_MS + 2000;
    const prompts = Array.from({ length: 8 }, (_, i) => `the cat number ${i} sat on a mat and`);
    const run = async (stop: boolean) => {
      const pp = await spawnCpuServer(flags);
      try {
        await pp.logMatch(/stage stage-\w+: attached/);
        const [stage] = await childrenOf(pp.child.pid, "\0stage\0");
        let stoppedAt: number | undefined;
        const noticed = stop
          ? pp.logMatch(/failed \(epoch 0\): stage \S+ \(layers \d+-\d+\).* heartbeats/)
            .then(() => Date.now())
          : undefined;
        noticed?.catch(() => {}); // awaited below; a server that exits fails the test there
        const first = () => {
          if (!stop || stoppedAt !== undefined) return;
          Deno.kill(stage!, "SIGSTOP");
          stoppedAt = Date.now();
        };
        const texts = await Promise.all(
          prompts.map((p, i) => streamed(pp.base, p, 100 + i, first)),
        );
        if (stop) {
          const took = (await noticed!) - stoppedAt!;
          assert(
            took <= boundMs,
            `the hung stage was noticed after ${took} ms, bound ${boundMs} ms`,
          );
          const now = await childrenOf(pp.child.pid, "\0stage\0");
          assertEquals(now.length, 1);
          assert(now[0] !== stage, "the stopped stage process was replaced");
        }
        return texts;
      } finally {
        pp.child.kill("SIGTERM");
        await pp.child.status;
      }
    };
    const want = await run(false);
    assertEquals(await run(true), want);
  });
}

Deno.test("PP 2 traces each stage step as an llm.pipeline.stage span linked to the request span, one per stage for each step", async () => {
  const collector = startOtlpCollector();
  const { spans } = collector;
  const pp = await spawnCpuServer(
    ["--model", compatPath("qwen2-like-q4_k_m"), "--threads", "1", "--pipeline-parallel-size", "2"],
    { env: collector.env },
  );
  try {
    await complete(pp.base, "the cat sat on the mat");
    pp.child.kill("SIGTERM");
    assertEquals((await pp.child.status).code, 0, await pp.log());
    const request = spans.filter((s) => s.name === "llm.request");
    assertEquals(request.length, 1, `spans: ${spans.map((s) => s.name).join(", ")}`);
    const r = request[0]!;
    const steps = spans.filter((s) => s.name === "llm.step");
    // Past the engine's warm-up step (id -1), served before any request.
    const stage = spans.filter((s) =>
      s.name === "llm.pipeline.stage" && otlpAttr(s, "llm.step.id") !== "-1"
    );
    // One request alone: each step is one micro-batch, sent to both stages.
    assert(steps.length >= 12, `${steps.length} step spans`);
    for (const n of [0, 1]) {
      const mine = stage.filter((s) => otlpAttr(s, "llm.pipeline.stage") === String(n));
      assertEquals(
        mine.map((s) => otlpAttr(s, "llm.step.id")).sort(),
        steps.map((s) => otlpAttr(s, "llm.step.id")).sort(),
        `stage ${n}`,
      );
    }
    for (const s of stage) {
      assertEquals(s.links?.map((l) => [l.traceId, l.spanId]), [[r.traceId, r.spanId]]);
      // Stage 0 embeds the tokens; stage 1 is sent whole f32 rows of the model's width.
      const bytes = Number(otlpAttr(s, "llm.pipeline.bytes"));
      if (otlpAttr(s, "llm.pipeline.stage") === "0") assertEquals(bytes, 0);
      else assert(bytes > 0 && bytes % (4 * WIDTH["qwen2-like-q4_k_m"]!) === 0, `${bytes} bytes`);
    }
  } finally {
    await collector.close();
  }
});
