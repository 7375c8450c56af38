/**
 * The pipeline stages' work as Prometheus series (llm_pipeline_stage_*{stage}) and as one
 * "llm.pipeline.stage" span per stage step, linked to the request spans of the sequences it
 * served (as actors/step_tracing.ts links "llm.step"). One observer lives across every build
 * of the pipeline (each executor restart), so the series count on.
 */
import { type Link, trace } from "@opentelemetry/api";
import type { StageObserver, StageStep } from "../engine/pipeline_engine.ts";
import { StageOccupancy } from "../engine/stage_occupancy.ts";
import type { ServiceMetrics } from "../http/service_metrics.ts";

/** The request spans of these sequences, to link a stage step's span to. */
export type RequestLinks = (seqIds: readonly number[]) => Link[];

/** The help text of each per-stage series (each labelled by stage), by name. */
const HELP = {
  llm_pipeline_stage_seconds_total:
    "Time from sending each step (each micro-batch) to a pipeline stage to its answer, queueing included.",
  llm_pipeline_stage_steps_total: "Steps (micro-batches) each pipeline stage answered.",
  llm_pipeline_stage_bytes_total: "Bytes of activation rows sent to each pipeline stage.",
  llm_pipeline_stage_queue_depth:
    "Micro-batches sent to each pipeline stage and not yet answered (queued, computed or on the wire).",
  llm_pipeline_stage_bubble_fraction:
    "Share of the time the pipeline had work that each stage sat idle, since the start, 0 to 1.",
} as const;

export function stageObserver(
  metrics: ServiceMetrics,
  stages: number,
  links: () => RequestLinks | undefined,
): StageObserver {
  const r = metrics.registry;
  const byStage = (name: keyof typeof HELP) => [name, HELP[name], ["stage"]] as const;
  const seconds = r.counter(...byStage("llm_pipeline_stage_seconds_total"));
  const steps = r.counter(...byStage("llm_pipeline_stage_steps_total"));
  const bytes = r.counter(...byStage("llm_pipeline_stage_bytes_total"));
  const depth = r.gauge(...byStage("llm_pipeline_stage_queue_depth"));
  const bubble = r.gauge(...byStage("llm_pipeline_stage_bubble_fraction"));
  const occupancy = new StageOccupancy(stages);
  const tracer = trace.getTracer("llmserve");
  const update = () => {
    for (let s = 0; s < stages; s++) {
      depth.set(occupancy.depth(s), { stage: String(s) });
      bubble.set(occupancy.bubbleFraction(s), { stage: String(s) });
    }
  };
  update();
  return {
    sent: (stage) => {
      occupancy.sent(stage);
      update();
    },
    answered: (step: StageStep) => {
      occupancy.answered(step.stage);
      update();
      const labels = { stage: String(step.stage) };
      seconds.inc(labels, step.ms / 1000);
      bytes.inc(labels, step.bytes);
      if (step.error === undefined) steps.inc(labels);
      const start = performance.timeOrigin + step.startedAt;
      const span = tracer.startSpan("llm.pipeline.stage", {
        startTime: start,
        links: links()?.(step.plan.seqs.map((s) => s.seqId)) ?? [],
        attributes: {
          "llm.pipeline.stage": step.stage,
          "llm.step.id": step.plan.stepId,
          "llm.batch_size": step.plan.seqs.length,
          "llm.pipeline.bytes": step.bytes,
        },
      });
      if (step.error !== undefined) span.recordException(step.error as Error);
      span.end(start + step.ms);
    },
  };
}
