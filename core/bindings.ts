// The Worker's bindings, typed once: what wrangler.toml and `wrangler secret put` give the
// deployment. Every entry is optional: Node scripts and tests pass only what they use, and the
// code that needs one says so when it is missing (INVALID_CONFIG, UNAVAILABLE).

/** What the Durable Objects answer over RPC: the NodeDO delivers its open commands, the WorkflowDO advances, the SinkDO delivers the outbox. */
export interface WakeableObject extends Rpc.DurableObjectBranded {
  wake(): Promise<void>;
}

export type Bindings = {
  /** Neon's pooled connection string (the default database port, over WebSocket) when no HYPERDRIVE is bound. */
  DATABASE_URL?: string;
  /** A Hyperdrive config in front of Neon (the recommended production setup): the store connects to it over TCP. */
  HYPERDRIVE?: Hyperdrive;
  /** 32+ characters: seals stored secrets (AES-GCM under an HKDF-derived key) and signs node credentials. */
  BC_SECRET?: string;
  /** Locally only: host:port of the WebSocket-to-TCP bridge to Postgres. */
  BC_DB_WS_PROXY?: string;
  /** One NodeDO per agent (idFromName(nodeId)). */
  NODE?: DurableObjectNamespace<WakeableObject>;
  /** One WorkflowDO per workflow (idFromName(workflowId)). */
  WORKFLOW?: DurableObjectNamespace<WakeableObject>;
  /** The one SinkDO (idFromName("sinks")): delivers the outbox to the event and audit sinks. */
  SINKS?: DurableObjectNamespace<WakeableObject>;
  /** An R2 bucket: the BlobStore (ctx.blobs) of rendered ISOs and config drives. */
  BLOBS?: R2Bucket;
};
