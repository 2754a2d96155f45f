// The store conformance suite against the database the workers project runs on: PGlite by
// default, the Postgres server when BC_TEST_DATABASE_URL names it (CI runs both).
import { env } from "cloudflare:workers";
import { expect, it } from "vitest";
import { postgres } from "better-compute";
import { runConformance, storeConformanceCases } from "better-compute/conformance";

it("the production driver passes every store conformance case", async () => {
  const database = postgres();
  const report = await runConformance(storeConformanceCases(), () => database.open(env), { dispose: (store) => store.close() });
  expect(report.failed).toEqual([]);
  expect(report.passed).toHaveLength(storeConformanceCases().length);
});

it("reports a failing case instead of throwing", async () => {
  const report = await runConformance(
    [
      {
        name: "always fails",
        run: async () => {
          throw new Error("boom");
        },
      },
    ],
    () => ({}),
  );
  expect(report).toEqual({ passed: [], failed: [{ name: "always fails", error: "Error: boom" }] });
});
