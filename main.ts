import { generateCommand } from "./lib/cli/generate.ts";
import { serveCommand } from "./lib/cli/serve.ts";
import { routerCommand } from "./lib/cli/router.ts";
import { clusterCommand } from "./lib/cli/cluster.ts";

const USAGE = `Usage: deno task start [options]      run the server (see --help)
       deno task generate [options]   one completion on stdout
       deno task router --nats URL    route the same API to replicas over NATS
       deno task cluster              nats-server, replicas and a router, locally`;

async function main(args: string[]): Promise<number> {
  const [command, ...rest] = args;
  switch (command) {
    case "serve":
      return await serveCommand(rest);
    case "cluster":
      return await clusterCommand(rest);
    case "router":
      return await routerCommand(rest);
    case "generate":
      return await generateCommand(rest);
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
