// One BMC address validator (better-compute/metal/bmc-address) for the control plane and the site
// agent: one table of addresses goes through the redfish driver's manifest (what metal.enroll
// checks a binding with) and through the site agent's handler (what runs a command), and both
// must give the same answer, with the same message. The agent refuses nothing the control plane
// accepted, and accepts nothing it refused.
import { describe, expect, it } from "vitest";
import type { FetchLike } from "../../agent/client.ts";
import { siteHandlers } from "../../agent/roles/site.ts";
import { MAX_BMC_ADDRESS_LENGTH, parseBmcAddress } from "../../plugins/metal/bmc-address.ts";
import { redfishDriver } from "../../plugins/metal/steps.ts";
import { agentFailure } from "../support/agent-error.ts";
import { commandContext } from "../support/command-context.ts";

const SYSTEMS = "/redfish/v1/Systems/";
const longId = (total: number) => `https://10.0.0.5${SYSTEMS}${"a".repeat(total - `https://10.0.0.5${SYSTEMS}`.length)}`;

const ACCEPTED = [
  "https://10.0.0.5/redfish/v1/Systems/1",
  "https://10.0.0.5/redfish/v1/Systems/1/",
  "http://127.0.0.1:8000/redfish/v1/Systems/node-1",
  "https://[fd00::5]:8443/redfish/v1/Systems/System.Embedded.1",
  "https://BMC.example/redfish/v1/Systems/a%20b",
  "https://bmc-7.rack-1.example:443/redfish/v1/Systems/437XR1138R2",
  longId(MAX_BMC_ADDRESS_LENGTH),
];

const REFUSED = [
  // credentials in the URL
  "https://admin:hunter2@10.0.0.5/redfish/v1/Systems/1",
  "https://admin@10.0.0.5/redfish/v1/Systems/1",
  "https://:hunter2@10.0.0.5/redfish/v1/Systems/1",
  // not http(s)
  "ftp://10.0.0.5/redfish/v1/Systems/1",
  "file:///redfish/v1/Systems/1",
  "javascript:alert(1)//redfish/v1/Systems/1",
  // a query or a fragment, even an empty one
  "https://10.0.0.5/redfish/v1/Systems/1?$expand=*",
  "https://10.0.0.5/redfish/v1/Systems/1?",
  "https://10.0.0.5/redfish/v1/Systems/1#Boot",
  "https://10.0.0.5/redfish/v1/Systems/1#",
  // not a system
  "https://10.0.0.5/redfish/v1/Systems",
  "https://10.0.0.5/redfish/v1/Systems/",
  "https://10.0.0.5/redfish/v1/Managers/1",
  "https://10.0.0.5/redfish/v1/Systems/1/Bios",
  "https://10.0.0.5/redfish/v1/Systems/1/../../Managers/1",
  "https://10.0.0.5/redfish/v1/Systems/%2e%2e",
  "https://10.0.0.5/redfish/v1/Systems/%E0%A4%A",
  "https://10.0.0.5/",
  "https:///redfish/v1/Systems/1",
  // control characters and whitespace (the URL parser would drop some silently)
  "https://10.0.0.5/redfish/v1/Sys\ntems/1",
  "https://10.0.0.5/redfish/v1/Systems/1\t",
  "https://10.0.0.5/redfish/v1/Systems/1\r\n",
  " https://10.0.0.5/redfish/v1/Systems/1",
  "https://10.0.0.5/redfish/v1/Systems/a b",
  "https://10.0.0.5/redfish/v1/Systems/1\u0000",
  "https://10.0.0.5/redfish/v1/Systems/1\u007f",
  "https://10.0.0.5/redfish/v1/Systems/1\u0085",
  // too long
  longId(MAX_BMC_ADDRESS_LENGTH + 1),
  // not a URL
  "not a url",
  "/redfish/v1/Systems/1",
  "",
];

/** The control plane's answer: the redfish driver's manifest, as metal.enroll applies it. */
function controlPlane(address: string): { ok: boolean; message?: string } {
  const checked = redfishDriver.manifest!.safeParse({ driver: "redfish", address, username: "admin", password: "secret://bmc-1" });
  return checked.success ? { ok: true } : { ok: false, message: checked.error.issues.find((i) => i.path[0] === "address")?.message };
}

const REF = "secret://bmc-1";
const ctx = commandContext("metal.bmc.inspect", { [REF]: "hunter2" });

/** The site agent's answer: its handler, with a BMC that answers every request 503 (reached means accepted). */
async function agent(address: string): Promise<{ ok: boolean; message?: string; requests: number }> {
  let requests = 0;
  const bmc: FetchLike = async () => (requests++, new Response("", { status: 503 }));
  const e = await agentFailure(
    siteHandlers({ fetch: bmc })["metal.bmc.inspect"]!({ bmc: { address, username: "admin", password: REF } }, ctx) as Promise<unknown>,
  );
  if (e.code === "DRIVER_ERROR") return { ok: true, requests };
  expect(e.code, JSON.stringify(address)).toBe("INVALID_ARGUMENT");
  return { ok: false, message: e.message, requests };
}

describe("one BMC address validator for the control plane and the site agent", () => {
  it("gives the same answer, and the same message, for every address of the table", async () => {
    for (const [address, expected] of [...ACCEPTED.map((a) => [a, true] as const), ...REFUSED.map((a) => [a, false] as const)]) {
      const shown = JSON.stringify(address.length > 80 ? `${address.slice(0, 60)}… (${address.length})` : address);
      const cp = controlPlane(address);
      const ag = await agent(address);
      expect(cp.ok, `control plane, ${shown}`).toBe(expected);
      expect(ag.ok, `site agent, ${shown}`).toBe(expected);
      if (expected) continue;
      expect(ag.requests, shown).toBe(0);
      // The empty address stops at the body's schema; every other refusal is the shared sentence.
      if (address !== "") expect(ag.message, shown).toBe(cp.message);
      expect(cp.message, shown).toMatch(/redfish\/v1\/Systems/);
      expect(`${cp.message} ${ag.message}`).not.toContain("hunter2");
    }
  });

  it("splits an accepted address into what requests need", () => {
    expect(parseBmcAddress("https://[fd00::5]:8443/redfish/v1/Systems/a%20b/")).toEqual({
      ok: true,
      address: { origin: "https://[fd00::5]:8443", systemPath: "/redfish/v1/Systems/a%20b", systemId: "a b", https: true },
    });
    expect(parseBmcAddress("http://10.0.0.5/redfish/v1/Managers/1")).toEqual({
      ok: false,
      problem: "must name a system (/redfish/v1/Systems/<id>), not http://10.0.0.5/redfish/v1/Managers/1",
    });
    expect(parseBmcAddress(42)).toEqual({ ok: false, problem: "is missing" });
  });
});
