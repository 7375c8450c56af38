/** A request's output constraint cannot be served (it does not compile): a 400 for the client. */
export class ConstraintError extends Error {
  override readonly name = "ConstraintError";
}

/** The grammar engine cannot be had right now (it failed to start): a 503; a later request retries. */
export class GrammarUnavailableError extends Error {
  override readonly name = "GrammarUnavailableError";
}
