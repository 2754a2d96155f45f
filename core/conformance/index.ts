// better-compute/conformance: contracts come with suites of plain { name, run } cases that
// an implementation runs against itself. The runner carries no test framework.
export { storeConformanceCases } from "./store.ts";

export interface ConformanceCase<S> {
  name: string;
  run(subject: S): Promise<void>;
}

export interface ConformanceReport {
  passed: string[];
  failed: { name: string; error: string }[];
}

/** Runs every case against a fresh subject from the factory; never throws for a failing case. */
export async function runConformance<S>(
  cases: ConformanceCase<S>[],
  factory: () => S | Promise<S>,
  options: { dispose?: (subject: S) => Promise<void> | void } = {},
): Promise<ConformanceReport> {
  const report: ConformanceReport = { passed: [], failed: [] };
  for (const c of cases) {
    const subject = await factory();
    try {
      await c.run(subject);
      report.passed.push(c.name);
    } catch (err) {
      report.failed.push({ name: c.name, error: err instanceof Error ? `${err.name}: ${err.message}` : String(err) });
    } finally {
      await options.dispose?.(subject);
    }
  }
  return report;
}
