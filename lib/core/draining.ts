/**
 * The one wording of a refusal because the server (or replica) is shutting down, whichever
 * layer refuses: the HTTP routes and fronts, the WebSocket upgrade, the serving core's
 * admission, request actor and embedding jobs, a cluster replica. Error code "draining" (503 with Retry-After over HTTP).
 */
export const DRAINING_MESSAGE =
  "The server is shutting down and accepts no new work; retry on another instance";

/** A generation the shutdown cut off before it finished. */
export const DRAINED_MESSAGE =
  "The server shut down before this generation finished; retry on another instance";

/** The refusal as a generation's error event. */
export const DRAINING_EVENT = {
  type: "error",
  code: "draining",
  message: DRAINING_MESSAGE,
} as const;
