import { assert, assertEquals } from "@std/assert";
import { GREEDY, type StepPlan, type StepResult } from "../lib/engine/engine.ts";
import { Scheduler, schedulerConfig } from "../lib/core/scheduler.ts";
import type { SeqEvent } from "../lib/core/seq_events.ts";
import type { TokenConstraint } from "../lib/grammar/token_constraint.ts";
import { maskWords } from "../lib/engine/token_mask.ts";
import { FakeEngine } from "./harness/fake_engine.ts";

const VOCAB = 64;
const EOS = 0;

/** A grammar that spells `script` token by token, then may only end (EOS). */
class ScriptConstraint implements TokenConstraint {
  readonly stopIds = [EOS];
  at = 0;
  disposed = false;
  constructor(readonly script: readonly number[]) {}
  accept(token: number): boolean {
    if (token !== this.script[this.at]) return false;
    this.at++;
    return true;
  }
  nextMask(): Promise<Uint32Array> {
    const m = new Uint32Array(maskWords(VOCAB));
    const id = this.at < this.script.length ? this.script[this.at]! : EOS;
    m[id >>> 5]! |= 1 << (id & 31);
    return Promise.resolve(m);
  }
  dispose(): void {
    this.disposed = true;
  }
}

/**
 * Drives the scheduler as its actor does, `depth` steps in flight: masks are refreshed after
 * every result, before the next plan.
 */
async function drive(sched: Scheduler, engine: FakeEngine, depth: number): Promise<StepPlan[]> {
  const plans: StepPlan[] = [];
  const inFlight: Promise<StepResult>[] = [];
  for (let guard = 0; guard < 500; guard++) {
    await sched.refreshMasks();
    while (inFlight.length < depth) {
      const plan = sched.schedule();
      if (!plan) break;
      plans.push(plan);
      inFlight.push(engine.step(plan));
    }
    if (inFlight.length === 0) return plans;
    sched.onResult(await inFlight.shift()!);
  }
  throw new Error("the scheduler did not finish");
}

Deno.test("Scheduler decodes a constrained sequence only with its grammar's mask of the token it sampled last, while an unconstrained one keeps pipelining", async () => {
  const engine = new FakeEngine({
    vocabSize: VOCAB,
    numBlocks: 64,
    blockSize: 4,
    contextLength: 256,
  });
  const events = new Map<number, SeqEvent[]>([[1, []], [2, []]]);
  const sched = new Scheduler(
    schedulerConfig({ numBlocks: 64, blockSize: 4, contextLength: 256, vocabSize: VOCAB }),
    (e) => events.get(e.seqId)!.push(e),
  );
  const script = [7, 9, 11, 13, 15, 17];
  const constraint = new ScriptConstraint(script);
  const spec = {
    maxTokens: 40,
    sampling: GREEDY,
    stopTokenIds: [EOS],
    priority: "interactive" as const,
  };
  sched.submit({ ...spec, seqId: 1, prompt: [3, 4, 5], constraint });
  sched.submit({ ...spec, seqId: 2, prompt: [3, 4, 6], maxTokens: 24 });
  const plans = await drive(sched, engine, 3);

  const tokens = (id: number) =>
    events.get(id)!.flatMap((e) => e.type === "token" ? [e.token] : []);
  assertEquals(tokens(1), script);
  // The grammar was complete: it finished there, "stop", without sampling the end token.
  assertEquals(events.get(1)!.at(-1), {
    type: "finished",
    seqId: 1,
    reason: "stop",
    completionTokens: 6,
  });
  assert(constraint.disposed, "the matcher is freed when the sequence ends");
  const own = plans.flatMap((p) => p.seqs.filter((s) => s.seqId === 1));
  for (const s of own) {
    assert(!s.useLastSampled, "a constrained decode never feeds a token still in flight");
    if (s.sample) assert(s.tokenMask !== undefined, "every sample of it carries its mask");
  }
  // Three steps in flight: its token of step t is known when t ends, so it samples again in
  // step t + 3, the first planned after that.
  const sampledAt = plans.filter((p) => p.seqs.some((s) => s.seqId === 1 && s.sample)).map((p) =>
    p.stepId
  );
  assertEquals(sampledAt.slice(1).map((id, k) => id - sampledAt[k]!), [3, 3, 3, 3, 3]);
  // The unconstrained one was in every step until it ended, fed from the device.
  assertEquals(tokens(2).length, 24);
  const stepsOf2 = plans.filter((p) => p.seqs.some((s) => s.seqId === 2)).length;
  assertEquals(stepsOf2, 24);
  assert(plans.some((p) => p.seqs.some((s) => s.seqId === 2 && s.useLastSampled)));
});

Deno.test("Scheduler fails a constrained sequence whose engine sampled a token the grammar refuses, and disposes of a refused one's matcher", async () => {
  const engine = new FakeEngine({
    vocabSize: VOCAB,
    numBlocks: 64,
    blockSize: 4,
    contextLength: 256,
  });
  const log: SeqEvent[] = [];
  const sched = new Scheduler(
    schedulerConfig({ numBlocks: 64, blockSize: 4, contextLength: 256, vocabSize: VOCAB }),
    (e) => {
      if (e.seqId === 1) log.push(e);
    },
  );
  // A grammar whose mask says one thing and whose matcher wants another: an engine bug's shape.
  const liar = new ScriptConstraint([5, 6]);
  liar.nextMask = () => {
    const m = new Uint32Array(maskWords(VOCAB));
    m[0] = 1 << 9;
    return Promise.resolve(m);
  };
  const spec = {
    maxTokens: 8,
    sampling: GREEDY,
    stopTokenIds: [EOS],
    priority: "interactive" as const,
  };
  sched.submit({ ...spec, seqId: 1, prompt: [3, 4], constraint: liar });
  await drive(sched, engine, 2);
  const end = log.at(-1)!;
  assertEquals(end.type, "failed");
  assert(
    end.type === "failed" && /sampled token 9, which the grammar does not allow/.test(end.message),
  );
  assert(liar.disposed);
  const live = new ScriptConstraint([1]);
  const refused = new ScriptConstraint([1]);
  sched.submit({ ...spec, seqId: 2, prompt: [3], constraint: live });
  sched.submit({ ...spec, seqId: 2, prompt: [3], constraint: refused }); // duplicate id
  assert(refused.disposed && !live.disposed);
});
