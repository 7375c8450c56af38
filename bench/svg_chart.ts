/**
 * Line charts as a standalone SVG (no scripts, no external resources) that a browser opens
 * directly: panels side by side, the x axis categorical (concurrency levels or rates).
 */

export interface Series {
  readonly name: string;
  /** One value per x category; null where there is none. */
  readonly values: readonly (number | null)[];
  /** Drawn dashed (e.g. a latency next to a throughput of the same colour). */
  readonly dashed?: boolean;
}

export interface Panel {
  readonly title: string;
  readonly xLabel: string;
  readonly yLabel: string;
  readonly x: readonly (string | number)[];
  readonly series: readonly Series[];
}

const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
/** Panel width, plot height, margins; the legend (two entries a row) goes below the plot. */
const W = 460, PLOT_H = 204, M = { left: 64, right: 16, top: 36 };
const LEGEND_TOP = 50, LEGEND_ROW = 14;

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(
    /"/g,
    "&quot;",
  );
}

/** A "nice" axis maximum and step (1, 2 or 5 times a power of ten) covering `max`. */
export function niceAxis(max: number, ticks = 5): { top: number; step: number } {
  if (!(max > 0)) return { top: 1, step: 0.2 };
  const raw = max / ticks;
  const pow = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= raw)!;
  return { top: Math.ceil(max / step) * step, step };
}

function tickLabel(v: number): string {
  if (v >= 10_000) return `${(v / 1000).toFixed(0)}k`;
  if (v >= 1000) return `${(v / 1000).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(v < 1 ? 2 : 1);
}

function panelSvg(p: Panel, ox: number, colourOf: (name: string) => string): string {
  const pw = W - M.left - M.right, ph = PLOT_H;
  const all = p.series.flatMap((s) =>
    s.values.filter((v): v is number => v !== null && Number.isFinite(v))
  );
  const { top, step } = niceAxis(Math.max(0, ...all));
  const xAt = (i: number) => M.left + (p.x.length === 1 ? pw / 2 : (i * pw) / (p.x.length - 1));
  const yAt = (v: number) => M.top + ph - (v / top) * ph;
  const parts: string[] = [`<g transform="translate(${ox},0)">`];
  parts.push(
    `<text x="${M.left + pw / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">${
      esc(p.title)
    }</text>`,
  );
  for (let v = 0; v <= top + step / 2; v += step) {
    const y = yAt(v).toFixed(1);
    parts.push(`<line x1="${M.left}" x2="${M.left + pw}" y1="${y}" y2="${y}" stroke="#ddd"/>`);
    parts.push(
      `<text x="${M.left - 6}" y="${y}" dy="4" text-anchor="end" font-size="11">${
        tickLabel(v)
      }</text>`,
    );
  }
  p.x.forEach((label, i) => {
    parts.push(
      `<text x="${xAt(i).toFixed(1)}" y="${M.top + ph + 16}" text-anchor="middle" font-size="11">${
        esc(String(label))
      }</text>`,
    );
  });
  parts.push(
    `<line x1="${M.left}" x2="${M.left}" y1="${M.top}" y2="${M.top + ph}" stroke="#333"/>`,
  );
  parts.push(
    `<line x1="${M.left}" x2="${M.left + pw}" y1="${M.top + ph}" y2="${
      M.top + ph
    }" stroke="#333"/>`,
  );
  parts.push(
    `<text x="${M.left + pw / 2}" y="${M.top + ph + 34}" text-anchor="middle" font-size="12">${
      esc(p.xLabel)
    }</text>`,
  );
  parts.push(
    `<text transform="translate(16,${
      M.top + ph / 2
    }) rotate(-90)" text-anchor="middle" font-size="12">${esc(p.yLabel)}</text>`,
  );
  for (const s of p.series) {
    const colour = colourOf(s.name);
    const pts = s.values.map((
      v,
      i,
    ) => (v === null || !Number.isFinite(v) ? null : [xAt(i), yAt(v)] as const));
    let d = "";
    pts.forEach((pt, i) => {
      if (!pt) return;
      d += `${d === "" || !pts[i - 1] ? "M" : "L"}${pt[0].toFixed(1)},${pt[1].toFixed(1)} `;
    });
    if (d !== "") {
      parts.push(
        `<path d="${d.trim()}" fill="none" stroke="${colour}" stroke-width="2"${
          s.dashed ? ' stroke-dasharray="6 4"' : ""
        }/>`,
      );
    }
    for (const pt of pts) {
      if (pt) {
        parts.push(
          `<circle cx="${pt[0].toFixed(1)}" cy="${pt[1].toFixed(1)}" r="3" fill="${colour}"/>`,
        );
      }
    }
  }
  p.series.forEach((s, i) => {
    const y = M.top + ph + LEGEND_TOP + Math.floor(i / 2) * LEGEND_ROW;
    const x = M.left + (i % 2) * (pw / 2);
    parts.push(
      `<line x1="${x}" x2="${x + 18}" y1="${y - 4}" y2="${y - 4}" stroke="${
        colourOf(s.name)
      }" stroke-width="2"${s.dashed ? ' stroke-dasharray="6 4"' : ""}/>`,
    );
    parts.push(`<text x="${x + 22}" y="${y}" font-size="11">${esc(s.name)}</text>`);
  });
  parts.push("</g>");
  return parts.join("\n");
}

/**
 * Panels side by side in one SVG document. Series with the same name share a colour across
 * panels; `caption` goes under the panels.
 */
export function chartSvg(panels: readonly Panel[], caption = ""): string {
  const names: string[] = [];
  for (const p of panels) {
    for (const s of p.series) if (!names.includes(baseName(s.name))) names.push(baseName(s.name));
  }
  const colourOf = (name: string) => COLOURS[names.indexOf(baseName(name)) % COLOURS.length]!;
  const legendRows = Math.max(1, ...panels.map((p) => Math.ceil(p.series.length / 2)));
  const panelHeight = M.top + PLOT_H + LEGEND_TOP + legendRows * LEGEND_ROW;
  const width = W * panels.length, height = panelHeight + (caption ? 24 : 0);
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    ...panels.map((p, i) => panelSvg(p, i * W, colourOf)),
    caption
      ? `<text x="${width / 2}" y="${
        panelHeight + 14
      }" text-anchor="middle" font-size="11" fill="#555">${esc(caption)}</text>`
      : "",
    "</svg>",
    "",
  ].join("\n");
}

/** "cpu/ws p99 TTFT" and "cpu/ws p99 e2e" share the colour of "cpu/ws". */
function baseName(name: string): string {
  return name.split(" ")[0]!;
}
