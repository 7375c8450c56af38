/**
 * Which web pages may drive the server, and under which host names it may be reached.
 *
 * A page on another site can send a simple cross-origin request (a `text/plain` POST needs no
 * CORS preflight) or open a WebSocket to a server on localhost; browsers only hide the answer.
 * And a DNS name that an attacker re-points at 127.0.0.1 (DNS rebinding) makes that page
 * same-origin with the server. So requests that carry an `Origin` must come from the server's
 * own origin or one configured with `--cors-origin` (patterns as Ollama's OLLAMA_ORIGINS, `*`
 * matching any run of characters), and the `Host` must be an IP literal, `localhost`, or a
 * name configured with `--allowed-host`: a rebinding page's Host is its own DNS name.
 */

/** A compiled allow-list of origins: exact origins or glob patterns (`http://localhost:*`). */
export class OriginPolicy {
  readonly #patterns: RegExp[];
  readonly #hosts: Set<string>;
  readonly patterns: readonly string[];

  constructor(origins: readonly string[] = [], hosts: readonly string[] = []) {
    this.patterns = origins;
    this.#patterns = origins.map((o) =>
      new RegExp(
        "^" + o.toLowerCase().replace(/\/+$/, "").split("*").map(escapeRegExp).join(".*") + "$",
      )
    );
    this.#hosts = new Set(hosts.map((h) => h.toLowerCase()));
  }

  /** True when `origin` (an Origin header value) is configured with --cors-origin. */
  isListed(origin: string): boolean {
    const o = origin.toLowerCase();
    return this.#patterns.some((p) => p.test(o));
  }

  /**
   * Why a request with this Host and Origin is refused, or null when it is allowed. A request
   * without Origin is not from a web page's script (curl, SDKs, the browser's own navigation).
   */
  check(host: string | undefined, origin: string | undefined): string | null {
    if (host !== undefined && !this.hostAllowed(host)) {
      return `Host ${JSON.stringify(host)} is not a name this server answers to; ` +
        "use its IP address or localhost, or start it with --allowed-host <name>";
    }
    if (origin === undefined) return null;
    if (host !== undefined && sameOrigin(origin, host)) return null;
    if (this.isListed(origin)) return null;
    return `Origin ${JSON.stringify(origin)} may not use this server (only the server's own ` +
      `origin${
        this.patterns.length > 0 ? ` and ${this.patterns.join(", ")}` : ""
      } may); start it with --cors-origin <origin> to allow that page`;
  }

  /** IP literals, localhost and configured names, with any port. */
  hostAllowed(host: string): boolean {
    const name = hostName(host).toLowerCase();
    if (name === "localhost" || name.endsWith(".localhost")) return true;
    if (isIpLiteral(name)) return true;
    return this.#hosts.has(name);
  }
}

/** The name part of a Host header: `[::1]:8000` -> `[::1]`, `example.com:80` -> `example.com`. */
export function hostName(host: string): string {
  if (host.startsWith("[")) {
    const end = host.indexOf("]");
    return end < 0 ? host : host.slice(0, end + 1);
  }
  const colon = host.lastIndexOf(":");
  return colon < 0 ? host : host.slice(0, colon);
}

function isIpLiteral(name: string): boolean {
  if (name.startsWith("[") && name.endsWith("]")) return /^[0-9a-f:.]+$/i.test(name.slice(1, -1));
  const parts = name.split(".");
  return parts.length === 4 && parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255);
}

/** True when `origin` (scheme://host[:port]) names the server the Host header addresses. */
export function sameOrigin(origin: string, host: string): boolean {
  let url: URL;
  try {
    url = new URL(origin);
  } catch {
    return false; // "null" (sandboxed frames, file://) is nobody's origin
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return false;
  try {
    return url.host.toLowerCase() === new URL(`http://${host}`).host.toLowerCase();
  } catch {
    return false;
  }
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
