import { assertEquals } from "@std/assert";
import {
  CPU_KERNELS_DIR,
  derivePermissions,
  GRAMMAR_WORKER_DIR,
  permissionFlags,
} from "../lib/cli/permissions.ts";
import { HUGGING_FACE_HOSTS } from "../lib/source/hf_token.ts";
import { XGRAMMAR_BUNDLE } from "../lib/grammar/xgrammar.ts";

/** An environment with only these variables. */
const envOf = (vars: Record<string, string>) => (name: string) => vars[name];

Deno.test("derivePermissions() reads and writes the default models directory and fetches the default model from Hugging Face only", () => {
  const p = derivePermissions(
    { model: "stories260K", host: "127.0.0.1" },
    envOf({ HOME: "/home/u", MODEL_MIRROR: "/m" }),
  );
  assertEquals(p.read, [
    "/home/u/.cache/llmserve/models",
    "/m",
    CPU_KERNELS_DIR,
    XGRAMMAR_BUNDLE,
    GRAMMAR_WORKER_DIR,
  ]);
  assertEquals(p.write, ["/home/u/.cache/llmserve/models"]);
  assertEquals(p.net, [...HUGGING_FACE_HOSTS, "127.0.0.1"]);
  assertEquals(p.env.includes("LLMSERVE_*"), true);
});

Deno.test("derivePermissions() follows XDG_CACHE_HOME, MODELS_DIR and --models-dir, in that order of precedence", () => {
  const xdg = derivePermissions(
    { model: "stories260K" },
    envOf({ HOME: "/h", XDG_CACHE_HOME: "/x" }),
  );
  assertEquals(xdg.read, [
    "/x/llmserve/models",
    CPU_KERNELS_DIR,
    XGRAMMAR_BUNDLE,
    GRAMMAR_WORKER_DIR,
  ]);
  const env = derivePermissions(
    { model: "stories260K" },
    envOf({ HOME: "/h", XDG_CACHE_HOME: "/x", MODELS_DIR: "/d" }),
  );
  assertEquals(env.read, ["/d", CPU_KERNELS_DIR, XGRAMMAR_BUNDLE, GRAMMAR_WORKER_DIR]);
  assertEquals(env.write, ["/d"]);
  const flag = derivePermissions(
    { model: "stories260K", modelsDir: "/f" },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(flag.read, ["/f", CPU_KERNELS_DIR, XGRAMMAR_BUNDLE, GRAMMAR_WORKER_DIR]);
  assertEquals(flag.write, ["/f"]);
});

Deno.test("derivePermissions() grants a model given by path only that file, without writes or downloads", () => {
  const p = derivePermissions(
    { model: "/any/path.gguf", host: "10.0.0.5" },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(p.read, [
    "/d",
    "/any/path.gguf",
    CPU_KERNELS_DIR,
    XGRAMMAR_BUNDLE,
    GRAMMAR_WORKER_DIR,
  ]);
  assertEquals(p.write, []);
  assertEquals(p.net, ["10.0.0.5"]);
  const v6 = derivePermissions(
    { model: "./m.bin", tokenizer: "./t.bin", host: "::1" },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(v6.read, [
    "/d",
    "./m.bin",
    "./t.bin",
    CPU_KERNELS_DIR,
    XGRAMMAR_BUNDLE,
    GRAMMAR_WORKER_DIR,
  ]);
  assertEquals(v6.net, ["[::1]"]);
});

Deno.test("derivePermissions() lets a URL be fetched from its own host into the models directory", () => {
  const p = derivePermissions(
    { model: "https://models.example.org:8443/a/b.gguf" },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(p.write, ["/d"]);
  assertEquals(p.net, ["models.example.org:8443"]);
  // A Hugging Face URL redirects to its content hosts.
  const hf = derivePermissions(
    { model: "https://huggingface.co/o/r/resolve/main/x.gguf" },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(hf.net, [...HUGGING_FACE_HOSTS]);
});

Deno.test("derivePermissions() for listing models reads both places and nothing else", () => {
  const p = derivePermissions(
    { model: "", mayDownload: false, runsEngine: false },
    envOf({ MODELS_DIR: "/d", MODEL_MIRROR: "/m" }),
  );
  assertEquals([p.read, p.write, p.net], [["/d", "/m"], [], []]);
});

Deno.test("permissionFlags() writes one allow-list per kind and omits empty ones", () => {
  assertEquals(
    permissionFlags({ read: ["/a", "/b"], write: [], net: ["h"], env: ["X"] }),
    ["--allow-read=/a,/b", "--allow-net=h", "--allow-env=X"],
  );
});

Deno.test("derivePermissions() lets a replica reach its NATS servers and read its credentials", () => {
  const p = derivePermissions(
    {
      model: "/m.gguf",
      host: "127.0.0.1",
      nats: "nats://u:p@10.1.2.3:4222, nats.internal:4223",
      natsCreds: "/etc/llm.creds",
    },
    envOf({ MODELS_DIR: "/d" }),
  );
  assertEquals(p.net, ["127.0.0.1", "10.1.2.3", "nats.internal"]);
  // lib/cluster/: the replica's heartbeat worker is a module loaded at run time.
  const cluster = new URL("../lib/cluster/", import.meta.url).pathname;
  assertEquals(p.read, [
    "/d",
    "/m.gguf",
    "/etc/llm.creds",
    cluster,
    CPU_KERNELS_DIR,
    XGRAMMAR_BUNDLE,
    GRAMMAR_WORKER_DIR,
  ]);
});
