// Two projects: `workers` runs in workerd (miniflare) against Postgres through the same
// driver as production; `node` runs agent-side code, scripts, and the metal simulations
// (createMetalSim serves simulated BMCs over HTTP, which workerd cannot).
const NODE_SUITES = [
  "test/node/**/*.test.ts",
  "test/extensions/ubuntu-autoinstall.test.ts",
  "test/extensions/talos.test.ts",
  "test/extensions/bcx-runtime.test.ts",
  "test/metal/**/*.test.ts",
];
import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { configDefaults, defineConfig } from "vitest/config";

// BC_TEST_DURATIONS=FILE: each test file's duration is written to FILE as well (.ci/run's lanes).
const durations = process.env.BC_TEST_DURATIONS;

export default defineConfig({
  test: {
    ...(durations ? { reporters: [...configDefaults.reporters, ["./test/support/file-durations.ts", { outputFile: durations }]] } : {}),
    projects: [
      {
        plugins: [
          cloudflareTest(({ inject }) => ({
            wrangler: { configPath: "./wrangler.toml" },
            // The deployment's bindings, with a test entry that adds the test plugins.
            main: "./test/support/worker.ts",
            miniflare: {
              bindings: {
                DATABASE_URL: inject("databaseUrl"),
                BC_DB_WS_PROXY: inject("bridge"),
                BC_SECRET: "test-deployment-secret-0123456789abcdef",
              },
            },
          })),
        ],
        test: {
          name: "workers",
          include: ["test/**/*.test.ts"],
          exclude: NODE_SUITES,
          globalSetup: ["test/support/global-setup.ts"],
          testTimeout: 30_000,
        },
      },
      {
        test: {
          name: "node",
          include: NODE_SUITES,
          environment: "node",
          // One local stack for the files that can share it, started when the first asks (test/support/shared-stack.ts).
          globalSetup: ["test/support/stack-broker.ts"],
          testTimeout: 60_000,
        },
      },
    ],
  },
});
