import { TrieRouter } from "hono/router/trie-router";

/** What the table needs of a registered route (hono's `app.routes` entries). */
export interface RegisteredRoute {
  readonly method: string;
  readonly path: string;
}

/** Methods listed in Allow, in this order (others after them, alphabetically). */
const METHOD_ORDER = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/**
 * The app's one route table: hono's own list of registered routes (`app.routes`), read once
 * after every route is mounted. Each request's route label (llm_http_requests_total, the
 * request log) and the 405 answer with its `Allow` header come from it, so a route added
 * anywhere (the batch routes through `extend` included) is labelled and answered 405 without
 * a second list to keep in step. Middleware (`app.use`, method ALL) is not a route.
 *
 * A GET route answers HEAD too (hono dispatches HEAD as GET), so its Allow lists both.
 */
export class RouteTable {
  readonly #source: () => readonly RegisteredRoute[];
  #router: TrieRouter<string> | undefined;
  #methods: string[] = [];

  constructor(source: () => readonly RegisteredRoute[]) {
    this.#source = source;
  }

  /** The pattern of the route `path` matches under `method`, if one does. */
  patternFor(method: string, path: string): string | undefined {
    const m = method === "HEAD" ? "GET" : method;
    return this.#match(m, path)[0];
  }

  /**
   * The request's route label: the pattern it matches (under its method, else under any
   * other) without parameter regexes, or "unmatched" (a bounded label set whatever paths
   * clients send).
   */
  label(method: string, path: string): string {
    let pattern = this.patternFor(method, path);
    for (const m of this.#table().methods) pattern ??= this.#match(m, path)[0];
    // A parameter's regex is no part of its name: /v1/models/:model{.+} is /v1/models/:model.
    return pattern === undefined ? "unmatched" : pattern.replace(/\{[^}]*\}/g, "");
  }

  /** The methods `path` takes, as an Allow header value; undefined when no route matches. */
  allowed(path: string): string | undefined {
    const methods = this.#table().methods.filter((m) => this.#match(m, path).length > 0);
    if (methods.length === 0) return undefined;
    if (methods.includes("GET")) methods.push("HEAD");
    const rank = (m: string) => {
      const i = METHOD_ORDER.indexOf(m);
      return i < 0 ? METHOD_ORDER.length : i;
    };
    return [...new Set(methods)].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b)).join(", ");
  }

  #match(method: string, path: string): string[] {
    return this.#table().router.match(method, path)[0].map(([pattern]) => pattern);
  }

  #table(): { router: TrieRouter<string>; methods: string[] } {
    if (this.#router === undefined) {
      const router = new TrieRouter<string>();
      const methods = new Set<string>();
      for (const r of this.#source()) {
        if (r.method === "ALL") continue;
        router.add(r.method, r.path, r.path);
        methods.add(r.method);
      }
      this.#router = router;
      this.#methods = [...methods];
    }
    return { router: this.#router, methods: this.#methods };
  }
}
