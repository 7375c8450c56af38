// The launcher (`launch serve`) stays the server's parent while it runs, and keeps every module
// it loaded: so it loads only what it needs (launch.ts, the flags' parsing), and each command
// loads its own graph when it runs.
import { ALL_PERMISSIONS, launch } from "./lib/cli/launch.ts";
import { parseServeArgs, serveNeeds } from "./lib/cli/serve_args.ts";
import { COMMAND_NAMES, COMMANDS } from "./lib/cli/commands.ts";
import { infoText } from "./lib/cli/help.ts";

const TASK_WIDTH = Math.max(...COMMAND_NAMES.map((c) => COMMANDS[c].task.length));
const USAGE = [
  ...COMMAND_NAMES.map((c, i) =>
    `${i === 0 ? "Usage: " : "       "}${COMMANDS[c].task.padEnd(TASK_WIDTH)}  ${
      COMMANDS[c].summary
    }`
  ),
  "Each command's --help lists its flags.",
].join("\n");

async function main(args: string[]): Promise<number> {
  const [command, ...rest] = args;
  switch (command) {
    case "serve":
      return await (await import("./lib/cli/serve.ts")).serveCommand(rest);
    case "cluster":
      return await (await import("./lib/cli/cluster.ts")).clusterCommand(rest);
    case "router":
      return await (await import("./lib/cli/router.ts")).routerCommand(rest);
    case "generate":
      return await (await import("./lib/cli/generate.ts")).generateCommand(rest);
    case "models":
      return await (await import("./lib/cli/models.ts")).modelsCommand(rest);
    case "plan":
      return await (await import("./lib/cli/plan.ts")).planCommand(rest);
    case "stage":
      return await (await import("./lib/cli/stage.ts")).stageCommand(rest);
    case "launch":
      return await launchCommand(rest);
    default:
      console.error(`Unknown command ${JSON.stringify(command)}.\n${USAGE}`);
      return 2;
  }
}

/**
 * `launch <command> ...`, what the deno tasks run: validates the settings here, then runs the
 * command with the permissions they need (lib/cli/launch.ts).
 */
async function launchCommand(args: string[]): Promise<number> {
  const [command, ...rest] = args;
  switch (command) {
    case "serve": {
      if (infoText("serve", rest) !== undefined) return await launch("serve", rest, undefined);
      const config = parseServeArgs(rest);
      // A pipeline's head starts nats-server and its stage processes: it runs with all.
      if (config.pipelineParallelSize > 1) return await launch("serve", rest, ALL_PERMISSIONS);
      return await launch("serve", rest, serveNeeds(config));
    }
    case "router": {
      const { parseRouterArgs, routerNeeds } = await import("./lib/cli/router.ts");
      if (infoText("router", rest) !== undefined) return await launch("router", rest, undefined);
      return await launch("router", rest, routerNeeds(parseRouterArgs(rest)));
    }
    case "cluster":
      return await launch("cluster", rest, ALL_PERMISSIONS);
    // It reads the files it is given, and --calibrate runs the engine and nats-server.
    case "plan":
      return await launch("plan", rest, ALL_PERMISSIONS);
    case "stage":
      return await launch("stage", rest, ALL_PERMISSIONS);
    case "generate": {
      const { parseGenerateArgs } = await import("./lib/cli/generate.ts");
      if (infoText("generate", rest) !== undefined) {
        return await launch("generate", rest, undefined);
      }
      const a = parseGenerateArgs(rest);
      if ("error" in a) {
        console.error(a.error);
        return 2;
      }
      return await launch("generate", rest, {
        model: a.model,
        tokenizer: a.tokenizer,
        modelsDir: a.modelsDir,
      });
    }
    case "models": {
      const { parseModelsArgs } = await import("./lib/cli/models.ts");
      const m = parseModelsArgs(rest);
      if (typeof m === "string") {
        console.error(m);
        return 2;
      }
      return await launch("models", rest, {
        model: "",
        modelsDir: m.modelsDir,
        mayDownload: false,
        runsEngine: false,
      });
    }
    default:
      console.error(`Unknown command ${JSON.stringify(command)}.\n${USAGE}`);
      return 2;
  }
}

if (import.meta.main) {
  try {
    Deno.exit(await main(Deno.args));
  } catch (e) {
    console.error(`error: ${e instanceof Error ? e.message : String(e)}`);
    Deno.exit(1);
  }
}
