/**
 * The commands `main.ts` runs, with what their `--help` says besides their flags (which come
 * from the settings table, settings.ts). A new command (a pipeline stage, a planner) is one
 * entry here and its flags are rows of the table.
 */

export interface CommandInfo {
  /** How a user starts it. */
  readonly task: string;
  /** Its line in `main.ts`'s usage. */
  readonly summary: string;
  /** What follows the task on the usage line. */
  readonly usage: string;
  /** It reads each setting's environment variable too (flags win over them). */
  readonly environment: boolean;
  /** Prose after the usage line: what it does. */
  readonly about?: string;
  /** Example invocations with what each does, printed last. */
  readonly examples: readonly (readonly [string, string])[];
}

export const COMMANDS = {
  serve: {
    task: "deno task start",
    summary: "run the server (see --help)",
    usage: "[options]",
    environment: true,
    about: "Serves one model, or several (--model repeated, --all-models, --models-config), " +
      "over HTTP and WebSocket; with --nats it is also a replica for routers.",
    examples: [
      ["deno task start", "stories260K on http://127.0.0.1:8000/"],
      ["deno task start --model stories260K-q8_0", "a file in the models dir or mirror, by stem"],
      ["deno task start --model /data/models/llama.gguf --host 0.0.0.0 --port 8080", ""],
      ["deno task start --model https://huggingface.co/<org>/<repo>/resolve/main/<file>.gguf", ""],
      [
        "LLMSERVE_API_KEYS=key-one-123,key-two-456 deno task start --backend cpu --kv-memory 1GiB",
        "",
      ],
      ["deno task start -m stories260K-q8_0 -c 256 --port 8080", "llama-server's short flags"],
      ["deno task models", "list the models it can find"],
    ],
  },
  generate: {
    task: "deno task generate",
    summary: "one completion on stdout",
    usage: "[options] --prompt <text>",
    environment: false,
    about: "Prints only the generated continuation on stdout; diagnostics go to stderr.",
    examples: [
      ['deno task generate --prompt "Once upon a time" --max-tokens 64 --temperature 0', ""],
      ['deno task generate --model stories260K-q8_0 --prompt "Tom and his dog" --seed 7', ""],
      ['deno task generate --model ./my-model.gguf --backend cpu --prompt "Hello"', ""],
      ['deno task generate -m stories260K-q8_0 -p "Once upon a time" -n 64 --temp 0', ""],
    ],
  },
  models: {
    task: "deno task models",
    summary: "the model files it can find",
    usage: "[--models-dir <dir>]",
    environment: false,
    about: "Lists the .gguf and .bin files of the models directory and the mirror " +
      "(MODEL_MIRROR) with their size, format, architecture and quantization; --model takes " +
      "the name in the first column.",
    examples: [["deno task models", ""]],
  },
  router: {
    task: "deno task router",
    summary: "route the same API to replicas over NATS",
    usage: "--nats nats://host:port [options]",
    environment: true,
    about: "The public API of a single server, with every generation sent to a replica over " +
      "NATS (replicas are `deno task start --nats ...`).",
    examples: [
      ["deno task router --nats nats://127.0.0.1:4222 --port 8000", ""],
      [
        "deno task router --nats nats://127.0.0.1:4222 --by-model",
        "replicas serve different models",
      ],
    ],
  },
  cluster: {
    task: "deno task cluster",
    summary: "nats-server, replicas and a router, locally",
    usage: "[--replicas N] [--port P] [--nats-port Q] [-- serve flags...]",
    environment: false,
    about: "Starts, for a local try: nats-server with a generated password on 127.0.0.1:Q, N " +
      "replicas (each also on its own free HTTP port) and a router on P. Flags after -- go to " +
      "every replica (e.g. -- --backend cpu); each replica keeps its files and batches in " +
      "replica-<n>/ of the data folder (--data-dir), the router the Batch API's in router/. " +
      "Ctrl-C or SIGTERM stops the router, drains every replica, then stops nats-server. " +
      "nats-server is $NATS_SERVER, else found on PATH or in /usr/local/sbin, /usr/sbin, /sbin.",
    examples: [["deno task cluster --replicas 3 -- --backend cpu", ""]],
  },
  plan: {
    task: "deno task plan",
    summary: "the TP × PP × DP layouts of a model over some hosts, predicted",
    usage: "--model <file.gguf or shape> --hosts <hosts or file.json> [options]",
    environment: false,
    about: "Prints the tensor × pipeline × data parallel layouts that fit in the hosts' " +
      "memory, with predicted decode tokens/s at 1 and --sequences sequences and time to " +
      "first token, best first, and why each wins or loses (docs/cluster.md#planner). " +
      "Reads only a GGUF's header. Its cost model is calibrated on this machine; " +
      "--calibrate measures it again.",
    examples: [
      [
        "deno task plan --model llama31_70b --hosts 4x16GiB@1thr --bandwidth 1Gbit/s",
        "a 40 GB model on four 16 GB hosts",
      ],
      ["deno task plan --model ./model.gguf --hosts hosts.json", "hosts and link from a file"],
      [
        "deno task plan --calibrate --model /tmp/perf/llama32-1b-gemm-q4_k_m.gguf --calibration my-calibration.json --hosts 2x8GiB@1thr --bandwidth loopback --latency 0",
        "",
      ],
    ],
  },
  stage: {
    task: "deno task stage",
    summary: "one pipeline stage: a layer range of a model, for a head over NATS",
    usage: "--nats nats://host:port --model <file.gguf> --layers <start>-<end> [options]",
    environment: true,
    about: "Loads only layers start..end-1 of the GGUF (with the embedding on the first stage, " +
      "the output norm and classifier on the last), announces itself on NATS and serves the " +
      "head that attaches (`deno task start --pipeline-parallel-size N --nats ...`) over a " +
      "direct TCP link (docs/cluster.md, Pipeline parallelism).",
    examples: [[
      "deno task stage --nats nats://user:pass@10.0.0.1:4222 --model llama.gguf --layers 16-32 --stage-host 10.0.0.2",
      "",
    ]],
  },
} as const satisfies Record<string, CommandInfo>;

export type CommandName = keyof typeof COMMANDS;

export const COMMAND_NAMES = Object.keys(COMMANDS) as CommandName[];
