// Bindings the workers test project gives the Worker (see vitest.config.ts).
declare namespace Cloudflare {
  interface Env {
    DATABASE_URL: string;
    BC_DB_WS_PROXY: string;
    BC_SECRET: string;
  }
}
declare namespace Cloudflare {
  interface GlobalProps {
    mainModule: typeof import("./worker.ts");
  }
}
declare namespace Cloudflare {
  interface Env {
    NODE: DurableObjectNamespace<InstanceType<typeof import("./worker.ts").NodeDO>>;
    WORKFLOW: DurableObjectNamespace<import("./worker.ts").WorkflowDO>;
    BLOBS: R2Bucket;
  }
}
