/**
 * The machines a plan places a model on: each host's memory, threads and speed, and the link
 * between any two of them. Given compactly on the command line (`4x16GiB@1thr`) or as a JSON
 * hosts file, validated here with messages that name the field and the value received.
 */
import { z } from "zod";
import { parseByteSize } from "../util/byte_size.ts";

export interface PlanHost {
  readonly name: string;
  readonly memoryBytes: number;
  /** Threads its one process runs the CPU engine on. */
  readonly threads: number;
  /** One of its threads against one of the calibration machine's (2: twice as fast). */
  readonly speed: number;
}

/** The link between any two hosts (one process per host; a message makes one hop). */
export interface PlanLink {
  /** Infinity: loopback, where only the transport's own per-byte cost counts. */
  readonly bandwidthBytesPerSecond: number;
  readonly latencySeconds: number;
}

export interface PlanCluster {
  readonly hosts: readonly PlanHost[];
  readonly link: PlanLink;
}

/** Hosts one plan may place at most, so that an enumeration stays instant. */
export const MAX_PLAN_HOSTS = 1024;

const BANDWIDTH = /^([0-9]*\.?[0-9]+)\s*([kKMGT]?)(bit|b|B)(?:\/s|ps)$/;
const SCALE: Record<string, number> = { "": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12 };

/** `1Gbit/s`, `100Mb/s`, `100Mbps`, `1.2GB/s` or `loopback`, in bytes per second. */
export function parseBandwidth(text: string): number {
  const t = text.trim();
  if (t === "loopback") return Infinity;
  const m = BANDWIDTH.exec(t);
  const value = m ? Number(m[1]) * SCALE[m[2]!]! / (m[3] === "B" ? 1 : 8) : NaN;
  if (!(value > 0)) {
    throw new Error(
      `"${text}" is not a bandwidth: expected e.g. 1Gbit/s, 100Mb/s, 100Mbps, 1.2GB/s or loopback`,
    );
  }
  return value;
}

const LATENCY = /^([0-9]*\.?[0-9]+)\s*(s|ms|us|µs)?$/;
/** Each unit's parts in a second (dividing keeps 100us exactly 1e-4). */
const PER_SECOND: Record<string, number> = { s: 1, ms: 1e3, us: 1e6, "µs": 1e6 };

/** `50ms`, `0.2ms`, `100us`, `0` or `1s`, in seconds. */
export function parseLatency(text: string): number {
  const m = LATENCY.exec(text.trim());
  if (!m || (m[2] === undefined && Number(m[1]) !== 0)) {
    throw new Error(`"${text}" is not a latency: expected e.g. 50ms, 0.2ms, 100us or 0`);
  }
  return Number(m[1]) / PER_SECOND[m[2] ?? "s"]!;
}

const HOST_GROUP = /^(?:(\d+)x)?([0-9.]+\s*[A-Za-z]*?)(?:@(\d+)thr)?(?:\*([0-9]*\.?[0-9]+))?$/;

/**
 * `4x16GiB@1thr`: groups of hosts, comma-separated, each `[COUNTx]MEMORY[@THREADSthr][*SPEED]`
 * (1 host, 1 thread and speed 1 where left out).
 */
export function parseHostList(text: string): PlanHost[] {
  const hosts: PlanHost[] = [];
  for (const group of text.split(",").map((g) => g.trim())) {
    const m = HOST_GROUP.exec(group);
    if (!m) {
      throw new Error(
        `"${group}" is not a host group: expected [COUNTx]MEMORY[@THREADSthr][*SPEED], e.g. 4x16GiB@1thr or 2x64GiB@8thr*1.5`,
      );
    }
    const count = Number(m[1] ?? 1), threads = Number(m[3] ?? 1), speed = Number(m[4] ?? 1);
    if (count < 1 || threads < 1 || !(speed > 0)) {
      throw new Error(`"${group}": the count, the threads and the speed must be above 0`);
    }
    let memoryBytes: number;
    try {
      memoryBytes = parseByteSize(m[2]!);
    } catch (e) {
      throw new Error(`"${group}": ${(e as Error).message}`);
    }
    for (let i = 0; i < count; i++) {
      hosts.push({ name: `host ${hosts.length + 1}`, memoryBytes, threads, speed });
    }
  }
  return checkCount(hosts, text);
}

function checkCount(hosts: PlanHost[], source: string): PlanHost[] {
  if (hosts.length > MAX_PLAN_HOSTS) {
    throw new Error(`${source}: ${hosts.length} hosts; a plan takes at most ${MAX_PLAN_HOSTS}`);
  }
  return hosts;
}

/** A zod field read by one of the parsers above, its error becoming the field's issue. */
export function parsed<T>(parse: (s: string) => T) {
  return z.string().transform((s, ctx) => {
    try {
      return parse(s);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  });
}

/** A byte size: a number of bytes, or text such as 16GiB. */
const memory = z.unknown().transform((v, ctx) => {
  if (typeof v === "number" && v > 0) return v;
  try {
    if (typeof v === "string") return parseByteSize(v);
  } catch (e) {
    ctx.addIssue({ code: "custom", message: (e as Error).message });
    return z.NEVER;
  }
  ctx.addIssue({
    code: "custom",
    message: "must be a byte size such as 16GiB, or a number of bytes above 0",
  });
  return z.NEVER;
});

export const HOSTS_FILE_SCHEMA = z.strictObject({
  hosts: z.array(
    z.strictObject({
      name: z.string().min(1, "cannot be empty").optional(),
      count: z.number().int("must be an integer").min(1, "must be at least 1").default(1),
      memory,
      threads: z.number().int("must be an integer").min(1, "must be at least 1").default(1),
      speed: z.number().positive("must be above 0").default(1),
    }),
  ).min(1, "must list at least one host"),
  link: z.strictObject({ bandwidth: parsed(parseBandwidth), latency: parsed(parseLatency) })
    .optional(),
});

/**
 * A hosts file's text, validated: its hosts (a group with `count` becomes that many, named
 * `<name> 1`…) and its link when it gives one. Errors name the file, the field and the value.
 */
export function parseHostsFile(
  text: string,
  source: string,
): { hosts: PlanHost[]; link?: PlanLink } {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new Error(`Hosts file ${source} is not JSON: ${(e as Error).message}`);
  }
  const r = HOSTS_FILE_SCHEMA.safeParse(json);
  if (!r.success) {
    const lines = r.error.issues.map((i) =>
      `${fieldPath(i.path)}: ${i.message}${received(json, i)}`
    );
    throw new Error(`Hosts file ${source} is invalid:\n  ${lines.join("\n  ")}`);
  }
  const hosts: PlanHost[] = [];
  for (const h of r.data.hosts) {
    for (let i = 0; i < h.count; i++) {
      const name = h.name === undefined
        ? `host ${hosts.length + 1}`
        : h.count === 1
        ? h.name
        : `${h.name} ${i + 1}`;
      hosts.push({ name, memoryBytes: h.memory, threads: h.threads, speed: h.speed });
    }
  }
  const link = r.data.link &&
    { bandwidthBytesPerSecond: r.data.link.bandwidth, latencySeconds: r.data.link.latency };
  return { hosts: checkCount(hosts, source), ...(link ? { link } : {}) };
}

/** `hosts[2].memory`: where in the file an issue is. */
function fieldPath(path: readonly PropertyKey[]): string {
  if (path.length === 0) return "(the whole file)";
  return path.map((p, i) =>
    typeof p === "number" ? `[${p}]` : i === 0 ? String(p) : `.${String(p)}`
  )
    .join("");
}

/** ` (received …)`: the value at the issue's path, where there is one to show. */
function received(json: unknown, issue: { path: readonly PropertyKey[]; message: string }): string {
  let v: unknown = json;
  for (const p of issue.path) {
    v = v !== null && typeof v === "object" ? (v as Record<PropertyKey, unknown>)[p] : undefined;
  }
  if (v === undefined || issue.message.includes(JSON.stringify(v) ?? "")) return "";
  const shown = JSON.stringify(v);
  return ` (received ${shown.length > 60 ? shown.slice(0, 57) + "..." : shown})`;
}
