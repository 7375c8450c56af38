import type { BatchObject, FileObject, OutputLine, ResultRecord } from "./batch_types.ts";
import { readHead } from "../util/read_file.ts";

/** Ids name files on disk, so only these spellings are ever looked up. */
const FILE_ID = /^file-[A-Za-z0-9_-]{1,64}$/;
const BATCH_ID = /^batch_[A-Za-z0-9_-]{1,64}$/;

export function isFileId(id: string): boolean {
  return FILE_ID.test(id);
}

export function isBatchId(id: string): boolean {
  return BATCH_ID.test(id);
}

/** A fresh id with OpenAI's prefixes: `file-…`, `batch_…`, `batch_req_…`. */
export function newId(prefix: "file-" | "batch_" | "batch_req_"): string {
  return prefix + crypto.randomUUID().replaceAll("-", "").slice(0, 24);
}

/**
 * The batch queue's files on disk, under one data directory:
 *
 *   files/<id>.jsonl           an uploaded file's content (streamed to <id>.jsonl.tmp first)
 *   files/<id>.json            its file object (an output or error file has only this: its
 *                              content is served from its batch's results log)
 *   batches/<id>.json          a batch object, replaced atomically at each status change
 *   batches/<id>.results.jsonl the finished lines, appended and fsynced one at a time
 *
 * Objects are written to a temporary name, fsynced and renamed over the old one, so a crash
 * leaves the old version or the new one, never half of either; a failed write removes its
 * temporary, and a start removes what a crash left. The results log is the record of which
 * lines are done: a line counts once its record and newline are on disk. It is also the one
 * copy of the output and error files, which read it sorted by line.
 * Directories are created on the first write, so a server that never takes a batch leaves no
 * trace.
 */
export class BatchStore {
  readonly #files: string;
  readonly #batches: string;
  #made = false;

  constructor(readonly dir: string) {
    this.#files = `${dir}/files`;
    this.#batches = `${dir}/batches`;
  }

  async #ensureDirs(): Promise<void> {
    if (this.#made) return;
    await Deno.mkdir(this.#files, { recursive: true });
    await Deno.mkdir(this.#batches, { recursive: true });
    this.#made = true;
  }

  /** Stores a file's content, then its object (a file exists once its object does). */
  async putFile(meta: FileObject, content: Uint8Array): Promise<void> {
    await this.#ensureDirs();
    await writeAtomic(`${this.#files}/${meta.id}.jsonl`, content);
    await this.#putMeta(meta, `${this.#files}/${meta.id}.jsonl`);
  }

  /** Where an upload streams its content before commitUpload() (directories made). */
  async uploadPath(id: string): Promise<string> {
    await this.#ensureDirs();
    return `${this.#files}/${id}.jsonl.tmp`;
  }

  /** Moves an upload's finished, fsynced content into place, then stores its object. */
  async commitUpload(meta: FileObject, path: string): Promise<void> {
    const content = `${this.#files}/${meta.id}.jsonl`;
    await Deno.rename(path, content);
    await this.#putMeta(meta, content);
  }

  /** An output or error file: its object only, its content read from `meta.results`. */
  async putResultFile(meta: FileObject): Promise<void> {
    await this.#ensureDirs();
    await this.#putMeta(meta);
  }

  /** Writes a file object; if that fails, its content goes too, so nothing half-made stays. */
  async #putMeta(meta: FileObject, content?: string): Promise<void> {
    try {
      await writeAtomic(`${this.#files}/${meta.id}.json`, encode(JSON.stringify(meta)));
    } catch (e) {
      if (content !== undefined) await Deno.remove(content).catch(() => {});
      throw e;
    }
  }

  /**
   * Deletes a file: its object first (from then on it does not exist), then its content. An
   * output or error file's content is its batch's results log, removed with the last of the two.
   */
  async deleteFile(meta: FileObject): Promise<void> {
    await removeIfThere(`${this.#files}/${meta.id}.json`);
    if (meta.results === undefined) {
      await removeIfThere(`${this.#files}/${meta.id}.jsonl`);
      return;
    }
    const batch = await this.getBatch(meta.results.batch);
    const sibling = meta.results.ok ? batch?.error_file_id : batch?.output_file_id;
    if (sibling === null || sibling === undefined || (await this.getFile(sibling)) === undefined) {
      await removeIfThere(`${this.#batches}/${meta.results.batch}.results.jsonl`);
    }
  }

  /** Removes a batch's results log (its output and error files are gone). */
  async removeResults(batchId: string): Promise<void> {
    if (isBatchId(batchId)) await removeIfThere(`${this.#batches}/${batchId}.results.jsonl`);
  }

  /** What the files of one owner take ("" or undefined: the files without an owner). */
  async usage(scope: string | undefined): Promise<{ files: number; bytes: number }> {
    const mine = (await this.listFiles()).filter((f) => f.scope === scope);
    return { files: mine.length, bytes: mine.reduce((n, f) => n + f.bytes, 0) };
  }

  /** Removes temporaries a crash left (a half-received upload, a half-written object). */
  async removeTemporaries(): Promise<void> {
    for (const dir of [this.#files, this.#batches]) {
      try {
        for await (const e of Deno.readDir(dir)) {
          if (e.isFile && e.name.endsWith(".tmp")) await removeIfThere(`${dir}/${e.name}`);
        }
      } catch (e) {
        if (!(e instanceof Deno.errors.NotFound)) throw e;
      }
    }
  }

  async getFile(id: string): Promise<FileObject | undefined> {
    if (!isFileId(id)) return undefined;
    return await readJson<FileObject>(`${this.#files}/${id}.json`);
  }

  /** Every stored file object, newest first. */
  async listFiles(): Promise<FileObject[]> {
    const out: FileObject[] = [];
    try {
      for await (const e of Deno.readDir(this.#files)) {
        const m = /^(file-[A-Za-z0-9_-]+)\.json$/.exec(e.name);
        if (!e.isFile || m === null) continue;
        const f = await readJson<FileObject>(`${this.#files}/${e.name}`);
        if (f !== undefined) out.push(f);
      }
    } catch (e) {
      if (!(e instanceof Deno.errors.NotFound)) throw e;
    }
    return out.sort((a, b) => b.created_at - a.created_at || (a.id < b.id ? 1 : -1));
  }

  async fileContent(id: string): Promise<Uint8Array | undefined> {
    const meta = isFileId(id) ? await this.getFile(id) : undefined;
    if (meta === undefined) return undefined;
    if (meta.results === undefined) return await Deno.readFile(`${this.#files}/${id}.jsonl`);
    const { batch, ok, lines } = meta.results;
    const bytes = await Deno.readFile(`${this.#batches}/${batch}.results.jsonl`);
    const rows = parseRecords(bytes, bytes.lastIndexOf(0x0a) + 1)
      .filter((r) => r.ok === ok && r.index < lines).sort((x, y) => x.index - y.index);
    return encode(resultFileText(rows));
  }

  /** A file's content to send: an upload streams from disk; an output file is built whole. */
  async contentStream(id: string): Promise<ReadableStream<Uint8Array> | undefined> {
    const meta = isFileId(id) ? await this.getFile(id) : undefined;
    if (meta === undefined) return undefined;
    if (meta.results === undefined) {
      try {
        return (await Deno.open(`${this.#files}/${id}.jsonl`, { read: true })).readable;
      } catch (e) {
        if (e instanceof Deno.errors.NotFound) return undefined;
        throw e;
      }
    }
    const bytes = await this.fileContent(id);
    return bytes === undefined ? undefined : new Blob([bytes as Uint8Array<ArrayBuffer>]).stream();
  }

  async getBatch(id: string): Promise<BatchObject | undefined> {
    if (!isBatchId(id)) return undefined;
    return await readJson<BatchObject>(`${this.#batches}/${id}.json`);
  }

  async saveBatch(b: BatchObject): Promise<void> {
    await this.#ensureDirs();
    await writeAtomic(`${this.#batches}/${b.id}.json`, encode(JSON.stringify(b)));
  }

  /** Every stored batch (for a restart to resume the unfinished ones). */
  async listBatches(): Promise<BatchObject[]> {
    const out: BatchObject[] = [];
    let entries: Deno.DirEntry[];
    try {
      entries = await Array.fromAsync(Deno.readDir(this.#batches));
    } catch (e) {
      if (e instanceof Deno.errors.NotFound) return out;
      throw e;
    }
    for (const e of entries) {
      const m = /^(batch_[A-Za-z0-9_-]+)\.json$/.exec(e.name);
      if (!e.isFile || m === null) continue;
      const b = await readJson<BatchObject>(`${this.#batches}/${e.name}`);
      if (b !== undefined) out.push(b);
    }
    return out.sort((a, b) => a.created_at - b.created_at || (a.id < b.id ? -1 : 1));
  }

  /** Opens a batch's results log for appending, reading the records already in it. */
  async openResults(batchId: string): Promise<ResultLog> {
    await this.#ensureDirs();
    return await ResultLog.open(`${this.#batches}/${batchId}.results.jsonl`);
  }
}

/**
 * A batch's finished lines: one JSON record per line, each appended and fsynced before the
 * line counts as done. A crash can leave at most one partial record at the end, which
 * open() cuts off (that line runs again); a record whose index is already there is not
 * written twice.
 */
export class ResultLog {
  readonly records: ResultRecord[];
  readonly #file: Deno.FsFile;
  readonly #indices = new Set<number>();
  #tail: Promise<void> = Promise.resolve();
  #closed = false;

  /** Bytes of whole records: where the next one starts, and where a failed one is cut back to. */
  #size: number;

  private constructor(file: Deno.FsFile, records: ResultRecord[], size: number) {
    this.#file = file;
    this.records = records;
    this.#size = size;
    for (const r of records) this.#indices.add(r.index);
  }

  static async open(path: string): Promise<ResultLog> {
    const file = await Deno.open(path, { read: true, write: true, create: true });
    try {
      const bytes = await readHead(file, (await file.stat()).size);
      const lastNewline = bytes.lastIndexOf(0x0a);
      const whole = lastNewline + 1;
      if (whole < bytes.length) {
        // A record cut short by a crash: the line was not done.
        await file.truncate(whole);
        await file.sync();
      }
      const records = parseRecords(bytes, whole);
      await file.seek(0, Deno.SeekMode.End);
      return new ResultLog(file, records, whole);
    } catch (e) {
      file.close();
      throw e;
    }
  }

  has(index: number): boolean {
    return this.#indices.has(index);
  }

  /**
   * Appends one record and resolves once it is on disk (appends are serialized). If the disk
   * refuses it, the file is cut back to its last whole record and the record is not kept:
   * the line is not done, and may be appended again.
   */
  append(index: number, ok: boolean, line: OutputLine): Promise<void> {
    if (this.#indices.has(index)) return this.#tail;
    this.#indices.add(index);
    const record: ResultRecord = { index, ok, line };
    const bytes = encode(JSON.stringify(record) + "\n");
    const run = this.#tail.then(async () => {
      try {
        await writeAll(this.#file, bytes);
        await this.#file.sync();
      } catch (e) {
        this.#indices.delete(index);
        await this.#file.truncate(this.#size).catch(() => {});
        await this.#file.seek(this.#size, Deno.SeekMode.Start).catch(() => {});
        throw e;
      }
      this.#size += bytes.length;
      this.records.push(record);
    });
    this.#tail = run.catch(() => {});
    return run;
  }

  /** Waits for pending appends, then closes the file. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#tail;
    this.#file.close();
  }
}

function encode(text: string): Uint8Array {
  return new TextEncoder().encode(text);
}

/** The records of a results log's first `whole` bytes, the first record of each index kept. */
function parseRecords(bytes: Uint8Array, whole: number): ResultRecord[] {
  const records: ResultRecord[] = [];
  const seen = new Set<number>();
  const text = new TextDecoder().decode(bytes.subarray(0, whole));
  for (const row of text.split("\n")) {
    if (row === "") continue;
    const r = JSON.parse(row) as ResultRecord;
    if (seen.has(r.index)) continue;
    seen.add(r.index);
    records.push(r);
  }
  return records;
}

/** An output or error file's text: one line per record, in the order given. */
export function resultFileText(records: readonly ResultRecord[]): string {
  return records.map((r) => JSON.stringify(r.line) + "\n").join("");
}

async function removeIfThere(path: string): Promise<void> {
  try {
    await Deno.remove(path);
  } catch (e) {
    if (!(e instanceof Deno.errors.NotFound)) throw e;
  }
}

async function readJson<T>(path: string): Promise<T | undefined> {
  try {
    return JSON.parse(await Deno.readTextFile(path)) as T;
  } catch (e) {
    if (e instanceof Deno.errors.NotFound) return undefined;
    throw e;
  }
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.length) at += await file.write(bytes.subarray(at));
}

/** Writes to a temporary name, fsyncs, renames into place, fsyncs the directory. */
export async function writeAtomic(path: string, bytes: Uint8Array): Promise<void> {
  const tmp = `${path}.tmp`;
  const file = await Deno.open(tmp, { write: true, create: true, truncate: true });
  try {
    await writeAll(file, bytes);
    await file.sync();
  } catch (e) {
    file.close();
    await Deno.remove(tmp).catch(() => {});
    throw e;
  }
  file.close();
  await Deno.rename(tmp, path);
  await syncDir(path.slice(0, path.lastIndexOf("/")));
}

/** Makes a rename durable; where a directory cannot be opened, the rename stands as it is. */
async function syncDir(dir: string): Promise<void> {
  let d: Deno.FsFile | undefined;
  try {
    d = await Deno.open(dir, { read: true });
    await d.sync();
  } catch {
    // Not every platform lets a directory be opened and synced.
  } finally {
    d?.close();
  }
}
