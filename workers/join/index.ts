// The join Worker's entry: JoinService alone (/join/v1/join, /join/v1/renew) and /v1/health,
// built from the same deployment config and code as the API Worker, which serves the same routes
// too. Deploy it apart with `npx wrangler deploy -c workers/join/wrangler.toml`. The agent
// gateway (/agent/v1/connect) stays with the API Worker: it hands sockets to the NodeDO.
import { compute } from "../../better-compute.config.ts";
import type { Bindings } from "../../core/bindings.ts";

export default {
  fetch: (request, env, ctx) => compute.joinApp.fetch(request, env, ctx),
} satisfies ExportedHandler<Bindings>;
