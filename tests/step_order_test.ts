/**
 * StepOrder: steps enter in call order, a decode from the last sampled token gets the token its
 * earlier step samples, and a sequence is released on every link after its last step.
 */
import { assertEquals, assertRejects } from "@std/assert";
import { GREEDY, type SeqInput, type StepPlan, type StepResult } from "../lib/engine/engine.ts";
import type { StageLink } from "../lib/engine/stage_link.ts";
import { StepOrder } from "../lib/engine/step_order.ts";

const seq = (seqId: number, extra: Partial<SeqInput> = {}): SeqInput => ({
  seqId,
  tokens: [1],
  startPos: 0,
  blockTable: [0],
  sample: true,
  sampling: GREEDY,
  ...extra,
});

/** A link that records what it is told; it is never stepped here. */
function recordingLink(events: string[], name: string): StageLink {
  return {
    stage: { start: 0, end: 1 },
    stepStage: () => Promise.reject(new Error("not stepped in these tests")),
    release: (seqId) => events.push(`${name} release ${seqId}`),
    dispose: () => events.push(`${name} dispose`),
  };
}

Deno.test("a decode from the last sampled token enters with the token its earlier step sampled", async () => {
  const order = new StepOrder([]);
  const first: StepPlan = { stepId: 1, seqs: [seq(3, { tokens: [5, 6] })] };
  const result = Promise.withResolvers<StepResult>();
  const sentFirst = order.enter(first, (p) => p);
  order.sampling(first, result.promise);
  const decode: StepPlan = {
    stepId: 2,
    seqs: [seq(3, { tokens: [], useLastSampled: true, startPos: 2 }), seq(4)],
  };
  const sentDecode = order.enter(decode, (p) => p);
  assertEquals(await sentFirst, first);
  result.resolve({ stepId: 1, sampled: [{ seqId: 3, token: 42, logprob: 0 }] });
  const sent = await sentDecode;
  assertEquals(sent.seqs[0]!.tokens, [42]);
  assertEquals(sent.seqs[0]!.useLastSampled, false);
  assertEquals(sent.seqs[1], decode.seqs[1]);
});

Deno.test("a decode from the last sampled token of a sequence that sampled none is refused, naming it", async () => {
  const order = new StepOrder([]);
  const plan: StepPlan = { stepId: 7, seqs: [seq(9, { tokens: [], useLastSampled: true })] };
  await assertRejects(
    () => order.enter(plan, (p) => p),
    Error,
    "Invalid step 7: seq 9 decodes from its last sampled token, but it has sampled none",
  );
});

Deno.test("a sequence is released on every link only after the step that samples it ends", async () => {
  const events: string[] = [];
  const released = Promise.withResolvers<void>();
  const links = [recordingLink(events, "a"), recordingLink(events, "b")];
  links[1] = {
    ...links[1]!,
    release: (id) => (events.push(`b release ${id}`), released.resolve()),
  };
  const order = new StepOrder(links);
  const plan: StepPlan = { stepId: 1, seqs: [seq(3)] };
  const result = Promise.withResolvers<StepResult>();
  await order.enter(plan, (p) => p);
  order.sampling(plan, result.promise);
  order.release(3);
  // A step called after the release has entered: the release's turn in the order has come.
  await order.enter({ stepId: 2, seqs: [] }, (p) => p);
  events.push("step ended");
  result.resolve({ stepId: 1, sampled: [{ seqId: 3, token: 8, logprob: 0 }] });
  await released.promise;
  assertEquals(events, ["step ended", "a release 3", "b release 3"]);
  order.dispose();
  assertEquals(events.slice(3), ["a dispose", "b dispose"]);
});
