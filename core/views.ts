// What workflows.get answers, as its readers use it: the web console's pages and the CLI's live
// progress. Types only (the CLI's bundle imports nothing of the control plane from here); the
// provision module's output schema is the source of truth.

export interface AttemptView {
  attempt: number;
  state: string;
  error: unknown;
  /** The command an agent step sent, once sent. */
  commandId: string | null;
  polls: number;
  startedAt: string | null;
  finishedAt: string | null;
}

export interface WorkflowView {
  id: string;
  profile: string;
  version: string;
  target: string;
  state: string;
  position: number;
  error: unknown;
  createdBy: string;
  createdAt: string;
  finishedAt: string | null;
  steps: { position: number; name: string; step: string; attempts: AttemptView[] }[];
  /** Its batch of destructive commands under pki.approvers (docs/quorum.md); null when it needs no approval. */
  quorum?: { digest: string; kinds: string[]; threshold: number; approvals: string[]; approvedAt: string | null } | null;
}
