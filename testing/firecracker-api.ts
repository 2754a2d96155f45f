// Firecracker's API request bodies as zod schemas, written from its published spec
// (src/firecracker/swagger/firecracker.yaml, v1.17) and the serde structs behind it, for the
// endpoints the firecracker backend calls and the fake serves. Firecracker deserialises every body
// with deny_unknown_fields, so every object here is strict; Option<T> fields accept null as absent.
// Value checks the VMM makes after parsing (vCPU range, memory size, ids) live in the fake.
import { z } from "zod";

/** A non-negative integer that fits the serde type (u8, u16, u64/usize). */
const uint = (max: number) => z.number().int().min(0).max(max);
const opt = <T extends z.ZodType>(schema: T) => schema.nullish();

const TokenBucket = z.strictObject({
  size: uint(Number.MAX_SAFE_INTEGER),
  one_time_burst: opt(uint(Number.MAX_SAFE_INTEGER)),
  refill_time: uint(Number.MAX_SAFE_INTEGER),
});

const RateLimiter = z.strictObject({ bandwidth: opt(TokenBucket), ops: opt(TokenBucket) });

export const BootSource = z.strictObject({
  kernel_image_path: z.string(),
  initrd_path: opt(z.string()),
  boot_args: opt(z.string()),
});

export const Drive = z.strictObject({
  drive_id: z.string(),
  partuuid: opt(z.string()),
  is_root_device: z.boolean(),
  cache_type: z.enum(["Unsafe", "Writeback"]).optional(),
  // Required for virtio-block (the VMM refuses a drive with neither path_on_host nor socket).
  is_read_only: opt(z.boolean()),
  path_on_host: opt(z.string()),
  rate_limiter: opt(RateLimiter),
  io_engine: opt(z.enum(["Sync", "Async"])),
  socket: opt(z.string()),
});

export const MachineConfiguration = z.strictObject({
  // u8 in the VMM: 0 or 33 parse, and the VMM refuses them with its own message.
  vcpu_count: uint(255),
  mem_size_mib: uint(Number.MAX_SAFE_INTEGER),
  smt: z.boolean().optional(),
  cpu_template: opt(z.enum(["C3", "T2", "T2S", "T2CL", "T2A", "V1N1", "None"])),
  track_dirty_pages: z.boolean().optional(),
  huge_pages: z.enum(["None", "Transparent", "2M"]).optional(),
});

/** A MAC as firecracker's MacAddr parses it: six hex byte pairs separated by colons. */
const MacAddr = z.string().regex(/^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/, "invalid MAC address");

export const NetworkInterface = z.strictObject({
  iface_id: z.string(),
  host_dev_name: z.string(),
  guest_mac: opt(MacAddr),
  mtu: opt(z.number().int().min(68).max(65535)),
  rx_rate_limiter: opt(RateLimiter),
  tx_rate_limiter: opt(RateLimiter),
});

const LOG_LEVELS = ["error", "warning", "warn", "info", "debug", "trace", "off"];

export const Logger = z.strictObject({
  log_path: opt(z.string()),
  // Case-insensitive in the VMM (it also takes "Warn").
  level: opt(z.string().refine((level) => LOG_LEVELS.includes(level.toLowerCase()), "unknown log level")),
  show_level: opt(z.boolean()),
  show_log_origin: opt(z.boolean()),
  module: opt(z.string()),
});

export const InstanceActionInfo = z.strictObject({
  action_type: z.enum(["FlushMetrics", "InstanceStart", "SendCtrlAltDel"]),
});

/** GET / (a response body: not strict, it is what the VMM sends). */
export const InstanceInfo = z.object({
  app_name: z.string(),
  id: z.string(),
  state: z.enum(["Not started", "Running", "Paused"]),
  vmm_version: z.string(),
});

/** The error body of every refused request. */
export const ApiError = z.object({ fault_message: z.string() });

export type BootSource = z.infer<typeof BootSource>;
export type Drive = z.infer<typeof Drive>;
export type MachineConfiguration = z.infer<typeof MachineConfiguration>;
export type NetworkInterface = z.infer<typeof NetworkInterface>;
export type Logger = z.infer<typeof Logger>;
export type InstanceActionInfo = z.infer<typeof InstanceActionInfo>;
export type InstanceInfo = z.infer<typeof InstanceInfo>;

/**
 * Parses a request body as firecracker does: a JSON syntax error, an unknown field, a missing
 * field or a wrong type is refused with serde's kind of message, prefixed as the API server does.
 */
export function parseBody<T extends z.ZodType>(schema: T, raw: string): { ok: true; value: z.infer<T> } | { ok: false; fault: string } {
  const prefix = "An error occurred when deserializing the json body of a request: ";
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (error) {
    return { ok: false, fault: `${prefix}${(error as Error).message}.` };
  }
  const parsed = schema.safeParse(json);
  if (parsed.success) return { ok: true, value: parsed.data };
  return { ok: false, fault: `${prefix}${describeIssue(parsed.error.issues[0]!, json)}.` };
}

function describeIssue(issue: z.core.$ZodIssue, input: unknown): string {
  const field = issue.path.join(".");
  if (issue.code === "unrecognized_keys") {
    const at = field ? ` in \`${field}\`` : "";
    return `unknown field \`${issue.keys[0]}\`${at}`;
  }
  if (issue.code === "invalid_type" && valueAt(input, issue.path) === undefined) return `missing field \`${field}\``;
  return `invalid value for \`${field}\`: ${issue.message}`;
}

function valueAt(input: unknown, path: PropertyKey[]): unknown {
  let value = input;
  for (const key of path) value = value !== null && typeof value === "object" ? (value as Record<PropertyKey, unknown>)[key] : undefined;
  return value;
}
