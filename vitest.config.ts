// Two projects: `workers` runs in workerd (miniflare) against Postgres through the same
// driver as production; `node` runs agent-side code and scripts.
import { cloudflareTest } from "@cloudflare/vitest-plugin";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
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
          exclude: ["test/node/**"],
          globalSetup: ["test/support/global-setup.ts"],
          testTimeout: 30_000,
        },
      },
      {
        test: {
          name: "node",
          include: ["test/node/**/*.test.ts"],
          environment: "node",
          testTimeout: 60_000,
        },
      },
    ],
  },
});
