/**
 * Where model files come from: a path, an http(s) URL cached in the models directory, or a short
 * name of a known model. Turns any of them into local file paths a loader can open.
 */
import { hfAccess, hfTokenFromEnv } from "./hf_token.ts";
import { sha256OfPath } from "../util/sha256.ts";
import { DownloadError, downloadFile, type DownloadOptions, PART_SUFFIX } from "./download.ts";

/** Reads an environment variable; injectable so defaults are testable without touching the process. */
export type EnvGetter = (name: string) => string | undefined;

/** Local files for a model: what `loadModel` needs. */
export interface ModelSource {
  readonly modelPath: string;
  /** A separate tokenizer file (llama2.c checkpoints); absent when the model file carries its own. */
  readonly tokenizerPath?: string;
}

/** One file of a known model: its name in the models directory or mirror, and where to fetch it. */
export interface KnownModelFile {
  readonly name: string;
  /** Absent when no public copy is known: the file must already be in the models dir or mirror. */
  readonly url?: string;
  /** Checked after a download (not for files found locally). */
  readonly sha256?: string;
}

/** A model reachable by a short name. */
export interface KnownModel {
  readonly description: string;
  readonly model: KnownModelFile;
  readonly tokenizer?: KnownModelFile;
}

/** The model used when none is given. */
export const DEFAULT_MODEL = "stories260K";

const TINYLLAMAS = "https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K";

/** Short names and their files. Hashes are those of karpathy/tinyllamas as of 2023-08-15. */
export const KNOWN_MODELS: Readonly<Record<string, KnownModel>> = {
  "stories260K": {
    description: "karpathy's 260K-parameter TinyStories Llama, llama2.c checkpoint",
    model: {
      name: "stories260K.bin",
      url: `${TINYLLAMAS}/stories260K.bin`,
      sha256: "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696",
    },
    tokenizer: {
      name: "tok512.bin",
      url: `${TINYLLAMAS}/tok512.bin`,
      sha256: "037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312",
    },
  },
  "stories260K-gguf": {
    description: "the same model converted to GGUF (F32) by llama.cpp; no public download",
    model: { name: "stories260K.gguf" },
  },
};

const denoEnv: EnvGetter = (name) => Deno.env.get(name);

/**
 * The models directory used when neither a setting nor `MODELS_DIR` names one:
 * `$XDG_CACHE_HOME/llmserve/models`, else `$HOME/.cache/llmserve/models`
 * (`%LOCALAPPDATA%\llmserve\models` on Windows, where HOME is usually unset).
 */
export function defaultModelsDir(env: EnvGetter = denoEnv): string {
  const xdg = nonEmpty(env("XDG_CACHE_HOME"));
  if (xdg !== undefined) return joinPath(xdg, "llmserve", "models");
  const home = nonEmpty(env("HOME"));
  if (home !== undefined) return joinPath(home, ".cache", "llmserve", "models");
  const localAppData = nonEmpty(env("LOCALAPPDATA"));
  if (localAppData !== undefined) return joinPath(localAppData, "llmserve", "models");
  throw new Error(
    "Cannot choose a models directory: none is configured and MODELS_DIR, XDG_CACHE_HOME, HOME " +
      "and LOCALAPPDATA are all unset; set MODELS_DIR",
  );
}

/** The models directory: the explicit setting, else env `MODELS_DIR`, else {@linkcode defaultModelsDir}. */
export function resolveModelsDir(setting?: string, env: EnvGetter = denoEnv): string {
  return nonEmpty(setting) ?? nonEmpty(env("MODELS_DIR")) ?? defaultModelsDir(env);
}

/** The local mirror of model files named by env `MODEL_MIRROR`, if set. */
export function mirrorDirFromEnv(env: EnvGetter = denoEnv): string | undefined {
  return nonEmpty(env("MODEL_MIRROR"));
}

/** How {@linkcode resolveModelSource} looks for and fetches files. */
export interface ResolveOptions {
  /** Default: {@linkcode resolveModelsDir} (env `MODELS_DIR`, then the per-user cache). */
  readonly modelsDir?: string;
  /** Directory of offline copies. Default: env `MODEL_MIRROR`; `null` means no mirror. */
  readonly mirrorDir?: string | null;
  /** A tokenizer spec (path or URL) that replaces the model's own or the known model's tokenizer. */
  readonly tokenizer?: string;
  /** Passed to every download: fetch, progress bar, abort signal. */
  readonly download?: Omit<DownloadOptions, "sha256" | "label">;
  /** Sent to Hugging Face's hosts only (hf_token.ts). Default: env `HF_TOKEN`. */
  readonly hfToken?: string;
}

/**
 * Resolves a model spec to local files, in this order:
 *
 * 1. An existing file path is used as is.
 * 2. An `http://` or `https://` URL is cached in the models directory under the URL's last path
 *    segment (sanitized, see {@linkcode fileNameForUrl}). A `<name>.url` file next to it records
 *    which URL owns the name; another URL with the same file name gets `<stem>-<hash8><ext>`
 *    instead. A cached file is reused without any request. Before downloading, a file of the
 *    same name in the mirror (`MODEL_MIRROR`) is used in place: the mirror is read-only and
 *    local, so copying it would only duplicate bytes. Otherwise the file is downloaded once
 *    (progress on stderr, size-checked, atomic, resumable: see `downloadFile`).
 * 3. A known short name ({@linkcode KNOWN_MODELS}, case-insensitive) looks up each of its files
 *    in the models directory, then the mirror, then downloads it from its URL and checks its
 *    SHA-256; a file without a URL that is in neither place is an error saying where to put it.
 *
 * Anything else is an error that lists the known names and says a path or URL works too.
 */
export async function resolveModelSource(
  spec: string = DEFAULT_MODEL,
  options: ResolveOptions = {},
): Promise<ModelSource> {
  const context = makeContext(options);
  const resolved = await resolveSpec(spec, context);
  if (options.tokenizer !== undefined) {
    const tokenizerPath = await resolveFileSpec(options.tokenizer, options);
    return { modelPath: resolved.modelPath, tokenizerPath };
  }
  return resolved;
}

/**
 * Resolves a single-file spec (a path or an http(s) URL, e.g. a `--tokenizer` argument) to a
 * local path, with the same caching and mirror rules as a model URL.
 */
export async function resolveFileSpec(spec: string, options: ResolveOptions = {}): Promise<string> {
  const context = makeContext(options);
  if (isHttpUrl(spec)) return await resolveUrl(spec, context);
  const info = await statOrNull(spec);
  if (info?.isFile) return spec;
  throw new Error(
    info === null
      ? `Cannot find file "${spec}": no such file; give an existing path or an http(s) URL`
      : info.isDirectory
      ? `Cannot use "${spec}": it is a directory, not a file`
      : `Cannot use "${spec}": it is ${specialFileKind(info)}, not a regular file`,
  );
}

/** The endings of a model file (GGUF, llama2.c checkpoint or tokenizer), in any case. */
export const MODEL_FILE = /\.(gguf|bin)$/i;

/** A file's name without its directory and its `.gguf`/`.bin`: the name it is served by. */
export function modelStem(path: string): string {
  return path.split(/[\\/]/).pop()!.replace(MODEL_FILE, "");
}

/** A spec that names a file rather than a model: it has a directory part or a model extension. */
export function isPathSpec(spec: string): boolean {
  return /[\\/]/.test(spec) || MODEL_FILE.test(spec);
}

/** True for specs that name an `http://` or `https://` resource. */
export function isHttpUrl(spec: string): boolean {
  return /^https?:\/\//i.test(spec.trim());
}

/**
 * The cache file name for a URL: the last path segment, percent-decoded, with every character
 * outside `A-Z a-z 0-9 . _ -` replaced by `_` and leading dots removed (no hidden files, no
 * `..`), at most 200 characters; `download` if nothing is left. The query string is ignored.
 */
export function fileNameForUrl(url: string | URL): string {
  const parsed = typeof url === "string" ? new URL(url) : url;
  const segments = parsed.pathname.split("/").filter((s) => s !== "");
  let name = segments.at(-1) ?? "";
  try {
    name = decodeURIComponent(name);
  } catch {
    // A malformed escape stays as written; sanitizing below makes it safe anyway.
  }
  name = name.replace(/[^A-Za-z0-9._-]/g, "_").replace(/^\.+/, "");
  if (name.length > 200) {
    const ext = extension(name);
    name = name.slice(0, 200 - ext.length) + ext;
  }
  return name === "" ? "download" : name;
}

/** Sorted known names, the default marked, for messages and `--help`. */
export function describeKnownModels(): string {
  return Object.keys(KNOWN_MODELS)
    .map((name) => (name === DEFAULT_MODEL ? `${name} (default)` : name))
    .join(", ");
}

interface Context {
  readonly modelsDir: string;
  readonly mirrorDir: string | undefined;
  readonly download: Omit<DownloadOptions, "sha256" | "label">;
  readonly hfToken: string | undefined;
}

function makeContext(options: ResolveOptions): Context {
  return {
    modelsDir: options.modelsDir ?? resolveModelsDir(),
    mirrorDir: options.mirrorDir === null ? undefined : options.mirrorDir ?? mirrorDirFromEnv(),
    download: options.download ?? {},
    hfToken: options.hfToken ?? hfTokenFromEnv(),
  };
}

async function resolveSpec(spec: string, context: Context): Promise<ModelSource> {
  if (isHttpUrl(spec)) return { modelPath: await resolveUrl(spec, context) };
  // Only a spec that looks like a path is looked up in the working directory: a name should
  // mean the same thing wherever the server runs, and the server may not read there.
  const info = isPathSpec(spec) ? await statOrNull(spec) : null;
  if (info?.isFile) return { modelPath: spec };
  if (info?.isDirectory) {
    throw new Error(
      `Cannot use "${spec}" as a model: it is a directory; give a .gguf or llama2.c .bin file`,
    );
  }
  if (info !== null && !info.isFile) {
    // A FIFO, socket or device exists but cannot be mapped and re-read as a model must be;
    // it was reported as "no such file".
    throw new Error(
      `Cannot use "${spec}" as a model: it is ${specialFileKind(info)}, not a regular file; ` +
        "give a .gguf or llama2.c .bin file",
    );
  }
  const knownName = Object.keys(KNOWN_MODELS).find((n) => n.toLowerCase() === spec.toLowerCase());
  const known = knownName === undefined ? undefined : KNOWN_MODELS[knownName];
  if (knownName !== undefined && known !== undefined) {
    const modelPath = await resolveKnownFile(knownName, known.model, context);
    if (known.tokenizer === undefined) return { modelPath };
    const tokenizerPath = await resolveKnownFile(knownName, known.tokenizer, context);
    return { modelPath, tokenizerPath };
  }
  // A file of the models directory or the mirror, by its name or its stem.
  if (!/[\\/]/.test(spec)) {
    const byName = await findLocalByName(spec, context);
    if (byName !== undefined) return { modelPath: byName };
  }
  const local = await listLocalModelFiles(context);
  const stems = [...new Set(local.files.filter((f) => f.kind === "model").map((f) => f.stem))];
  const alternatives = `known names: ${describeKnownModels()}; ` +
    `files by stem in ${describeLookupPlaces(context)}: ${
      stems.length === 0 ? "none" : stems.join(", ")
    }; a path to an existing .gguf or llama2.c .bin file, or an http(s) URL, also works`;
  if (isPathSpec(spec)) {
    throw new Error(`Cannot find model file "${spec}": no such file; ${alternatives}`);
  }
  throw new Error(`Unknown model "${spec}"; ${alternatives}`);
}

/** "the models directory (<dir>) and the mirror (<dir>)", or without the mirror when unset. */
function describeLookupPlaces(context: Context): string {
  return context.mirrorDir === undefined
    ? `the models directory (${context.modelsDir}; MODEL_MIRROR is unset)`
    : `the models directory (${context.modelsDir}) and the mirror (${context.mirrorDir})`;
}

/** `name`, `name.gguf` or `name.bin` in the models directory, then the mirror. */
async function findLocalByName(name: string, context: Context): Promise<string | undefined> {
  const candidates = MODEL_FILE.test(name) ? [name] : [`${name}.gguf`, `${name}.bin`];
  for (const dir of [context.modelsDir, context.mirrorDir]) {
    if (dir === undefined) continue;
    for (const c of candidates) {
      const path = joinPath(dir, c);
      if (await isFile(path)) return path;
    }
  }
  return undefined;
}

/** A model-like file found in the models directory or the mirror. */
export interface LocalModelFile {
  /** The file name, e.g. `stories260K-q8_0.gguf`. */
  readonly name: string;
  /** The name without `.gguf`/`.bin`: what `--model` accepts. */
  readonly stem: string;
  readonly path: string;
  readonly place: "models dir" | "mirror";
  readonly bytes: number;
  /** `tokenizer` for a known model's tokenizer file (e.g. tok512.bin), else `model`. */
  readonly kind: "model" | "tokenizer";
}

/**
 * The `.gguf` and `.bin` files of the models directory and the mirror (downloads in progress
 * and `.url` records left out), models directory first, each sorted by name.
 */
export async function listLocalModelFiles(
  options: Pick<ResolveOptions, "modelsDir" | "mirrorDir"> = {},
): Promise<{ modelsDir: string; mirrorDir?: string; files: LocalModelFile[] }> {
  const context = makeContext(options);
  const tokenizerNames = new Set(
    Object.values(KNOWN_MODELS).flatMap((m) => m.tokenizer ? [m.tokenizer.name] : []),
  );
  const files: LocalModelFile[] = [];
  const places = [[context.modelsDir, "models dir"], [context.mirrorDir, "mirror"]] as const;
  for (const [dir, place] of places) {
    if (dir === undefined) continue;
    const names: string[] = [];
    try {
      for await (const e of Deno.readDir(dir)) {
        if (!MODEL_FILE.test(e.name)) continue;
        // A shared model store is often a folder of links to one copy of each file; a link
        // whose target is gone is not a model.
        if (e.isFile || (e.isSymlink && await isFile(joinPath(dir, e.name)))) names.push(e.name);
      }
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) continue;
      throw error;
    }
    for (const name of names.sort()) {
      const path = joinPath(dir, name);
      const bytes = (await Deno.stat(path)).size;
      const stem = modelStem(name);
      const kind = tokenizerNames.has(name) ? "tokenizer" : "model";
      files.push({ name, stem, path, place, bytes, kind });
    }
  }
  return { modelsDir: context.modelsDir, mirrorDir: context.mirrorDir, files };
}

async function resolveKnownFile(
  modelName: string,
  file: KnownModelFile,
  context: Context,
): Promise<string> {
  const cached = joinPath(context.modelsDir, file.name);
  if (await isFile(cached)) return cached;
  const mirrored = await findInMirror(file.name, context);
  if (mirrored !== undefined) return mirrored;
  if (file.url === undefined) {
    const where = context.mirrorDir === undefined
      ? `not in the models directory (${context.modelsDir}) and MODEL_MIRROR is unset`
      : `in neither the models directory (${context.modelsDir}) nor the mirror (${context.mirrorDir})`;
    throw new Error(
      `Cannot find ${file.name} for model "${modelName}": it is ${where}, and it has no public ` +
        "download URL; copy the file into the models directory or pass its path",
    );
  }
  await withOfflineHint(
    file.name,
    context,
    downloadFile(file.url, cached, {
      ...context.download,
      ...hfAccess(file.url, context.hfToken),
      label: file.name,
      sha256: file.sha256,
    }),
  );
  return cached;
}

/** Adds, to a download that never reached its server, where a copy could be put instead. */
async function withOfflineHint<T>(
  name: string,
  context: Context,
  download: Promise<T>,
): Promise<T> {
  try {
    return await download;
  } catch (e) {
    if (!(e instanceof DownloadError) || !e.unreachable) throw e;
    throw new DownloadError(
      `${e.message}; to run without it, put ${name} in the models directory ` +
        `(${context.modelsDir}), set MODEL_MIRROR to a directory of copies` +
        (context.mirrorDir === undefined ? "" : ` (now ${context.mirrorDir})`) +
        ", or pass --model <path>",
      { cause: e.cause, unreachable: true },
    );
  }
}

async function resolveUrl(url: string, context: Context): Promise<string> {
  let parsed: URL;
  try {
    parsed = new URL(url.trim());
  } catch {
    throw new Error(`Cannot use "${url}" as a model URL: it is not a valid URL`);
  }
  const href = parsed.href;
  const plainName = fileNameForUrl(parsed);
  let name = plainName;
  const owner = await readTextOrNull(recordPath(context.modelsDir, plainName));
  if (owner !== null && owner.trim() !== href) name = await hashedName(plainName, href);

  const cached = joinPath(context.modelsDir, name);
  if (await isFile(cached)) return cached;
  // A mirror file of the same name stands in only when the server vouches that it is the
  // same file (its SHA-256): a name alone says nothing about the bytes behind a URL.
  const mirrored = await findInMirror(plainName, context);
  if (mirrored !== undefined && await sameFileAsServed(mirrored, href, context)) return mirrored;

  // Claim the name before the first byte lands, so a .part is never resumed from another URL.
  await Deno.mkdir(context.modelsDir, { recursive: true });
  const record = recordPath(context.modelsDir, name);
  await Deno.writeTextFile(record, href + "\n");
  try {
    await withOfflineHint(
      name,
      context,
      downloadFile(href, cached, {
        ...context.download,
        ...hfAccess(href, context.hfToken),
        label: name,
      }),
    );
  } catch (e) {
    // The record only guards a .part to resume; with nothing kept it would be a stray file.
    if (!(await isFile(cached + PART_SUFFIX))) await Deno.remove(record).catch(() => {});
    throw e;
  }
  return cached;
}

/**
 * Whether `url` serves exactly the bytes of the local file `path`: asks for the headers only
 * and compares the SHA-256 the server announces (Hugging Face's `X-Linked-Etag` on the
 * redirect, or an `ETag` that is a SHA-256) with the file's. False when the server announces
 * none or cannot be asked.
 */
export async function sameFileAsServed(
  path: string,
  url: string,
  context: Pick<Context, "download">,
): Promise<boolean> {
  const doFetch = context.download.fetch ?? fetch;
  let target = url;
  let announced: string | undefined;
  try {
    for (let hop = 0; hop < 5 && announced === undefined; hop++) {
      const res = await doFetch(target, {
        method: "HEAD",
        redirect: "manual",
        signal: context.download.signal,
      });
      await res.body?.cancel();
      announced = sha256Header(res.headers);
      const location = res.headers.get("location");
      if (res.status < 300 || res.status >= 400 || location === null) break;
      target = new URL(location, target).href;
    }
  } catch {
    return false;
  }
  return announced !== undefined && announced === await sha256OfPath(path);
}

function sha256Header(headers: Headers): string | undefined {
  for (const name of ["x-linked-etag", "etag"]) {
    const v = headers.get(name)?.replace(/^W\//, "").replace(/"/g, "").trim().toLowerCase();
    if (v !== undefined && /^[0-9a-f]{64}$/.test(v)) return v;
  }
  return undefined;
}

async function findInMirror(name: string, context: Context): Promise<string | undefined> {
  if (context.mirrorDir === undefined) return undefined;
  const path = joinPath(context.mirrorDir, name);
  return (await isFile(path)) ? path : undefined;
}

/** `<stem>-<first 8 hex of sha256(url)><ext>`: stable per URL, distinct between URLs. */
async function hashedName(name: string, url: string): Promise<string> {
  const digest = new Uint8Array(
    await crypto.subtle.digest("SHA-256", new TextEncoder().encode(url)),
  );
  const hex = Array.from(digest.subarray(0, 4), (b) => b.toString(16).padStart(2, "0")).join("");
  const ext = extension(name);
  return `${name.slice(0, name.length - ext.length)}-${hex}${ext}`;
}

function recordPath(modelsDir: string, name: string): string {
  return joinPath(modelsDir, `${name}.url`);
}

function extension(name: string): string {
  const dot = name.lastIndexOf(".");
  return dot > 0 ? name.slice(dot) : "";
}

function joinPath(dir: string, ...parts: string[]): string {
  const sep = dir.includes("\\") && !dir.includes("/") ? "\\" : "/";
  return [dir.replace(/[\\/]+$/, ""), ...parts].join(sep);
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === "" ? undefined : value;
}

async function statOrNull(path: string): Promise<Deno.FileInfo | null> {
  try {
    return await Deno.stat(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
      return null;
    }
    throw error;
  }
}

async function isFile(path: string): Promise<boolean> {
  return (await statOrNull(path))?.isFile ?? false;
}

async function readTextOrNull(path: string): Promise<string | null> {
  try {
    return await Deno.readTextFile(path);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw error;
  }
}

/** What a path that is neither a regular file nor a directory is, for an error message. */
function specialFileKind(info: Deno.FileInfo): string {
  if (info.isFifo) return "a FIFO (named pipe)";
  if (info.isSocket) return "a socket";
  if (info.isCharDevice || info.isBlockDevice) return "a device";
  if (info.isSymlink) return "a dangling symbolic link";
  return "not a regular file";
}
