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

/** What an Authorization header holds: nothing, one bearer token, or something else. */
export type Authorization =
  | { readonly kind: "missing" }
  | { readonly kind: "token"; readonly token: string }
  | { readonly kind: "malformed"; readonly problem: string };

/**
 * Reads `Authorization: Bearer <token>`. A header that is there but not that shape is told
 * apart from a missing one, so the client hears what is wrong with it; the message describes
 * the header's shape and never repeats what could be a key.
 */
export function parseAuthorization(header: string | null | undefined): Authorization {
  if (header === null || header === undefined || header.trim() === "") return { kind: "missing" };
  const words = header.trim().split(/\s+/);
  if (words[0]!.toLowerCase() !== "bearer") {
    return {
      kind: "malformed",
      problem: `Authorization header uses the scheme ${
        JSON.stringify(words[0]!.slice(0, 20))
      }; expected 'Authorization: Bearer <key>'`,
    };
  }
  if (words.length !== 2) {
    return {
      kind: "malformed",
      problem: `Authorization header has ${words.length - 1} words after 'Bearer'; expected ` +
        "exactly one (the key, which never contains spaces)",
    };
  }
  return { kind: "token", token: words[1]! };
}

async function digest(text: string): Promise<Uint8Array> {
  return new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
}

/**
 * The cache scope of a key: an id derived from it (never the key itself, which must not sit in
 * cache keys and metrics), the same for the same key and, for practical purposes, different
 * for different keys.
 */
export async function keyScope(key: string): Promise<string> {
  const d = await digest(`llmserve cache scope\n${key}`);
  return Array.from(d.subarray(0, 12), (b) => b.toString(16).padStart(2, "0")).join("");
}
