// A FakeDaemon on the workers tests' in-process control plane: the well-behaved agent most tests
// need, joined with a fresh node token as an operator would hand one out.
import { FakeDaemon, type FakeDaemonOptions } from "../../testing/index.ts";
import type { Compute } from "../../core/compute.ts";
import type { TestClient } from "../../testing/test-client.ts";
import { fetcher } from "./raw-agent.ts";

export interface JoinedDaemonOptions extends Omit<FakeDaemonOptions, "baseUrl" | "fetch" | "role"> {
  /** Labels on the join token (the daemon's own `labels` go in its join request). */
  tokenLabels?: Record<string, string>;
  /** Connect after joining; default false. */
  connect?: boolean;
}

/**
 * A node FakeDaemon reaching `compute` in-process: joined with a new token unless its `state`
 * already holds an identity (a restart), then connected when asked. The caller stops it.
 */
export async function joinedDaemon(
  client: TestClient,
  compute: Compute,
  env: object,
  { tokenLabels, connect = false, ...options }: JoinedDaemonOptions = {},
): Promise<FakeDaemon> {
  const daemon = new FakeDaemon({ baseUrl: "http://bc.test", fetch: fetcher(compute, env), role: "node", ...options });
  if (!(await daemon.state.loadIdentity())) {
    const token = (await client.call("joinTokens.create", { role: "node", ...(tokenLabels ? { labels: tokenLabels } : {}) })).body.token;
    await daemon.join(token);
  }
  if (connect) await daemon.connect();
  return daemon;
}
