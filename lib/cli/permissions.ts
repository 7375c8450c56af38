/**
 * The Deno permissions one run needs, worked out from its configuration: the launcher
 * (`launch.ts`) runs the command with exactly these, so the sandbox stays narrow whatever the
 * settings name (a models directory elsewhere, a model file by path, another listen address,
 * a download host).
 */
import { HUGGING_FACE_HOSTS } from "../source/hf_token.ts";
import {
  type EnvGetter,
  isHttpUrl,
  isPathSpec,
  KNOWN_MODELS,
  mirrorDirFromEnv,
  resolveModelsDir,
} from "../source/model_source.ts";
import { GPU_API_ENV, VULKAN_DRIVER_DIRS } from "../util/gpu_api.ts";
import { resolveDataDir } from "../batch/data_dir.ts";
import { XGRAMMAR_BUNDLE } from "../grammar/xgrammar.ts";
import { RASTERIZER_THREADS_ENV } from "../../kernels/webgpu/adapter.ts";

/**
 * What a run that may use WebGPU reads to tell Vulkan from OpenGL ES for its start-up line
 * (lib/util/gpu_api.ts): the Vulkan loader's manifest folders, or the files its variables name.
 */
export function gpuApiReads(env: EnvGetter): string[] {
  const named = ["VK_ICD_FILENAMES", "VK_DRIVER_FILES"].flatMap((n) =>
    (env(n) ?? "").split(":").filter(Boolean)
  );
  return [...VULKAN_DRIVER_DIRS, ...named];
}

/** Allow-lists for `deno run`; an empty list grants nothing of that kind. */
export interface Permissions {
  readonly read: readonly string[];
  readonly write: readonly string[];
  readonly net: readonly string[];
  readonly env: readonly string[];
  /** `Deno.systemMemoryInfo` and the like, by name. */
  readonly sys?: readonly string[];
  /** Programs it may start: the Deno binary itself, for `auto`'s adapter probe. */
  readonly run?: readonly string[];
}

/** The settings that decide what a run touches. */
export interface RunNeeds {
  /** `--model`: a path, an http(s) URL, a known name or a file stem in the models dir/mirror. */
  readonly model: string;
  /** `--model` given several times: every one of them is served. */
  readonly models?: readonly string[];
  readonly tokenizer?: string;
  readonly modelsDir?: string;
  /** The listen address (`serve` only). */
  readonly host?: string;
  /** `--nats`: NATS server URL(s), comma-separated, to serve as a replica on. */
  readonly nats?: string;
  /** `--nats-creds`: a credentials file to read. */
  readonly natsCreds?: string;
  /** `--chat-template`: a template file to read. */
  readonly chatTemplate?: string;
  /** Other files the run reads (`--models-config`). */
  readonly readFiles?: readonly string[];
  /** A server's batch queue: `--data-dir` (absent: the default), read and written. */
  readonly batchQueue?: { readonly dataDir?: string | undefined };
  /** Whether the run may download a missing model (`models` only lists, so it never does). */
  readonly mayDownload?: boolean;
  /** Whether the run builds an engine (`models` does not): the CPU engine reads its kernels. */
  readonly runsEngine?: boolean;
}

/** Every environment variable the commands read (the models dir, the mirror, `LLMSERVE_*`). */
export const ENV_READ = [
  "LLMSERVE_*",
  "MODELS_DIR",
  "MODEL_MIRROR",
  // A Hugging Face access token for gated repositories (lib/source/hf_token.ts).
  "HF_TOKEN",
  "XDG_CACHE_HOME",
  "XDG_DATA_HOME",
  "HOME",
  "LOCALAPPDATA",
  // Read by the `ws` package behind node:http's WebSocket upgrades.
  "WS_NO_BUFFER_UTIL",
  "WS_NO_UTF_8_VALIDATE",
  // Which graphics API WebGPU runs on, for the start-up line (lib/util/gpu_api.ts).
  ...GPU_API_ENV,
  // Set for a tiny model before the first adapter: Mesa's rasterizer threads (kernels/webgpu/adapter.ts).
  RASTERIZER_THREADS_ENV,
] as const;

/** The grammar thread's module (lib/grammar/grammar_worker.ts), loaded at run time. */
export const GRAMMAR_WORKER_DIR = new URL("../grammar/", import.meta.url).pathname;

/** What the CPU engine reads at run time: its compiled kernels and its worker's module. */
export const CPU_KERNELS_DIR = new URL("../../kernels/wasm/", import.meta.url).pathname;

/** `--kv-memory auto` sizes the cache from the machine's memory. */
export const SYS_READ = ["systemMemoryInfo"] as const;

/**
 * The permissions a run with these settings needs:
 * - read: the models directory, the mirror (`MODEL_MIRROR`), and a model or tokenizer given
 *   as a path;
 * - write: the models directory, only when a spec may be downloaded (a URL or a name);
 * - net: the listen address, the hosts of any URL that may be downloaded (a known name's
 *   download host; Hugging Face's content hosts with it), and the NATS servers (`--nats`);
 * - env: {@linkcode ENV_READ}; sys: {@linkcode SYS_READ}.
 */
export function derivePermissions(needs: RunNeeds, env: EnvGetter): Permissions {
  const read = new Set<string>();
  const write = new Set<string>();
  const net = new Set<string>();
  const modelsDir = resolveModelsDir(needs.modelsDir, env);
  read.add(modelsDir);
  const mirror = mirrorDirFromEnv(env);
  if (mirror !== undefined) read.add(mirror);
  const mayDownload = needs.mayDownload ?? true;
  for (const spec of [needs.model, ...(needs.models ?? []), needs.tokenizer]) {
    if (spec === undefined) continue;
    if (isHttpUrl(spec)) {
      if (!mayDownload) continue;
      write.add(modelsDir);
      for (const h of downloadHosts(spec)) net.add(h);
    } else if (isPathSpec(spec)) {
      read.add(spec);
    } else if (mayDownload) {
      // A name: a known model may be fetched from its URL when it is in neither place.
      const known = Object.entries(KNOWN_MODELS).find(([n]) =>
        n.toLowerCase() === spec.toLowerCase()
      )?.[1];
      for (const file of [known?.model, known?.tokenizer]) {
        if (file?.url === undefined) continue;
        write.add(modelsDir);
        for (const h of downloadHosts(file.url)) net.add(h);
      }
    }
  }
  if (needs.host !== undefined) net.add(netHost(needs.host));
  for (const url of (needs.nats ?? "").split(",").map((u) => u.trim()).filter(Boolean)) {
    net.add(natsHost(url));
  }
  if (needs.batchQueue !== undefined) {
    const data = resolveDataDir(needs.batchQueue.dataDir, env);
    read.add(data);
    write.add(data);
  }
  if (needs.natsCreds !== undefined) read.add(needs.natsCreds);
  if (needs.chatTemplate !== undefined) read.add(needs.chatTemplate);
  for (const f of needs.readFiles ?? []) read.add(f);
  // A replica's heartbeat worker is a module loaded at run time, which needs read access.
  if (needs.nats !== undefined) read.add(new URL("../cluster/", import.meta.url).pathname);
  // The CPU engine reads its compiled kernels and starts its worker threads from here.
  if (needs.runsEngine ?? true) {
    read.add(CPU_KERNELS_DIR);
    // Constrained decoding reads XGrammar's bundle from Deno's npm cache on first use.
    read.add(XGRAMMAR_BUNDLE);
    // XGrammar runs on a thread of its own, whose module is read when it starts.
    read.add(GRAMMAR_WORKER_DIR);
  }
  return {
    read: [...read],
    write: [...write],
    net: [...net],
    env: [...ENV_READ],
    sys: [...SYS_READ],
  };
}

function downloadHosts(url: string): string[] {
  let host: string;
  try {
    host = new URL(url.trim()).host;
  } catch {
    return []; // resolution reports the invalid URL itself
  }
  const hf = HUGGING_FACE_HOSTS.some((h) => h === host);
  return hf ? [...HUGGING_FACE_HOSTS] : [host];
}

/** The host (any port) of a NATS URL such as `nats://user:pass@host:4222` or `host:4222`. */
function natsHost(url: string): string {
  try {
    return new URL(url.includes("://") ? url : `nats://${url}`).hostname;
  } catch {
    return url; // the replica reports the malformed URL itself
  }
}

/** A listen address as Deno's `--allow-net` spells it (IPv6 in brackets). */
function netHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}

/** The `deno run` flags that grant exactly `p`. */
export function permissionFlags(p: Permissions): string[] {
  const flag = (name: string, list: readonly string[]) =>
    list.length === 0 ? [] : [`--allow-${name}=${list.join(",")}`];
  return [
    ...flag("read", p.read),
    ...flag("write", p.write),
    ...flag("net", p.net),
    ...flag("env", p.env),
    ...flag("sys", p.sys ?? []),
    ...flag("run", p.run ?? []),
  ];
}
