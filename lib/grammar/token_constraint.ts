/**
 * A grammar's state for one sequence: which tokens may come next, advanced by each token the
 * sequence samples. The scheduler owns it from submission to the sequence's end.
 */
export interface TokenConstraint {
  /** Feeds the sampled token; false when the grammar does not allow it (nothing changes then). */
  accept(token: number): boolean;
  /**
   * The tokens allowed next: bit (id % 32) of word (id / 32) set for an allowed id, one word
   * per 32 ids of the vocabulary. Stop tokens are allowed where the grammar may end.
   */
  nextMask(): Promise<Uint32Array>;
  /** Ids that end a generation (EOS, end of turn): the only ones allowed once it is complete. */
  readonly stopIds: readonly number[];
  /** Frees the matcher's memory; the constraint is unusable afterwards. */
  dispose(): void;
}
