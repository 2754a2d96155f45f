// A Hetzner Robot server in a metal pool (docs/providers/hetzner-robot.md, "A Robot server in a
// metal pool"): its power and its rescue system come from the Robot webservice instead of a BMC.
// The driver runs on the control plane, so a pool of such machines needs no site agent (metal's
// needsSiteAgent): its steps are control-plane steps that call Robot through the adapter's HTTP
// (robotHttp: Basic auth, Robot's errors and limits), with the webservice password resolved from
// the secret store at call time, so it is in no step input or output, event, command or log.
//
// Nothing boots a ramdisk on the box, so nothing can attest a wipe: a Robot pool is agentless
// (agent: none, policy.allowUnverifiedRelease) and its release leaves the disks as they are.
import { z } from "zod";
import { defineDriver, defineModule, type Module } from "better-compute";
import { ComputeError, SECRET_REF, type SecretRef } from "better-compute/core";
import type { HardwareProfile } from "better-compute/metal";
import { defineProfile, defineStep, StepError, stepNotReady, type ControlPlaneStep, type StepContext } from "better-compute/provision";
import { failureOf, type Fetch, type ProviderHttp } from "better-compute/vps";
import { armRescue, powerOf, PROVIDER, robotHttp, typesOf, type RobotReset, type RobotServer } from "./provider.ts";

export const ROBOT_DRIVER = "hetzner-robot";

const LOOPBACK = /^(127\.\d{1,3}\.\d{1,3}\.\d{1,3}|localhost|\[::1\])$/;

/**
 * The Robot endpoint and server number of a binding's address, Robot's own URL of the server
 * (`https://robot-ws.your-server.de/server/2451001`, as a Redfish address names its system), so
 * one server is enrolled once. Plain http only to a loopback emulator: the password travels in
 * the Authorization header.
 */
export function robotServer(address: string): { endpoint: string; number: number } | undefined {
  let url: URL;
  try {
    url = new URL(address);
  } catch {
    return undefined;
  }
  const path = /^(.*)\/server\/(\d{1,12})\/?$/.exec(url.pathname);
  if (!path || url.search || url.hash || url.username || url.password) return undefined;
  if (url.protocol !== "https:" && !(url.protocol === "http:" && LOOPBACK.test(url.hostname))) return undefined;
  return { endpoint: `${url.origin}${path[1]}`, number: Number(path[2]) };
}

/** A key in the account's key management, by the MD5 fingerprint Robot names it with. */
const fingerprint = z.string().regex(/^([0-9a-f]{2}:){15}[0-9a-f]{2}$/, "a Robot key fingerprint (MD5, aa:bb:…)");

/** A Robot server's binding: which server, the webservice user, its password by reference, and the keys its rescue system takes. */
export const robotBinding = z.strictObject({
  driver: z.literal(ROBOT_DRIVER),
  address: z
    .string()
    .refine(
      (a) => robotServer(a) !== undefined,
      "Robot's URL of the server, https://robot-ws.your-server.de/server/<number> (plain http to a loopback emulator only)",
    ),
  /** The webservice user (Robot: Settings, Webservice and app settings), not the Robot login. */
  username: z.string().min(1).max(256),
  password: z.string().regex(SECRET_REF, "a secret:// reference"),
  /** Fingerprints of keys already in the account: root logs in to the rescue system with them (no root password is handed out). */
  rescueKeys: z.array(fingerprint).min(1).max(20),
});
export type RobotBinding = z.infer<typeof robotBinding>;

export const robotDriver = defineDriver({
  id: ROBOT_DRIVER,
  kinds: ["power", "management"],
  runsOn: "control-plane",
  manifest: robotBinding,
  secretFields: ["password"],
});

/** The server and the webservice, the password resolved now and held only by the HTTP client's header. */
interface Robot {
  http: ProviderHttp;
  n: number;
}

/**
 * Robot's failures as metal reports a driver's: a wrong user or password (INVALID_CONFIG) and a
 * refusal (DRIVER_ERROR) fail the step at once (Robot blocks the client's IP after three failed
 * logins: no loop); a transient one (5xx, a spent limit) is retried by the step's policy.
 */
async function callRobot<T>(ctx: StepContext, bmc: RobotBinding, fetch: Fetch, work: (robot: Robot) => Promise<T>): Promise<T> {
  const { endpoint, number } = robotServer(bmc.address)!;
  const password = await ctx.secrets.resolve(bmc.password as SecretRef);
  try {
    return await work({ http: robotHttp(endpoint, bmc.username, password, fetch), n: number });
  } catch (err) {
    if (err instanceof ComputeError && err.details?.provider === PROVIDER)
      throw new StepError(err.code, err.message, failureOf(err) === "transient", err.details);
    throw err;
  }
}

const refused = (message: string, reason: string, n: number) =>
  new StepError("DRIVER_ERROR", `${PROVIDER}: ${message}`, false, { provider: PROVIDER, reason, server: n });

async function readReset({ http, n }: Robot): Promise<RobotReset | undefined> {
  const res = await http.request<{ reset: RobotReset }>("GET", `/reset/${n}`, { accept: [404] });
  return res.status === 404 ? undefined : res.body.reset;
}

const pressReset = ({ http, n }: Robot, type: string) => http.request("POST", `/reset/${n}`, { form: { type } });

/** Idempotent by desired state (as Redfish's power.setPower); answers what was sent, if anything. */
async function setPower(robot: Robot, action: "on" | "off" | "cycle"): Promise<{ sent: string | null }> {
  const reset = await readReset(robot);
  const power = powerOf(reset);
  const types = reset ? typesOf(reset) : [];
  const press = async (type: string) => {
    if (type === "wol") await robot.http.request("POST", `/wol/${robot.n}`);
    else await pressReset(robot, type);
    return { sent: type };
  };
  // On: the power button on a box known off; else wake-on-LAN, harmless to a box that is on.
  const switchOn = () => (power === "off" && types.includes("power") ? press("power") : press("wol"));
  if (action === "on") return power === "on" ? { sent: null } : switchOn();
  if (action === "cycle") return power === "off" ? switchOn() : press(types.includes("hw") ? "hw" : "sw");
  if (power === "off") return { sent: null };
  // Off: a forced switch-off; the ACPI button only on a box known on (pressed on a box that is off, it starts it).
  if (types.includes("power_long")) return press("power_long");
  if (power === "on" && types.includes("power")) return press("power");
  throw refused(
    `server ${robot.n} cannot be switched off through Robot (its resetter offers ${types.join(", ") || "nothing"})`,
    "power_off_unavailable",
    robot.n,
  );
}

const machineInput = z.object({ machine: z.string(), bmc: robotBinding });

/** A control-plane step over the machine's binding: `call` makes its Robot calls (callRobot). */
interface RobotStep<I extends typeof machineInput> extends Pick<ControlPlaneStep<I>, "id" | "retry" | "pollSeconds" | "deadlineSeconds"> {
  description: string;
  input?: I;
  call: (robot: Robot, input: z.output<I>) => Promise<unknown>;
}

export function robotSteps(fetch: Fetch) {
  const robotStep = <I extends typeof machineInput = typeof machineInput>({ call, input, ...def }: RobotStep<I>) =>
    defineStep({
      ...def,
      runsOn: "control-plane",
      input: input ?? (machineInput as I),
      run: (ctx, stepInput: z.output<I>) => callRobot(ctx, stepInput.bmc, fetch, (robot) => call(robot, stepInput)),
    });

  const inspect = robotStep({
    id: "robot.inspect",
    description: "Read the server's facts from Robot (product, datacenter, IP addresses, power) for metal.recordInventory",
    call: async (robot) => {
      const res = await robot.http.request<{ server: RobotServer & { server_ipv6_net?: string } }>("GET", `/server/${robot.n}`, {
        accept: [404],
      });
      if (res.status === 404) throw refused(`server ${robot.n} is not in this Robot account`, "not_found", robot.n);
      const s = res.body.server;
      return {
        manufacturer: "Hetzner",
        model: s.product,
        serverNumber: s.server_number,
        datacenter: s.dc,
        addresses: s.ip?.length ? s.ip : s.server_ip ? [s.server_ip] : [],
        ...(s.server_ipv6_net ? { ipv6Net: s.server_ipv6_net } : {}),
        power: powerOf(await readReset(robot)),
      };
    },
  });

  const power = robotStep({
    id: "robot.setPower",
    description: "Power the server on (power button or wake-on-LAN), off (power_long) or cycle it (hw reset) through Robot",
    input: machineInput.extend({ action: z.enum(["on", "off", "cycle"]) }),
    retry: { attempts: 3, backoffSeconds: 5, maxBackoffSeconds: 60 },
    call: async (robot, input) => ({ action: input.action, ...(await setPower(robot, input.action)) }),
  });

  const arm = robotStep({
    id: "robot.rescue.arm",
    description: "Arm Hetzner's rescue system (Linux) with the binding's SSH keys; the next boot starts it",
    call: async ({ http, n }, input) => {
      if (!(await armRescue(http, n, input.bmc.rescueKeys)))
        throw refused(`server ${n}: another boot option stays active`, "BOOT_ALREADY_ENABLED", n);
      return { os: "linux", keys: input.bmc.rescueKeys };
    },
  });

  const disarm = robotStep({
    id: "robot.rescue.disarm",
    description: "Disarm a rescue boot still pending, so the next boot starts the disks",
    call: async ({ http, n }) => {
      await http.request("DELETE", `/boot/${n}/rescue`, { accept: [404] });
      return { disarmed: true };
    },
  });

  const rescueBooted = robotStep({
    id: "robot.rescue.booted",
    description: "Wait until the server booted the armed rescue system (Robot clears the rescue flag at that boot)",
    // Real rescue boots take minutes; the flag flips at the boot, not when SSH answers.
    pollSeconds: 10,
    deadlineSeconds: 900,
    call: async ({ http, n }) => {
      const res = await http.request<{ rescue: { active: boolean } }>("GET", `/boot/${n}/rescue`);
      if (res.body.rescue.active) stepNotReady(`server ${n} has not booted its rescue system yet`);
      return { booted: "rescue" };
    },
  });

  return [inspect, power, arm, disarm, rescueBooted];
}

const disarmRescue = { step: "robot.rescue.disarm", name: "rescue.disarm" };
const powerStep = (name: string, action: "on" | "off" | "cycle") => ({ step: "robot.setPower", name, input: { action } });

export const robotProfiles = [
  defineProfile({
    id: "hetzner-robot.commission",
    target: "metal",
    description: "Read the server's facts from Robot and record them, disarm a pending rescue, power off; no ramdisk, no wipe",
    steps: [
      { step: "robot.inspect", name: "inspect" },
      { step: "metal.recordInventory", fromStep: "inspect" },
      disarmRescue,
      powerStep("power.off", "off"),
    ],
  }),
  defineProfile({
    id: "hetzner-robot.release",
    target: "metal",
    description: "Disarm a pending rescue and power off; the disks are not wiped (nothing on the box can attest it)",
    steps: [disarmRescue, powerStep("power.off", "off")],
  }),
  defineProfile({
    id: "hetzner-robot.deploy.disk",
    target: "metal",
    role: "host",
    description:
      "Boot the server from its disks: what Hetzner installed at order, or installimage from a rescue session; nothing is written",
    steps: [disarmRescue, powerStep("power.on", "on")],
  }),
  defineProfile({
    id: "hetzner-robot.rescue",
    target: "metal",
    description: "Arm Hetzner's rescue system with the binding's SSH keys and reset into it; the disks are untouched",
    steps: [{ step: "robot.rescue.arm", name: "rescue.arm" }, powerStep("power.cycle", "cycle"), { step: "robot.rescue.booted" }],
  }),
  defineProfile({
    id: "hetzner-robot.unrescue",
    target: "metal",
    description: "Disarm the rescue system if its boot is still pending, and reset the server into its disks",
    steps: [disarmRescue, powerStep("power.reboot", "cycle")],
  }),
];

/** The hardware profile of a Robot pool: register it with metalModule({ hardwareProfiles: { "hetzner-robot": ... } }). */
export const hetznerRobotHardwareProfile: HardwareProfile = {
  description: "A Hetzner dedicated server: power and rescue through the Robot webservice, no BMC, no site agent",
  drivers: { power: ROBOT_DRIVER, management: ROBOT_DRIVER },
  profiles: {
    commission: "hetzner-robot.commission",
    release: "hetzner-robot.release",
    rescue: "hetzner-robot.rescue",
    unrescue: "hetzner-robot.unrescue",
  },
};

export interface HetznerRobotMetalOptions {
  /** What every Robot request goes through; default globalThis.fetch. */
  fetch?: Fetch;
}

/** The driver, steps and profiles of Robot servers in metal pools: register beside metalModule(). */
export function hetznerRobotMetal(options: HetznerRobotMetalOptions = {}): Module {
  const fetch: Fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  return defineModule({
    id: "hetzner-robot-metal",
    description: "Hetzner Robot servers in metal pools: power and rescue through the Robot webservice",
    extensions: [robotDriver, ...robotSteps(fetch)],
    profiles: robotProfiles,
  });
}
