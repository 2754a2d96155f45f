// The context an agent hands a command handler, for tests that call a role's handlers directly.
import type { CommandContext } from "../../agent/contracts.ts";

export function commandContext(kind: string, secrets: Record<string, string> = {}, signal = new AbortController().signal): CommandContext {
  return { id: "c1", key: "k1", kind, seq: 1, attested: false, deadline: null, signal, secrets };
}
