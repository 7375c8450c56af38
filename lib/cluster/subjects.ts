/**
 * The NATS subjects of the request plane. Whoever may publish on `requests(id)` can make a
 * replica generate (and read the answer on any subject it names), so these subjects must be
 * open only to routers and replicas: see docs/cluster.md, "Security".
 */
export const SUBJECT_ROOT = "llmserve";

export const subjects = {
  /** Heartbeats and goodbyes of every replica. */
  announce: `${SUBJECT_ROOT}.replicas`,
  /** Generate, credit, cancel and info requests for one replica. */
  requests: (replica: string) => `${SUBJECT_ROOT}.replica.${replica}`,
  /** Frames of every stream one router opened. */
  frames: (router: string) => `${SUBJECT_ROOT}.router.${router}.frames`,
  /** Announcements of every pipeline stage. */
  stages: `${SUBJECT_ROOT}.stages`,
  /** Attach requests for one pipeline stage. */
  stage: (id: string) => `${SUBJECT_ROOT}.stage.${id}`,
};

/** A NATS-safe random id (subject tokens may not contain '.', '*', '>' or spaces). */
export function randomId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
}
