import { jetstream } from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import type { NatsConnection } from "./nats_connection.ts";
import { CLUSTER_DEFAULTS } from "./cluster_defaults.ts";
import type { StoredResult } from "../core/result_cache.ts";
import type { SharedResultStore, SharedResultStoreStats } from "../core/shared_result_store.ts";

export interface NatsResultStoreOptions {
  /**
   * The servers' shared secret (--shared-cache-secret). Names and keys are derived from it, so
   * the bus credentials alone neither read an entry nor find one for a guessed request.
   */
  readonly secret: string;
  /** How long an entry lives, in ms. */
  readonly ttlMs: number;
  readonly bucket?: string;
  readonly bucketBytes?: number;
  /** The largest sealed entry stored (lowered to what the server's max_payload allows). */
  readonly maxValueBytes?: number;
  readonly timeoutMs?: number;
  readonly retryMs?: number;
  readonly log: (line: string) => void;
}

/** Bytes of a sealed value besides the ciphertext: the IV. The GCM tag is in the ciphertext. */
const IV_BYTES = 12;
/** Room a KV message needs besides its value (subject, headers), under max_payload. */
const MESSAGE_OVERHEAD = 1024;
/** Scopes whose derived key is kept (a scope is an API key's; more are derived again). */
const MAX_SCOPE_KEYS = 1024;

const utf8 = new TextEncoder();

/**
 * The result cache shared by the replicas of one NATS server, in a JetStream key-value bucket
 * (history 1, a TTL, bounded in bytes and per value).
 *
 * An entry's name is HMAC-SHA-256(secret-derived key, request key) in hex: the request key
 * holds the tenant's cache scope, so two tenants' identical requests are two entries, and the
 * name tells nothing of the prompt without the secret. Its value is the result as JSON sealed
 * with AES-256-GCM under a key derived (HKDF-SHA-256) from the secret and the tenant's scope,
 * with the entry's name as additional data: it opens only under that tenant's key and name.
 *
 * It never throws to a request: a store that cannot be reached (no JetStream, a bucket that
 * cannot be made, the server gone, a timeout) answers a miss, counts `unavailable`, logs it,
 * and is skipped for `retryMs` before it is tried again.
 */
export class NatsResultStore implements SharedResultStore {
  readonly #o: Required<Omit<NatsResultStoreOptions, "log">> & Pick<NatsResultStoreOptions, "log">;
  #nc: NatsConnection | undefined;
  #kv: Promise<KV> | undefined;
  /** Until when the store is skipped after a failure (performance.now()). */
  #downUntil = 0;
  #master: Promise<CryptoKey> | undefined;
  #nameKey: Promise<CryptoKey> | undefined;
  readonly #scopeKeys = new Map<string, Promise<CryptoKey>>();
  #stats = { hits: 0, misses: 0, unavailable: 0, tooLarge: 0, stored: 0 };

  constructor(opts: NatsResultStoreOptions) {
    if (opts.secret === "") throw new Error("The shared result cache's secret cannot be empty");
    this.#o = {
      bucket: CLUSTER_DEFAULTS.sharedCacheBucket,
      bucketBytes: CLUSTER_DEFAULTS.sharedCacheBucketBytes,
      maxValueBytes: CLUSTER_DEFAULTS.sharedCacheMaxValueBytes,
      timeoutMs: CLUSTER_DEFAULTS.sharedCacheTimeoutMs,
      retryMs: CLUSTER_DEFAULTS.sharedCacheRetryMs,
      ...opts,
    };
  }

  /** The connection to keep the bucket on (the replica's); until then it is unavailable. */
  attach(nc: NatsConnection): void {
    this.#nc = nc;
    this.#kv = undefined;
    this.#downUntil = 0;
  }

  stats(): SharedResultStoreStats {
    return { ...this.#stats };
  }

  /** The largest sealed value stored: the option, within what one NATS message carries. */
  get maxValueBytes(): number {
    const payload = this.#nc?.info?.max_payload ?? CLUSTER_DEFAULTS.maxPayloadBytes;
    return Math.min(this.#o.maxValueBytes, payload - MESSAGE_OVERHEAD);
  }

  async get(key: string, scope: string): Promise<StoredResult | undefined> {
    const got = await this.#guard("lookup", async (kv) => {
      const name = await this.entryName(key);
      const e = await kv.get(name);
      if (e === null || e.operation !== "PUT" || e.length === 0) return undefined;
      return { name, sealed: e.value };
    });
    if (got === null) return undefined;
    if (got === undefined) {
      this.#stats.misses++;
      return undefined;
    }
    const result = await this.open(got.sealed, got.name, scope);
    if (result === undefined) this.#stats.misses++;
    else this.#stats.hits++;
    return result;
  }

  async set(key: string, scope: string, result: StoredResult): Promise<void> {
    if (this.#nc === undefined || performance.now() < this.#downUntil) {
      this.#stats.unavailable++;
      return;
    }
    const name = await this.entryName(key);
    const sealed = await this.seal(result, name, scope);
    if (sealed.length > this.maxValueBytes) {
      this.#stats.tooLarge++;
      return;
    }
    const ok = await this.#guard("store", async (kv) => {
      await kv.put(name, sealed);
      return true;
    });
    if (ok === true) this.#stats.stored++;
  }

  /** An entry's name in the bucket: HMAC-SHA-256 of the request key, hex (a valid KV key). */
  async entryName(key: string): Promise<string> {
    this.#nameKey ??= this.#derive("entry names", { name: "HMAC", hash: "SHA-256", length: 256 }, [
      "sign",
    ]);
    const mac = await crypto.subtle.sign("HMAC", await this.#nameKey, utf8.encode(key));
    return hex(new Uint8Array(mac));
  }

  /** The result sealed for `scope` under entry `name`: IV, then AES-GCM ciphertext and tag. */
  async seal(result: StoredResult, name: string, scope: string): Promise<Uint8Array> {
    const iv = crypto.getRandomValues(new Uint8Array(IV_BYTES));
    const data = new Uint8Array(
      await crypto.subtle.encrypt(
        { name: "AES-GCM", iv, additionalData: utf8.encode(name) },
        await this.#scopeKey(scope),
        utf8.encode(JSON.stringify(result)),
      ),
    );
    const out = new Uint8Array(IV_BYTES + data.length);
    out.set(iv);
    out.set(data, IV_BYTES);
    return out;
  }

  /** The result a sealed value holds, or undefined where it does not open for `scope`/`name`. */
  async open(sealed: Uint8Array, name: string, scope: string): Promise<StoredResult | undefined> {
    if (sealed.length <= IV_BYTES) return undefined;
    const bytes = new Uint8Array(sealed);
    try {
      const plain = await crypto.subtle.decrypt(
        { name: "AES-GCM", iv: bytes.subarray(0, IV_BYTES), additionalData: utf8.encode(name) },
        await this.#scopeKey(scope),
        bytes.subarray(IV_BYTES),
      );
      return JSON.parse(new TextDecoder().decode(plain)) as StoredResult;
    } catch {
      // Another tenant's key, another entry's name, or altered bytes: not this request's.
      return undefined;
    }
  }

  /**
   * Runs `op` on the bucket within the timeout. Null: the store was unreachable (counted,
   * logged, and skipped for a while).
   */
  async #guard<T>(what: string, op: (kv: KV) => Promise<T>): Promise<T | null> {
    const nc = this.#nc;
    if (nc === undefined || performance.now() < this.#downUntil) {
      this.#stats.unavailable++;
      return null;
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${this.#o.timeoutMs} ms`)),
          this.#o.timeoutMs,
        );
      });
      return await Promise.race([this.#bucket(nc).then(op), timeout]);
    } catch (e) {
      this.#stats.unavailable++;
      this.#kv = undefined;
      this.#downUntil = performance.now() + this.#o.retryMs;
      this.#o.log(
        `shared result cache: the ${what} failed, computing as a miss (next try in ${this.#o.retryMs} ms): ${
          e instanceof Error ? e.message : String(e)
        }`,
      );
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  #bucket(nc: NatsConnection): Promise<KV> {
    this.#kv ??= (async () => {
      const kvm = new Kvm(jetstream(nc, { timeout: this.#o.timeoutMs }));
      const opts = {
        history: 1,
        ttl: this.#o.ttlMs,
        max_bytes: this.#o.bucketBytes,
        maxValueSize: this.maxValueBytes,
      };
      // Another replica may have made it with other settings: then it is used as it is.
      return await kvm.create(this.#o.bucket, opts).catch(() => kvm.open(this.#o.bucket));
    })();
    return this.#kv;
  }

  #scopeKey(scope: string): Promise<CryptoKey> {
    let k = this.#scopeKeys.get(scope);
    if (k === undefined) {
      if (this.#scopeKeys.size >= MAX_SCOPE_KEYS) this.#scopeKeys.clear();
      k = this.#derive(`scope ${scope}`, { name: "AES-GCM", length: 256 }, [
        "encrypt",
        "decrypt",
      ]);
      this.#scopeKeys.set(scope, k);
    }
    return k;
  }

  /** A key for `purpose` derived from the secret by HKDF-SHA-256. */
  async #derive(
    purpose: string,
    alg: AesKeyGenParams | HmacKeyGenParams,
    usages: KeyUsage[],
  ): Promise<CryptoKey> {
    this.#master ??= crypto.subtle.importKey("raw", utf8.encode(this.#o.secret), "HKDF", false, [
      "deriveKey",
    ]);
    return await crypto.subtle.deriveKey(
      {
        name: "HKDF",
        hash: "SHA-256",
        salt: utf8.encode("llmserve shared result cache"),
        info: utf8.encode(purpose),
      },
      await this.#master,
      alg,
      false,
      usages,
    );
  }
}

function hex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
