/**
 * The one flag parser: every command's flags, variables and errors come from the settings
 * table, so a flag means the same and fails the same way in each command that takes it.
 */
import { assertEquals, assertThrows } from "@std/assert";
import { parseSettings } from "../lib/cli/flag_parser.ts";
import { parseRouterArgs } from "../lib/cli/router.ts";
import { parseGenerateArgs } from "../lib/cli/generate.ts";

const noEnv = () => undefined;
const envOf = (vars: Record<string, string>) => (name: string) => vars[name];

Deno.test("a flag fails the same way in every command that takes it", () => {
  for (const command of ["serve", "router"] as const) {
    assertThrows(
      () => parseSettings(command, ["--drain-timeout", "-1"], noEnv),
      Error,
      'Invalid configuration:\n  --drain-timeout: must be 0 or more seconds (received "-1")',
    );
  }
  for (const command of ["serve", "router", "cluster"] as const) {
    assertThrows(
      () => parseSettings(command, ["--port", "70000"], noEnv),
      Error,
      '--port: must be 0 to 65535 (received "70000")',
    );
  }
  for (const command of ["serve", "generate"] as const) {
    assertThrows(
      () => parseSettings(command, ["--threads", "0"], noEnv),
      Error,
      '--threads: must be positive (received "0")',
    );
  }
});

Deno.test("a number flag given without a value is refused, not read as 0", () => {
  // z.coerce reads "" as 0: --port alone would have listened on a random port.
  assertThrows(
    () => parseSettings("serve", ["--port"], noEnv),
    Error,
    '--port: must be a number (received "")',
  );
  const temp = parseGenerateArgs(["--prompt", "x", "--temperature"]);
  assertEquals(
    "error" in temp ? temp.error : "",
    'Invalid configuration:\n  --temperature: must be a number (received "")',
  );
  assertThrows(
    () => parseSettings("serve", ["--drain-timeout", " "], noEnv),
    Error,
    '--drain-timeout: must be a number (received " ")',
  );
  // 0 typed is 0.
  assertEquals(parseSettings("serve", ["--port", "0"], noEnv).port, 0);
});

Deno.test("each command suggests its own nearest flag for a typo and refuses the others' flags", () => {
  assertThrows(
    () => parseSettings("router", ["--nat", "nats://x:4222"], noEnv),
    Error,
    "Unknown argument(s): --nat (did you mean --nats?); `deno task router --help` lists every flag",
  );
  assertThrows(
    () => parseSettings("cluster", ["--replica", "3"], noEnv),
    Error,
    "Unknown argument(s): --replica (did you mean --replicas?); `deno task cluster --help`",
  );
  // The router routes: the engine's flags are not its own.
  assertThrows(
    () => parseSettings("router", ["--backend", "cpu"], noEnv),
    Error,
    "Unknown argument(s): --backend;",
  );
  assertThrows(
    () => parseSettings("generate", ["--port", "8000"], noEnv),
    Error,
    "Unknown argument(s): --port;",
  );
  // A peer's flag is answered with what to use instead where it could mean something.
  assertThrows(
    () => parseSettings("generate", ["-ngl", "99"], noEnv),
    Error,
    "-ngl is not a flag here: the backend is chosen with --backend (auto, cpu, webgpu, reference)",
  );
});

Deno.test("serve and the router read the variables of their own flags; generate and cluster read none", () => {
  const env = envOf({
    LLMSERVE_MODEL: "from-env.gguf",
    LLMSERVE_PORT: "9100",
    LLMSERVE_ROUTING: "round-robin",
    LLMSERVE_BACKEND: "nonsense",
  });
  assertEquals(parseSettings("serve", ["--backend", "cpu"], env).model, "from-env.gguf");
  const router = parseRouterArgs(["--nats", "nats://127.0.0.1:4222"], env);
  assertEquals([router.port, router.routing], [9100, "round-robin"]);
  // A flag wins over its variable.
  assertEquals(parseRouterArgs(["--nats", "n://x", "--routing", "prefix"], env).routing, "prefix");
  // The router takes no --backend, so LLMSERVE_BACKEND is not its business.
  assertEquals(router.backend, "auto");
  const generate = parseGenerateArgs([]);
  assertEquals("error" in generate ? generate.error : generate.model, "stories260K");
  assertEquals(parseSettings("generate", [], env).model, "stories260K");
  assertEquals(parseSettings("cluster", [], env).port, 8000);
});

Deno.test("the cluster's own flags are validated from the table", () => {
  assertEquals(parseSettings("cluster", [], noEnv).replicas, 2);
  const c = parseSettings("cluster", ["--replicas", "3", "--nats-port", "4333"], noEnv);
  assertEquals([c.replicas, c.natsPort], [3, 4333]);
  assertThrows(
    () => parseSettings("cluster", ["--replicas", "0"], noEnv),
    Error,
    '--replicas: must be positive (received "0")',
  );
});

Deno.test("--model repeated serves every model in serve; generate, which runs one, takes the last", () => {
  const serve = parseSettings("serve", ["--model", "a.gguf", "--model", "b.gguf"], noEnv);
  assertEquals([serve.model, serve.models], ["a.gguf", ["a.gguf", "b.gguf"]]);
  assertEquals(parseSettings("serve", ["-m", "a.gguf"], noEnv).models, []);
  const generate = parseSettings("generate", ["-m", "a.gguf", "--model", "b.gguf"], noEnv);
  assertEquals([generate.model, generate.models], ["b.gguf", []]);
});
