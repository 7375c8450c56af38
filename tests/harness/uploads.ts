/** Test helpers for POST /v1/files: JSONL bodies, forms, an upload held open, the data dir. */

/** JSONL request lines of about `lineBytes` each, `totalBytes` in all. */
export function jsonlOf(totalBytes: number, lineBytes: number): Uint8Array {
  const pad = "x".repeat(Math.max(0, lineBytes - 110));
  const rows: string[] = [];
  let size = 0;
  for (let i = 0; size < totalBytes; i++) {
    const row = JSON.stringify({
      custom_id: `c${i}`,
      method: "POST",
      url: "/v1/completions",
      body: { prompt: `Once ${pad}`, max_tokens: 4 },
    }) + "\n";
    rows.push(row);
    size += row.length;
  }
  return new TextEncoder().encode(rows.join(""));
}

/** A multipart form as the official clients send it: `purpose` and the `file` part. */
export function fileForm(bytes: Uint8Array, purpose = "batch"): FormData {
  const f = new FormData();
  f.append("purpose", purpose);
  f.append("file", new Blob([bytes as Uint8Array<ArrayBuffer>]), "input.jsonl");
  return f;
}

/** POST /v1/files: the status, the Retry-After header and the JSON body. */
export async function postFile(
  base: string,
  body: FormData,
  key?: string,
): Promise<{ status: number; retryAfter: string | null; body: any }> {
  const res = await fetch(`${base}/v1/files`, {
    method: "POST",
    body,
    headers: key === undefined ? {} : { authorization: `Bearer ${key}` },
  });
  return { status: res.status, retryAfter: res.headers.get("retry-after"), body: await res.json() };
}

/**
 * An upload whose body is sent in part and held open until finish(): while held, the server
 * is receiving it (one upload in progress).
 */
export function heldUpload(
  base: string,
  key: string | undefined,
  content: Uint8Array,
): { finish(): Promise<{ status: number; body: any }> } {
  const boundary = "----held";
  const enc = new TextEncoder();
  let release!: () => void;
  const released = new Promise<void>((r) => release = r);
  const body = new ReadableStream<Uint8Array>({
    async start(c) {
      c.enqueue(enc.encode(
        `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n` +
          `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n` +
          `Content-Type: application/jsonl\r\n\r\n`,
      ));
      c.enqueue(content.subarray(0, content.length >> 1));
      await released;
      c.enqueue(content.subarray(content.length >> 1));
      c.enqueue(enc.encode(`\r\n--${boundary}--\r\n`));
      c.close();
    },
  });
  const headers: Record<string, string> = {
    "content-type": `multipart/form-data; boundary=${boundary}`,
  };
  if (key !== undefined) headers.authorization = `Bearer ${key}`;
  const answer = fetch(`${base}/v1/files`, { method: "POST", body, headers });
  // Seen by finish(); a server killed meanwhile must not fail the test before it is asked.
  answer.catch(() => {});
  return {
    async finish() {
      release();
      const res = await answer;
      return { status: res.status, body: await res.json() };
    },
  };
}

/** The names in the data dir's files/ folder, sorted (none before the first upload). */
export async function filesIn(dataDir: string): Promise<string[]> {
  try {
    return (await Array.fromAsync(Deno.readDir(`${dataDir}/files`))).map((e) => e.name).sort();
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return [];
    throw e;
  }
}

/** Polls `check` every 20 ms until it holds, failing with `what` after `ms`. */
export async function until(check: () => Promise<boolean>, what: string, ms = 10_000) {
  const end = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
