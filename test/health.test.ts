import { exports } from "cloudflare:workers";
import { describe, expect, it } from "vitest";

describe("the test deployment (the default modules plus the test plugins)", () => {
  it("answers /v1/health with the database reachable", async () => {
    const res = await exports.default.fetch("http://bc.test/v1/health");
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ status: "ok", database: "reachable" });
  });
});
