// The AgentError a handler's promise rejects with; the test fails if it resolves or throws anything else.
import { expect } from "vitest";
import { AgentError } from "../../agent/client.ts";

export async function agentFailure(p: Promise<unknown>): Promise<AgentError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  expect(e).toBeInstanceOf(AgentError);
  return e as AgentError;
}
