import { hfAccess } from "../lib/source/hf_token.ts";
import {
  assert,
  assertEquals,
  assertMatch,
  assertRejects,
  assertStringIncludes,
} from "@std/assert";
import { DownloadError, downloadFile } from "../lib/source/download.ts";
import {
  defaultModelsDir,
  fileNameForUrl,
  KNOWN_MODELS,
  resolveModelsDir,
  resolveModelSource,
} from "../lib/source/model_source.ts";
import { formatBytes } from "../lib/util/byte_size.ts";
import { formatProgress, ProgressBar } from "../lib/util/progress_bar.ts";

function modelsMirror(): string {
  const dir = Deno.env.get("MODEL_MIRROR");
  if (!dir) {
    throw new Error(
      "MODEL_MIRROR is unset: point it at the directory of test models (e.g. ../shared/models)",
    );
  }
  return dir;
}

const mirrorBytes = (name: string) => Deno.readFile(`${modelsMirror()}/${name}`);

interface SeenRequest {
  readonly path: string;
  readonly range: string | null;
  readonly acceptEncoding: string | null;
  readonly status: number;
}

interface ServeOptions {
  /** The first response announces the whole file but ends after this many bytes. */
  readonly cutFirstAt?: number;
  /** Every response announces the whole file but ends after this many bytes. */
  readonly cutAlwaysAt?: number;
  /** Answer Range requests with the whole file (200). */
  readonly ignoreRange?: boolean;
  /** Added to the total that 206 responses announce in Content-Range. */
  readonly lieAboutTotalBy?: number;
}

interface FileServer {
  readonly base: string;
  readonly requests: SeenRequest[];
  close(): Promise<void>;
}

/** A local HTTP server for `files` (path -> bytes) with Range support and scripted misbehaviour. */
function serveFiles(files: Record<string, Uint8Array>, options: ServeOptions = {}): FileServer {
  const requests: SeenRequest[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    const path = new URL(request.url).pathname;
    const range = request.headers.get("range");
    const respond = (status: number, body: BodyInit | null, headers: HeadersInit = {}) => {
      requests.push({
        path,
        range,
        acceptEncoding: request.headers.get("accept-encoding"),
        status,
      });
      return new Response(body, { status, headers });
    };
    const bytes = files[path];
    if (bytes === undefined) return respond(404, "not found");

    const first = requests.length === 0;
    const cutAt = first && options.cutFirstAt !== undefined
      ? options.cutFirstAt
      : options.cutAlwaysAt;
    const start = Number(/^bytes=(\d+)-$/.exec(range ?? "")?.[1] ?? 0);
    if (range === null || options.ignoreRange) {
      return respond(200, chunked(bytes, cutAt), { "content-length": String(bytes.length) });
    }
    if (start >= bytes.length) {
      return respond(416, null, { "content-range": `bytes */${bytes.length}` });
    }
    const total = bytes.length + (options.lieAboutTotalBy ?? 0);
    return respond(206, chunked(bytes.subarray(start), cutAt), {
      "content-length": String(bytes.length - start),
      "content-range": `bytes ${start}-${bytes.length - 1}/${total}`,
    });
  });
  return {
    base: `http://127.0.0.1:${server.addr.port}`,
    requests,
    close: () => server.shutdown(),
  };
}

/** Streams `bytes` in 64 KiB chunks, stopping early (a cut connection) at `cutAt`. */
function chunked(bytes: Uint8Array, cutAt?: number): ReadableStream<Uint8Array> {
  const end = Math.min(bytes.length, cutAt ?? bytes.length);
  let offset = 0;
  return new ReadableStream({
    pull(controller) {
      if (offset >= end) return controller.close();
      const next = Math.min(end, offset + 65536);
      controller.enqueue(bytes.slice(offset, next));
      offset = next;
    },
  });
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

async function sha256Hex(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Runs `body` with a fresh temp dir and the given server, always cleaning both up. */
async function withServer(
  files: Record<string, Uint8Array>,
  options: ServeOptions,
  body: (server: FileServer, dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const server = serveFiles(files, options);
  try {
    await body(server, dir);
  } finally {
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
}

const noNetwork: typeof fetch = (input) => {
  throw new Error(`unexpected request for ${String(input)}`);
};

Deno.test("downloadFile() streams the served file into place only once it is complete", async () => {
  const source = await mirrorBytes("stories260K.bin");
  await withServer({ "/stories260K.bin": source }, {}, async (server, dir) => {
    const dest = `${dir}/models/stories260K.bin`;
    let drawn = "";
    let draws = 0;
    let finalVisibleEarly = false;
    const result = await downloadFile(`${server.base}/stories260K.bin`, dest, {
      progress: {
        intervalMs: 0,
        sink: (text) => {
          drawn += text;
          draws++;
          // Until the rename, only the .part may exist.
          if (!text.endsWith("\n") && Deno.statSync(`${dest}.part`).size < source.length) {
            try {
              Deno.statSync(dest);
              finalVisibleEarly = true;
            } catch { /* expected: not there yet */ }
          }
        },
      },
    });
    assertEquals(result, { path: dest, bytes: source.length, resumedFrom: 0 });
    assertEquals(await Deno.readFile(dest), source);
    assert(!(await exists(`${dest}.part`)), ".part must be renamed away");
    assert(!finalVisibleEarly, "the final file appeared before the download finished");
    assert(draws > 2, `expected several progress draws, got ${draws}`);
    assertStringIncludes(drawn, "100%");
    assertStringIncludes(drawn, `${formatBytes(source.length)} / ${formatBytes(source.length)}`);
    assertEquals(server.requests.length, 1);
    assertEquals(server.requests[0]?.range, null);
    assertEquals(server.requests[0]?.acceptEncoding, "identity");
  });
});

Deno.test("resolveModelSource() downloads a URL once and reuses the cached file without a request", async () => {
  const source = await mirrorBytes("stories260K.bin");
  await withServer({ "/m/stories260K.bin": source }, {}, async (server, dir) => {
    const options = { modelsDir: dir, mirrorDir: null, download: { progress: false } } as const;
    const url = `${server.base}/m/stories260K.bin`;
    const first = await resolveModelSource(url, options);
    assertEquals(first, { modelPath: `${dir}/stories260K.bin` });
    assertEquals(await Deno.readFile(first.modelPath), source);
    assertEquals(server.requests.length, 1);

    const second = await resolveModelSource(url, options);
    assertEquals(second, first);
    assertEquals(server.requests.length, 1, "the second resolution must not touch the network");
  });
});

Deno.test("downloadFile() resumes a .part left by a broken connection with a Range request", async () => {
  const source = await mirrorBytes("stories260K.bin");
  const cut = Math.floor(source.length / 2);
  await withServer({ "/f.bin": source }, { cutFirstAt: cut }, async (server, dir) => {
    const dest = `${dir}/f.bin`;
    const url = `${server.base}/f.bin`;
    const error = await assertRejects(
      () => downloadFile(url, dest, { progress: false }),
      DownloadError,
    );
    assertMatch(error.message, /the transfer broke off/);
    assertStringIncludes(error.message, `${dest}.part is kept`);
    assert(!(await exists(dest)), "no final file after a broken transfer");
    const partSize = (await Deno.stat(`${dest}.part`)).size;
    assert(partSize > 0 && partSize <= cut, `.part holds ${partSize} bytes, cut at ${cut}`);
    assertEquals(await Deno.readFile(`${dest}.part`), source.subarray(0, partSize));

    const result = await downloadFile(url, dest, { progress: false });
    assertEquals(server.requests.map((r) => [r.range, r.status]), [
      [null, 200],
      [`bytes=${partSize}-`, 206],
    ]);
    assertEquals(result, { path: dest, bytes: source.length, resumedFrom: partSize });
    assertEquals(await Deno.readFile(dest), source);
    assert(!(await exists(`${dest}.part`)));
  });
});

Deno.test("downloadFile() starts over when the server answers a Range request with the whole file", async () => {
  const source = await mirrorBytes("tok512.bin");
  await withServer({ "/tok512.bin": source }, { ignoreRange: true }, async (server, dir) => {
    const dest = `${dir}/tok512.bin`;
    await Deno.writeFile(`${dest}.part`, new Uint8Array(1000).fill(0xee));
    const result = await downloadFile(`${server.base}/tok512.bin`, dest, { progress: false });
    assertEquals(server.requests.map((r) => [r.range, r.status]), [["bytes=1000-", 200]]);
    assertEquals(result.resumedFrom, 0);
    assertEquals(await Deno.readFile(dest), source);
  });
});

Deno.test("downloadFile() completes a .part that already holds the whole file (416)", async () => {
  const source = await mirrorBytes("tok512.bin");
  await withServer({ "/tok512.bin": source }, {}, async (server, dir) => {
    const dest = `${dir}/tok512.bin`;
    await Deno.writeFile(`${dest}.part`, source);
    const result = await downloadFile(`${server.base}/tok512.bin`, dest, { progress: false });
    assertEquals(server.requests.map((r) => r.status), [416]);
    assertEquals(result, { path: dest, bytes: source.length, resumedFrom: source.length });
    assertEquals(await Deno.readFile(dest), source);
  });
});

Deno.test("downloadFile() rejects a body shorter than its Content-Length and leaves no final file", async () => {
  const source = await mirrorBytes("stories260K.bin");
  const sent = 300_000;
  await withServer({ "/f.bin": source }, { cutAlwaysAt: sent }, async (server, dir) => {
    const dest = `${dir}/f.bin`;
    const url = `${server.base}/f.bin`;
    const error = await assertRejects(
      () => downloadFile(url, dest, { progress: false }),
      DownloadError,
    );
    assertMatch(
      error.message,
      new RegExp(`^Downloaded \\d+ bytes of ${url} but the server announced ${source.length}`),
    );
    assert(!(await exists(dest)), "a short body must not become the final file");
  });
});

Deno.test("downloadFile() deletes a finished transfer whose size disagrees with the announced total", async () => {
  const source = await mirrorBytes("stories260K.bin");
  const extra = 100;
  await withServer({ "/f.bin": source }, { lieAboutTotalBy: extra }, async (server, dir) => {
    const dest = `${dir}/f.bin`;
    const url = `${server.base}/f.bin`;
    await Deno.writeFile(`${dest}.part`, source.subarray(0, 4096));
    const error = await assertRejects(
      () => downloadFile(url, dest, { progress: false }),
      DownloadError,
    );
    assertEquals(
      error.message,
      `Downloaded ${source.length} bytes of ${url} but the server announced ${
        source.length + extra
      }; deleted ${dest}.part`,
    );
    assertEquals(server.requests.map((r) => [r.range, r.status]), [["bytes=4096-", 206]]);
    assert(!(await exists(dest)), "no final file");
    assert(!(await exists(`${dest}.part`)), "wrong bytes must not be resumed later");
  });
});

Deno.test("downloadFile() checks an expected sha256 and deletes a mismatching file", async () => {
  const source = await mirrorBytes("tok512.bin");
  await withServer({ "/tok512.bin": source }, {}, async (server, dir) => {
    const url = `${server.base}/tok512.bin`;
    const good = await sha256Hex(source);
    const bad = good.replace(/^./, (c) => (c === "0" ? "1" : "0"));
    const error = await assertRejects(
      () => downloadFile(url, `${dir}/bad.bin`, { progress: false, sha256: bad }),
      DownloadError,
    );
    assertStringIncludes(error.message, `their sha256 is ${good}, expected ${bad}`);
    assert(!(await exists(`${dir}/bad.bin`)) && !(await exists(`${dir}/bad.bin.part`)));

    await downloadFile(url, `${dir}/good.bin`, { progress: false, sha256: good.toUpperCase() });
    assertEquals(await Deno.readFile(`${dir}/good.bin`), source);
  });
});

Deno.test("resolveModelSource() uses MODEL_MIRROR before the network for a known name", async () => {
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const mirror = modelsMirror();
  try {
    // mirrorDir is left to its default, so this also checks that MODEL_MIRROR is read.
    const byName = await resolveModelSource("stories260K", {
      modelsDir: dir,
      download: { fetch: noNetwork },
    });
    assertEquals(byName, {
      modelPath: `${mirror}/stories260K.bin`,
      tokenizerPath: `${mirror}/tok512.bin`,
    });
    assertEquals(
      await resolveModelSource("stories260K-gguf", { modelsDir: dir }),
      { modelPath: `${mirror}/stories260K.gguf` },
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** Serves `bytes` at every path, announcing `etag` (when given) on HEAD and GET; logs methods. */
function serveWithEtag(bytes: Uint8Array<ArrayBuffer>, etag?: string) {
  const methods: string[] = [];
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    methods.push(req.method);
    const headers: Record<string, string> = { "content-length": String(bytes.length) };
    if (etag !== undefined) headers.etag = `"${etag}"`;
    return new Response(req.method === "HEAD" ? null : bytes, { headers });
  });
  return { base: `http://127.0.0.1:${server.addr.port}`, methods, close: () => server.shutdown() };
}

Deno.test("resolveModelSource() never swaps a URL for a mirror file of the same name unless the server's SHA-256 matches it", async () => {
  const mirror = modelsMirror();
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const other = new Uint8Array(10).fill(7);
  const unlike = serveWithEtag(other);
  try {
    // Same file name as the mirror's stories260K.bin, other bytes, no hash announced: downloaded.
    const got = await resolveModelSource(`${unlike.base}/x/stories260K.bin`, {
      modelsDir: dir,
      download: { progress: false },
    });
    assertEquals(got, { modelPath: `${dir}/stories260K.bin` });
    assertEquals(await Deno.readFile(`${dir}/stories260K.bin`), other);
    assertEquals(unlike.methods.includes("GET"), true, unlike.methods.join());
  } finally {
    await unlike.close();
  }
  const real = await mirrorBytes("stories260K.gguf");
  const same = serveWithEtag(real, await sha256Hex(real));
  const dir2 = await Deno.makeTempDir({ prefix: "model_source_test_" });
  try {
    // The server vouches for the mirror's bytes: the mirror copy is used, nothing is fetched.
    const got = await resolveModelSource(`${same.base}/y/stories260K.gguf`, { modelsDir: dir2 });
    assertEquals(got, { modelPath: `${mirror}/stories260K.gguf` });
    assertEquals(same.methods, ["HEAD"]);
  } finally {
    await same.close();
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(dir2, { recursive: true });
  }
});

Deno.test("resolveModelSource() leaves no .url record behind a download that failed", async () => {
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    () => new Response("gone", { status: 404 }),
  );
  try {
    await assertRejects(
      () =>
        resolveModelSource(`http://127.0.0.1:${server.addr.port}/m/model.gguf`, {
          modelsDir: dir,
          mirrorDir: null,
          download: { progress: false },
        }),
      DownloadError,
      "HTTP 404",
    );
    assertEquals([...Deno.readDirSync(dir)].map((e) => e.name), []);
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resolveModelSource() finds a file of the models directory or the mirror by its stem", async () => {
  const mirror = modelsMirror();
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  try {
    const opts = { modelsDir: dir, download: { fetch: noNetwork } };
    assertEquals(await resolveModelSource("stories260K-q8_0", opts), {
      modelPath: `${mirror}/stories260K-q8_0.gguf`,
    });
    // The models directory comes first.
    await Deno.writeFile(
      `${dir}/stories260K-q8_0.gguf`,
      await mirrorBytes("stories260K-q8_0.gguf"),
    );
    assertEquals(await resolveModelSource("stories260K-q8_0", opts), {
      modelPath: `${dir}/stories260K-q8_0.gguf`,
    });
    // A bare file name is looked up there too.
    assertEquals(await resolveModelSource("stories260K-ctx512.gguf", opts), {
      modelPath: `${mirror}/stories260K-ctx512.gguf`,
    });
    const err = await assertRejects(() => resolveModelSource("stories999", opts));
    assertStringIncludes(err.message, `the models directory (${dir})`);
    assertStringIncludes(err.message, `the mirror (${mirror})`);
    assertStringIncludes(err.message, "stories260K-q8_0");
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a connection or TLS failure is reported as what it is, with where the models directory is", async () => {
  const modelsDir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  // A port nobody listens on: the connection is refused.
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (probe.addr as Deno.NetAddr).port;
  probe.close();
  try {
    const refused = await assertRejects(() =>
      resolveModelSource(`http://127.0.0.1:${port}/m.gguf`, {
        modelsDir,
        mirrorDir: null,
        download: { progress: false },
      })
    );
    assertStringIncludes(refused.message, "the connection was refused");
    assertStringIncludes(refused.message, `the models directory (${modelsDir})`);
    assertEquals(refused.message.includes("offline?"), false, refused.message);
    // A plain-HTTP server spoken to over TLS fails the handshake.
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen() {} },
      () => new Response("x"),
    );
    try {
      const tls = await assertRejects(() =>
        resolveModelSource(`https://127.0.0.1:${server.addr.port}/m.gguf`, {
          modelsDir,
          mirrorDir: null,
          download: { progress: false },
        })
      );
      assertStringIncludes(tls.message, "TLS failed");
    } finally {
      await server.shutdown();
    }
    assertEquals([...Deno.readDirSync(modelsDir)].map((e) => e.name), []);
  } finally {
    await Deno.remove(modelsDir, { recursive: true });
  }
});

Deno.test("ProgressBar writes a whole line every few seconds when stderr is not a terminal", () => {
  const out: string[] = [];
  let now = 0;
  const bar = new ProgressBar("m.gguf", 1000, 0, {
    sink: (t) => out.push(t),
    mode: "lines",
    now: () => now,
  });
  for (now = 0; now <= 12_000; now += 500) bar.update(now / 12);
  bar.finish(1000);
  // First line at 5 s, then 10 s, then the final one; no carriage returns.
  assertEquals(out.length, 3, JSON.stringify(out));
  assertEquals(out.every((l) => l.endsWith("\n") && !l.includes("\r")), true);
  assertStringIncludes(out[2]!, "100%");
  // Quick work writes nothing at all.
  const quiet: string[] = [];
  const q = new ProgressBar("m.gguf", 10, 0, {
    sink: (t) => quiet.push(t),
    mode: "lines",
    now: () => 0,
  });
  q.update(5);
  q.finish(10);
  assertEquals(quiet, []);
});

Deno.test("resolveModelSource() prefers the models directory over the mirror for a known name", async () => {
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  try {
    await Deno.writeFile(`${dir}/stories260K.bin`, await mirrorBytes("stories260K.bin"));
    const resolved = await resolveModelSource("STORIES260k", {
      modelsDir: dir,
      download: { fetch: noNetwork },
    });
    assertEquals(resolved, {
      modelPath: `${dir}/stories260K.bin`,
      tokenizerPath: `${modelsMirror()}/tok512.bin`,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("resolveModelSource() downloads stories260K from its known URLs and checks their sha256", async () => {
  const model = await mirrorBytes("stories260K.bin");
  const tokenizer = await mirrorBytes("tok512.bin");
  const corrupted = model.slice();
  corrupted[1000] = (corrupted[1000] ?? 0) ^ 1;
  for (const [served, shouldPass] of [[model, true], [corrupted, false]] as const) {
    const files = { "/stories260K.bin": served, "/tok512.bin": tokenizer };
    await withServer(files, {}, async (server, dir) => {
      const hub = "https://huggingface.co/karpathy/tinyllamas/resolve/main/stories260K";
      const seen: string[] = [];
      const viaLocalServer: typeof fetch = (input, init) => {
        const url = String(input);
        seen.push(url);
        return fetch(url.replace(hub, server.base), init);
      };
      const options = {
        modelsDir: dir,
        mirrorDir: null,
        download: { fetch: viaLocalServer, progress: false },
      } as const;
      if (!shouldPass) {
        const error = await assertRejects(() => resolveModelSource("stories260K", options));
        assertStringIncludes(error.message, `expected ${KNOWN_MODELS.stories260K?.model.sha256}`);
        assert(!(await exists(`${dir}/stories260K.bin`)));
        return;
      }
      const resolved = await resolveModelSource("stories260K", options);
      assertEquals(resolved, {
        modelPath: `${dir}/stories260K.bin`,
        tokenizerPath: `${dir}/tok512.bin`,
      });
      assertEquals(seen, [`${hub}/stories260K.bin`, `${hub}/tok512.bin`]);
      assertEquals(await Deno.readFile(resolved.modelPath), model);
      assertEquals(await Deno.readFile(resolved.tokenizerPath!), tokenizer);
      assertEquals(await resolveModelSource("stories260K", options), resolved);
      assertEquals(seen.length, 2, "the second resolution must not download again");
    });
  }
});

Deno.test("resolveModelSource() keeps two URLs with the same file name apart", async () => {
  const a = await mirrorBytes("tok512.bin");
  const b = await mirrorBytes("stories260K.bin");
  await withServer({ "/a/model.bin": a, "/b/model.bin": b }, {}, async (server, dir) => {
    const options = { modelsDir: dir, mirrorDir: null, download: { progress: false } } as const;
    const first = await resolveModelSource(`${server.base}/a/model.bin`, options);
    const second = await resolveModelSource(`${server.base}/b/model.bin`, options);
    assertEquals(first.modelPath, `${dir}/model.bin`);
    assertMatch(second.modelPath, new RegExp(`^${dir}/model-[0-9a-f]{8}\\.bin$`));
    assertEquals(await Deno.readFile(first.modelPath), a);
    assertEquals(await Deno.readFile(second.modelPath), b);

    assertEquals(await resolveModelSource(`${server.base}/b/model.bin`, options), second);
    assertEquals(await resolveModelSource(`${server.base}/a/model.bin`, options), first);
    assertEquals(server.requests.length, 2);
  });
});

Deno.test("resolveModelSource() takes an existing path as is and explains every failure", async () => {
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const emptyMirror = await Deno.makeTempDir({ prefix: "model_source_mirror_" });
  try {
    const path = `${dir}/my model.gguf`;
    await Deno.writeFile(path, new Uint8Array([1, 2, 3]));
    const options = { modelsDir: dir, mirrorDir: emptyMirror, download: { fetch: noNetwork } };
    assertEquals(await resolveModelSource(path, options), { modelPath: path });

    const unknown = await assertRejects(() => resolveModelSource("llama-9000", options));
    assertEquals(
      unknown.message,
      'Unknown model "llama-9000"; known names: stories260K (default), stories260K-gguf; ' +
        `files by stem in the models directory (${dir}) and the mirror (${emptyMirror}): ` +
        "my model; a path to an existing .gguf or llama2.c .bin file, or an http(s) URL, also works",
    );
    const missing = await assertRejects(() => resolveModelSource(`${dir}/nope.gguf`, options));
    assertStringIncludes(
      missing.message,
      `Cannot find model file "${dir}/nope.gguf": no such file`,
    );
    assertStringIncludes(missing.message, "stories260K-gguf");

    const noGguf = await assertRejects(() => resolveModelSource("stories260K-gguf", options));
    assertEquals(
      noGguf.message,
      `Cannot find stories260K.gguf for model "stories260K-gguf": it is in neither the models ` +
        `directory (${dir}) nor the mirror (${emptyMirror}), and it has no public download URL; ` +
        "copy the file into the models directory or pass its path",
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(emptyMirror, { recursive: true });
  }
});

Deno.test("resolveModelsDir() prefers the setting, then MODELS_DIR, then the XDG or home cache", () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  const all = { MODELS_DIR: "/m", XDG_CACHE_HOME: "/xdg", HOME: "/home/u" };
  assertEquals(resolveModelsDir("/setting", env(all)), "/setting");
  assertEquals(resolveModelsDir(undefined, env(all)), "/m");
  assertEquals(resolveModelsDir("", env({ ...all, MODELS_DIR: "" })), "/xdg/llmserve/models");
  assertEquals(defaultModelsDir(env({ HOME: "/home/u/" })), "/home/u/.cache/llmserve/models");
  assertEquals(
    defaultModelsDir(env({ LOCALAPPDATA: "C:\\Users\\u\\AppData\\Local" })),
    "C:\\Users\\u\\AppData\\Local\\llmserve\\models",
  );
  assertMatch(
    (() => {
      try {
        return defaultModelsDir(env({}));
      } catch (error) {
        return (error as Error).message;
      }
    })(),
    /Cannot choose a models directory.*set MODELS_DIR/,
  );
});

Deno.test("fileNameForUrl() keeps the last path segment, sanitized", () => {
  const hub = "https://huggingface.co/karpathy/tinyllamas/resolve/main";
  assertEquals(
    fileNameForUrl(`${hub}/stories260K/stories260K.bin?download=true`),
    "stories260K.bin",
  );
  assertEquals(fileNameForUrl("https://h/x/My%20Model%3A%20v2.gguf"), "My_Model__v2.gguf");
  assertEquals(fileNameForUrl("https://h/x/%2E%2E%2Fetc%2Fpasswd"), "_etc_passwd");
  assertEquals(fileNameForUrl("https://h/a/b/"), "b");
  assertEquals(fileNameForUrl("https://h/"), "download");
  assertEquals(fileNameForUrl(`https://h/${"a".repeat(300)}.gguf`), `${"a".repeat(195)}.gguf`);
});

Deno.test("formatProgress() shows bytes, percent and rate; ProgressBar throttles redraws", () => {
  assertEquals(formatBytes(512), "512 B");
  assertEquals(formatBytes(1536), "1.5 KiB");
  assertEquals(formatBytes(3 * 1024 ** 3), "3.0 GiB");
  assertEquals(
    formatProgress({ label: "f", received: 768, total: 1024, transferred: 512, elapsedMs: 500 }),
    `f [${"#".repeat(18)}${"-".repeat(6)}]  75%  768 B / 1.0 KiB  1.0 KiB/s`,
  );
  assertEquals(
    formatProgress({ label: "f", received: 2048, transferred: 2048, elapsedMs: 2000 }),
    "f 2.0 KiB  1.0 KiB/s",
  );

  let clock = 0;
  const drawn: string[] = [];
  const bar = new ProgressBar("f", 1000, 0, {
    sink: (text) => drawn.push(text),
    intervalMs: 100,
    now: () => clock,
  });
  for (const [t, n] of [[0, 100], [50, 200], [150, 300], [199, 400], [260, 500]]) {
    clock = t!;
    bar.update(n!);
  }
  bar.finish(1000);
  bar.finish(1000);
  assertEquals(drawn.map((d) => /(\d+)%/.exec(d)?.[1]), ["10", "30", "50", "100"]);
  assert(drawn.at(-1)!.endsWith("\n") && drawn.slice(0, -1).every((d) => d.startsWith("\r")));
});

Deno.test("downloadFile() lets a concurrent download of the same file wait and reuse the result", async () => {
  const source = await mirrorBytes("stories260K.bin");
  await withServer({ "/f.bin": source }, {}, async (server, dir) => {
    const dest = `${dir}/f.bin`;
    const url = `${server.base}/f.bin`;
    const [a, b] = await Promise.all([
      downloadFile(url, dest, { progress: false }),
      downloadFile(url, dest, { progress: false }),
    ]);
    assertEquals(server.requests.length, 1, "the waiting call must not download again");
    assertEquals([a.path, b.path], [dest, dest]);
    assertEquals(await Deno.readFile(dest), source);
  });
});

Deno.test("resolveModelSource() says how to work offline when the network is unreachable", async () => {
  const modelsDir = await Deno.makeTempDir();
  const failingFetch = () => Promise.reject(new TypeError("fetch failed"));
  const err = await assertRejects(() =>
    resolveModelSource("stories260K", {
      modelsDir,
      mirrorDir: null,
      download: { fetch: failingFetch as typeof fetch, progress: false },
    })
  );
  assertStringIncludes((err as Error).message, "fetch failed");
  assertStringIncludes((err as Error).message, "MODEL_MIRROR");
  await Deno.remove(modelsDir, { recursive: true });
});

Deno.test("downloadFile() refuses a web page and a 404, leaving neither a file nor a .part", async () => {
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    (req) =>
      new URL(req.url).pathname === "/blob/model.gguf"
        ? new Response("<!doctype html><title>model.gguf</title>", {
          headers: { "content-type": "text/html; charset=utf-8" },
        })
        : new Response("no such file", { status: 404 }),
  );
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const base = `http://127.0.0.1:${(server.addr as Deno.NetAddr).port}`;
  try {
    const page = await assertRejects(
      () => downloadFile(`${base}/blob/model.gguf`, `${dir}/a.gguf`, { progress: false }),
      DownloadError,
    );
    assertStringIncludes(page.message, "web page");
    assertStringIncludes(page.message, "/resolve/main/");
    const missing = await assertRejects(
      () => downloadFile(`${base}/missing.gguf`, `${dir}/b.gguf`, { progress: false }),
      DownloadError,
    );
    assertStringIncludes(missing.message, "HTTP 404");
    const left = [];
    for await (const e of Deno.readDir(dir)) left.push(e.name);
    assertEquals(left, [], "nothing is cached or left half-written");
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("downloadFile() on a disk that refuses writes names the file, deletes the .part and says how big the file is", async () => {
  // A file-size limit (ulimit -f, with SIGXFSZ ignored) makes every write past 64 KiB fail as
  // a full disk does; it needs no root, unlike a small filesystem.
  const bytes = new Uint8Array(1 << 20).map((_, i) => i * 7);
  await withServer({ "/big.gguf": bytes }, {}, async (server, dir) => {
    const script = `${dir}/fetch.ts`;
    await Deno.writeTextFile(
      script,
      `import { downloadFile } from ${
        JSON.stringify(new URL("../lib/source/download.ts", import.meta.url).href)
      };
try { await downloadFile(Deno.args[0], Deno.args[1], { progress: false }); console.log("{}"); }
catch (e) { console.log(JSON.stringify({ name: e.name, message: e.message })); }`,
    );
    const dest = `${dir}/models/big.gguf`;
    const out = await new Deno.Command("bash", {
      args: [
        "-c",
        `ulimit -f 64; trap '' XFSZ; exec "$0" run -A --no-check "$@"`,
        Deno.execPath(),
        script,
        `${server.base}/big.gguf`,
        dest,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder().decode(out.stdout).trim();
    assertEquals(out.code, 0, new TextDecoder().decode(out.stderr));
    const err = JSON.parse(text.split("\n").pop()!);
    assertEquals(err.name, "DownloadError", text);
    assert(
      new RegExp(
        `^Cannot download ${server.base}/big\\.gguf to ${dest}: writing ${dest}\\.part failed after \\d+ bytes \\(.*File too large.*\\) \\(the file is 1048576 bytes\\); deleted ${dest}\\.part$`,
      ).test(err.message),
      err.message,
    );
    assert(!(await exists(`${dest}.part`)), "the .part is gone");
    assert(!(await exists(dest)), "no final file");
  });
});

Deno.test("HF_TOKEN goes to Hugging Face's hosts only, and a refusal says how to get access", () => {
  const url = "https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/resolve/main/model.gguf";
  assertEquals(hfAccess(url, "hf_abc").authorization, "Bearer hf_abc");
  assertEquals(hfAccess("https://cdn-lfs.hf.co/x.gguf", "hf_abc").authorization, "Bearer hf_abc");
  for (
    const elsewhere of [
      "https://example.com/model.gguf",
      "https://huggingface.co.evil.example/m.gguf",
    ]
  ) {
    assertEquals(hfAccess(elsewhere, "hf_abc"), {}, elsewhere);
  }
  const without = hfAccess(url, undefined);
  assertEquals(without.authorization, undefined);
  assertStringIncludes(without.refusedHint ?? "", "set HF_TOKEN");
  assertStringIncludes(hfAccess(url, "hf_abc").refusedHint ?? "", "HF_TOKEN was sent and refused");
});

Deno.test("downloadFile() sends the authorization it is given; a 401 carries the hint", async () => {
  const body = new Uint8Array([1, 2, 3, 4, 5]);
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    (req) =>
      req.headers.get("authorization") === "Bearer right"
        ? new Response(body)
        : new Response("Access to model is restricted", { status: 401 }),
  );
  const dir = await Deno.makeTempDir({ prefix: "model_source_test_" });
  const url = `http://127.0.0.1:${(server.addr as Deno.NetAddr).port}/gated.gguf`;
  try {
    const refused = await assertRejects(
      () => downloadFile(url, `${dir}/a.gguf`, { progress: false, refusedHint: "set HF_TOKEN" }),
      DownloadError,
    );
    assertStringIncludes(refused.message, "HTTP 401");
    assertStringIncludes(refused.message, "; set HF_TOKEN");
    await downloadFile(url, `${dir}/a.gguf`, { progress: false, authorization: "Bearer right" });
    assertEquals(await Deno.readFile(`${dir}/a.gguf`), body);
  } finally {
    await server.shutdown();
    await Deno.remove(dir, { recursive: true });
  }
});
