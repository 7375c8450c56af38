/**
 * A small Prometheus registry: counters, gauges and histograms with labels, rendered in the
 * text exposition format 0.0.4. Written here rather than pulled in because the service needs
 * only these three types and a renderer.
 */

export type Labels = Readonly<Record<string, string>>;

export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

interface Metric {
  readonly name: string;
  render(): string;
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function escapeHelp(help: string): string {
  return help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

function labelKey(names: readonly string[], labels: Labels | undefined): string {
  return names.map((n) => labels?.[n] ?? "").join("\u0000");
}

function renderLabels(pairs: ReadonlyArray<readonly [string, string]>): string {
  if (pairs.length === 0) return "";
  return "{" + pairs.map(([k, v]) => `${k}="${escapeLabel(v)}"`).join(",") + "}";
}

/** Prometheus number formatting: integers plainly, specials as +Inf/-Inf/NaN. */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  return String(v);
}

function header(name: string, help: string, type: string): string {
  return `# HELP ${name} ${escapeHelp(help)}\n# TYPE ${name} ${type}\n`;
}

function checkLabels(name: string, names: readonly string[], labels: Labels | undefined): void {
  for (const key of Object.keys(labels ?? {})) {
    if (!names.includes(key)) {
      throw new Error(`Metric ${name} has no label '${key}'; its labels are [${names.join(", ")}]`);
    }
  }
}

abstract class Scalar implements Metric {
  protected values = new Map<string, { labels: Labels; value: number }>();
  constructor(
    readonly name: string,
    readonly help: string,
    readonly labelNames: readonly string[],
    private readonly kind: "counter" | "gauge",
  ) {}

  protected slot(labels: Labels | undefined): { labels: Labels; value: number } {
    checkLabels(this.name, this.labelNames, labels);
    const key = labelKey(this.labelNames, labels);
    let s = this.values.get(key);
    if (s === undefined) {
      s = { labels: { ...labels }, value: 0 };
      this.values.set(key, s);
    }
    return s;
  }

  /** Current value for a label set (0 if never touched). */
  get(labels?: Labels): number {
    return this.values.get(labelKey(this.labelNames, labels))?.value ?? 0;
  }

  render(): string {
    let out = header(this.name, this.help, this.kind);
    if (this.values.size === 0 && this.labelNames.length === 0) {
      return out + `${this.name} 0\n`;
    }
    for (const { labels, value } of this.values.values()) {
      const pairs = this.labelNames.map((n) => [n, labels[n] ?? ""] as const);
      out += `${this.name}${renderLabels(pairs)} ${formatValue(value)}\n`;
    }
    return out;
  }
}

export class Counter extends Scalar {
  constructor(name: string, help: string, labelNames: readonly string[] = []) {
    super(name, help, labelNames, "counter");
  }

  inc(labels?: Labels, by = 1): void {
    if (by < 0) throw new Error(`Counter ${this.name} cannot decrease (inc by ${by})`);
    this.slot(labels).value += by;
  }
}

export class Gauge extends Scalar {
  constructor(name: string, help: string, labelNames: readonly string[] = []) {
    super(name, help, labelNames, "gauge");
  }

  set(value: number, labels?: Labels): void {
    this.slot(labels).value = value;
  }

  add(by: number, labels?: Labels): void {
    this.slot(labels).value += by;
  }
}

export class Histogram implements Metric {
  readonly buckets: readonly number[];
  #series = new Map<string, { labels: Labels; counts: number[]; sum: number; count: number }>();

  constructor(
    readonly name: string,
    readonly help: string,
    buckets: readonly number[],
    readonly labelNames: readonly string[] = [],
  ) {
    const sorted = [...buckets].sort((a, b) => a - b);
    if (sorted.some((b, i) => i > 0 && b === sorted[i - 1])) {
      throw new Error(`Histogram ${name} has duplicate bucket bounds: [${buckets.join(", ")}]`);
    }
    this.buckets = sorted;
  }

  observe(value: number, labels?: Labels): void {
    checkLabels(this.name, this.labelNames, labels);
    const key = labelKey(this.labelNames, labels);
    let s = this.#series.get(key);
    if (s === undefined) {
      s = { labels: { ...labels }, counts: this.buckets.map(() => 0), sum: 0, count: 0 };
      this.#series.set(key, s);
    }
    for (let i = 0; i < this.buckets.length; i++) {
      if (value <= (this.buckets[i] ?? Infinity)) s.counts[i] = (s.counts[i] ?? 0) + 1;
    }
    s.sum += value;
    s.count++;
  }

  /** Observations so far for a label set. */
  count(labels?: Labels): number {
    return this.#series.get(labelKey(this.labelNames, labels))?.count ?? 0;
  }

  render(): string {
    let out = header(this.name, this.help, "histogram");
    const series = this.#series.size === 0 && this.labelNames.length === 0
      ? [{ labels: {}, counts: this.buckets.map(() => 0), sum: 0, count: 0 }]
      : [...this.#series.values()];
    for (const s of series) {
      const base = this.labelNames.map((n) => [n, s.labels[n] ?? ""] as const);
      this.buckets.forEach((b, i) => {
        out += `${this.name}_bucket${renderLabels([...base, ["le", formatValue(b)]])} ${
          s.counts[i] ?? 0
        }\n`;
      });
      out += `${this.name}_bucket${renderLabels([...base, ["le", "+Inf"]])} ${s.count}\n`;
      out += `${this.name}_sum${renderLabels(base)} ${formatValue(s.sum)}\n`;
      out += `${this.name}_count${renderLabels(base)} ${s.count}\n`;
    }
    return out;
  }
}

/** Holds metrics in registration order; `collect` hooks refresh gauges just before rendering. */
export class Registry {
  #metrics: Metric[] = [];
  #collectors: Array<() => void> = [];

  #add<M extends Metric>(m: M): M {
    if (this.#metrics.some((x) => x.name === m.name)) {
      throw new Error(`Metric ${m.name} is already registered`);
    }
    this.#metrics.push(m);
    return m;
  }

  counter(name: string, help: string, labelNames: readonly string[] = []): Counter {
    return this.#add(new Counter(name, help, labelNames));
  }

  gauge(name: string, help: string, labelNames: readonly string[] = []): Gauge {
    return this.#add(new Gauge(name, help, labelNames));
  }

  histogram(
    name: string,
    help: string,
    buckets: readonly number[],
    labelNames: readonly string[] = [],
  ): Histogram {
    return this.#add(new Histogram(name, help, buckets, labelNames));
  }

  /** Runs `fn` before every render (for gauges read from a live snapshot). */
  onCollect(fn: () => void): void {
    this.#collectors.push(fn);
  }

  render(): string {
    for (const fn of this.#collectors) fn();
    return this.#metrics.map((m) => m.render()).join("");
  }
}
