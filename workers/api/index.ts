// The API Worker's entry: the deployment's compute serves every request.
import { compute } from "../../better-compute.config.ts";

export default {
  fetch: (request, env, ctx) => compute.fetch(request, env, ctx),
} satisfies ExportedHandler<Cloudflare.Env>;
