/**
 * API key check. Keys are compared as SHA-256 digests, byte by byte with no early exit and
 * against every configured key, so the time taken says nothing about how much of a guess
 * was right or which key it was close to.
 */
export class ApiKeyVerifier {
  #digests: Promise<Uint8Array[]>;
  readonly enabled: boolean;

  constructor(keys: readonly string[]) {
    this.enabled = keys.length > 0;
    this.#digests = Promise.all(keys.map(digest));
  }

  /** True when keys are off, or `candidate` is one of them. */
  async verify(candidate: string | null): Promise<boolean> {
    if (!this.enabled) return true;
    if (candidate === null) return false;
    const [digests, got] = await Promise.all([this.#digests, digest(candidate)]);
    let match = 0;
    for (const d of digests) match |= constantTimeEqual(d, got) ? 1 : 0;
    return match === 1;
  }
}

/** Equal-length byte comparison whose running time does not depend on where bytes differ. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  let diff = a.length ^ b.length;
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) diff |= (a[i] ?? 0) ^ (b[i] ?? 0);
  return diff === 0;
}

/** The token of an `Authorization: Bearer <token>` header, or null. */
export function bearerToken(header: string | null | undefined): string | null {
  if (header === null || header === undefined) return null;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return m?.[1] ?? null;
}

async function digest(text: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
}
