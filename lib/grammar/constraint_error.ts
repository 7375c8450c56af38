/** A request's output constraint cannot be served (it does not compile): a 400 for the client. */
export class ConstraintError extends Error {
  override readonly name = "ConstraintError";
}
