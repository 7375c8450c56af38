/**
 * What a 95 MiB `POST /v1/files` costs the server in memory: the server (main.ts serve,
 * reference engine, stories260K) runs as a child process; its peak RSS (VmHWM, reset through
 * /proc/<pid>/clear_refs just before) and its RSS after are read around one upload, then
 * around three at once, each on a fresh server warmed by one small upload. Prints a markdown
 * table.
 *
 *   MODEL_MIRROR=../shared/models deno task bench:uploads [--checkout DIR] [--mib 95]
 *
 * --checkout measures another checkout's main.ts (e.g. `git archive bd9a650 | tar -x -C DIR`).
 */
import { parseArgs } from "@std/cli/parse-args";
import { startServer } from "../tests/harness/server_process.ts";
import { modelFile } from "../tests/harness/model_files.ts";
import { fileForm, jsonlOf, postFile } from "../tests/harness/uploads.ts";
import { markdownTable } from "./markdown_table.ts";

const MiB = 1024 * 1024;

function statusBytes(pid: number, field: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(Deno.readTextFileSync(`/proc/${pid}/status`));
  if (m === null) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}

async function measure(main: string | undefined, body: Uint8Array, at: number) {
  const dir = await Deno.makeTempDir({ prefix: "upload_bench_" });
  const srv = await startServer({
    ...(main === undefined ? {} : { main }),
    args: [
      ...["--model", modelFile("stories260K.bin"), "--tokenizer", modelFile("tok512.bin")],
      ...["--backend", "reference", "--kv-memory", "8MiB", "--log-format", "off"],
      ...["--data-dir", dir],
    ],
  });
  try {
    const warm = await postFile(srv.base, fileForm(jsonlOf(4096, 512)));
    if (warm.status !== 200) throw new Error(`warm-up upload: ${JSON.stringify(warm.body)}`);
    const before = statusBytes(srv.pid, "VmRSS");
    Deno.writeTextFileSync(`/proc/${srv.pid}/clear_refs`, "5");
    const t0 = performance.now();
    const answers = await Promise.all(
      Array.from({ length: at }, () => postFile(srv.base, fileForm(body))),
    );
    const seconds = (performance.now() - t0) / 1000;
    for (const a of answers) {
      if (a.status !== 200) throw new Error(`upload: ${a.status} ${JSON.stringify(a.body)}`);
    }
    return {
      before,
      peak: statusBytes(srv.pid, "VmHWM"),
      after: statusBytes(srv.pid, "VmRSS"),
      seconds,
    };
  } finally {
    await srv.stop();
    await Deno.remove(dir, { recursive: true });
  }
}

const args = parseArgs(Deno.args, { string: ["checkout", "mib"] });
const mib = Number(args.mib ?? 95);
const main = args.checkout === undefined ? undefined : `${args.checkout}/main.ts`;
const body = jsonlOf(mib * MiB, 2048);
const rows: string[][] = [];
for (const at of [1, 3]) {
  const r = await measure(main, body, at);
  const m = (n: number) => (n / MiB).toFixed(0);
  rows.push([
    `${at} × ${mib} MiB`,
    m(r.before),
    m(r.peak),
    `+${m(r.peak - r.before)}`,
    m(r.after),
    r.seconds.toFixed(1),
  ]);
}
console.log(`server: ${main ?? "this checkout"}`);
console.log(markdownTable(
  ["uploads at once", "RSS before MiB", "peak MiB", "peak growth MiB", "RSS after MiB", "s"],
  rows,
));
