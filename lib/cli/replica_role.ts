import type { NatsResultStore } from "../cluster/nats_result_store.ts";
import { connectNats, type NatsConnection, type NatsOptions } from "../cluster/nats_connection.ts";
import { ReplicaAgent, type ReplicaModels, type ReplicaSource } from "../cluster/replica.ts";
import { randomId } from "../cluster/subjects.ts";
import type { RequestLog } from "../http/request_log.ts";
import type { Config } from "./config.ts";
import { drainOnStop } from "./replica_stop.ts";
import { natsServedLog } from "./serve_lines.ts";

/** A replica's connection to the cluster (`--nats`), named by its fresh id. */
export interface ReplicaLink {
  readonly id: string;
  readonly nc: NatsConnection;
  readonly natsOptions: NatsOptions;
}

/** Connects a new replica to `--nats`; the result cache's shared level, if any, rides on it. */
export async function connectReplica(
  config: Config,
  log: (line: string) => void,
  resultStore: NatsResultStore | undefined,
): Promise<ReplicaLink> {
  const id = randomId("replica");
  const natsOptions = { url: config.nats!, credsFile: config.natsCreds, name: id };
  const nc = await connectNats({ ...natsOptions, log });
  resultStore?.attach(nc);
  return { id, nc, natsOptions };
}

/**
 * Serves `source` to the cluster's routers on the link: a stream served over NATS gets the log
 * line an HTTP request gets, and a stop request starts the drain (drainOnStop).
 */
export async function startReplicaAgent(
  config: Config,
  link: ReplicaLink,
  source: ReplicaSource | ReplicaModels,
  log: (line: string) => void,
  requestLog: RequestLog,
) {
  const { id, nc, natsOptions } = link;
  const agent = new ReplicaAgent(nc, source, { id, log, served: natsServedLog(requestLog) });
  await agent.start(natsOptions);
  return {
    agent,
    drain: drainOnStop(agent, config.drainTimeout),
    where: nc.getServer(),
    close: () => nc.close(),
  };
}
