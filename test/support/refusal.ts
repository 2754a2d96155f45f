// The refusal an API call (callApi, the metal sim's call) ends in, with its message as the API wrote it.
export type Refusal = { code: string; message: string; details?: Record<string, any> };

/** The refusal a call ends in (fails the test when the call succeeds). */
export async function refusal(promise: Promise<unknown>): Promise<Refusal> {
  const outcome = await promise.then(
    (value) => ({ ok: true as const, value }),
    (err: unknown) => ({ ok: false as const, err: err as Refusal }),
  );
  if (outcome.ok) throw new Error(`expected a refusal, got ${JSON.stringify(outcome.value)}`);
  // callApi's message is "<method>: <code>: <message>".
  return { ...outcome.err, message: outcome.err.message.replace(/^[\w.]+: [A-Z_]+: /, "") };
}
