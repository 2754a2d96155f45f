/**
 * Polls read() until done(value) holds; after ms, fails naming what did not happen, the last value
 * read and, from detail(), what else explains it (an agent's output).
 */
export async function eventually<T>(
  read: () => Promise<T>,
  done: (value: T) => boolean,
  what: string,
  { ms = 30_000, intervalMs = 200, detail }: { ms?: number; intervalMs?: number; detail?: () => string } = {},
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline)
      throw new Error(`${what} did not happen within ${ms} ms; last: ${JSON.stringify(value)}${detail ? `\n${detail()}` : ""}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
