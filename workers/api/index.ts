// The API Worker's entry: the deployment's compute serves every request (API, JoinService,
// agent gateway); NodeDO is exported for its Durable Object binding.
import { compute } from "../../better-compute.config.ts";

export { NodeDO } from "../../durable-objects/node.ts";

export default {
  fetch: (request, env, ctx) => compute.fetch(request, env, ctx),
} satisfies ExportedHandler<Cloudflare.Env>;
