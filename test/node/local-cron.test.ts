// The local stack's cron: the expressions come from wrangler.toml's [triggers], match minutes as
// Cloudflare's cron does (UTC, 5 fields), and fire at the start of each matching minute.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { cronMatches, cronsOfConfig, parseCron, scheduleCrons } from "../../local/cron.ts";
import { repoRoot } from "../../local/node-store.ts";
import { StackRefusedError, startStack } from "../../local/stack.ts";

const at = (iso: string) => new Date(iso);

describe("the local cron", () => {
  afterEach(() => void vi.useRealTimers());

  it("reads the crons of the repository's wrangler.toml, and none from a config without triggers", () => {
    const file = path.join(repoRoot, "wrangler.toml");
    expect(cronsOfConfig(fs.readFileSync(file, "utf8"), file)).toEqual(["* * * * *"]);
    expect(cronsOfConfig('name = "x"\n[observability]\nenabled = true\n', "wrangler.toml")).toEqual([]);
    const multi = '[triggers]\ncrons = [\n  "*/5 * * * *", # every five minutes\n  "0 3 * * 1",\n]\n[other]\ncrons = ["1 1 1 1 1"]\n';
    expect(cronsOfConfig(multi, "wrangler.toml")).toEqual(["*/5 * * * *", "0 3 * * 1"]);
    expect(cronsOfConfig(JSON.stringify({ triggers: { crons: ["0 * * * *"] } }), "wrangler.json")).toEqual(["0 * * * *"]);
  });

  it("matches numbers, lists, ranges and steps in UTC", () => {
    const everyMinute = parseCron("* * * * *");
    expect(cronMatches(everyMinute, at("2026-03-01T12:34:56Z"))).toBe(true);

    const quarter = parseCron("*/15 9-17 * * *");
    expect(cronMatches(quarter, at("2026-03-02T09:45:00Z"))).toBe(true);
    expect(cronMatches(quarter, at("2026-03-02T09:44:00Z"))).toBe(false);
    expect(cronMatches(quarter, at("2026-03-02T18:00:00Z"))).toBe(false);

    const list = parseCron("5,10-12/2 0 1 1,7 *");
    expect([5, 10, 12].map((m) => cronMatches(list, at(`2026-07-01T00:${String(m).padStart(2, "0")}:00Z`)))).toEqual([true, true, true]);
    expect(cronMatches(list, at("2026-07-01T00:11:00Z"))).toBe(false);
    expect(cronMatches(list, at("2026-08-01T00:05:00Z"))).toBe(false);

    // 2026-03-01 is a Sunday: 0 and 7 both name it.
    expect(cronMatches(parseCron("0 0 * * 7"), at("2026-03-01T00:00:00Z"))).toBe(true);
    expect(cronMatches(parseCron("0 0 * * 0"), at("2026-03-01T00:00:00Z"))).toBe(true);
    expect(cronMatches(parseCron("0 0 * * 1-5"), at("2026-03-01T00:00:00Z"))).toBe(false);
    // Both day fields restricted: either may match, as in cron(8).
    const either = parseCron("0 0 15 * 1");
    expect(cronMatches(either, at("2026-03-02T00:00:00Z"))).toBe(true); // a Monday
    expect(cronMatches(either, at("2026-03-15T00:00:00Z"))).toBe(true); // the 15th, a Sunday
    expect(cronMatches(either, at("2026-03-04T00:00:00Z"))).toBe(false);
  });

  it("refuses what it cannot read, naming the expression", () => {
    for (const [expression, why] of [
      ["* * * *", /4 fields, not 5/],
      ["0 0 * * * *", /6 fields, not 5/],
      ["0 0 * * MON", /cannot read "MON" in the day of week field/],
      ["0 0 L * *", /cannot read "L" in the day of month field/],
      ["60 * * * *", /"60" is not within 0-59 in the minute field/],
      ["* 5-2 * * *", /"5-2" is not within 0-23 in the hour field/],
      ["*/0 * * * *", /step 0 in the minute field/],
    ] as const) {
      expect(() => parseCron(expression), expression).toThrow(why);
      expect(() => parseCron(expression), expression).toThrow(`cron "${expression}"`);
    }
  });

  it("refuses to start a stack whose config has a cron it cannot read, before touching its data dir", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bc-cron-config-"));
    try {
      const config = path.join(dir, "wrangler.toml");
      fs.writeFileSync(
        config,
        fs.readFileSync(path.join(repoRoot, "wrangler.toml"), "utf8").replace('crons = ["* * * * *"]', 'crons = ["0 3 * * MON"]'),
      );
      const dataDir = path.join(dir, "data");
      const started = startStack({ dataDir, wranglerConfig: config });
      await expect(started).rejects.toBeInstanceOf(StackRefusedError);
      await expect(started).rejects.toThrow(`${config}: cron "0 3 * * MON": cannot read "MON" in the day of week field`);
      expect(fs.existsSync(dataDir)).toBe(false);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("fires each cron at the start of every minute it matches, and no more after stop", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "Date"] });
    vi.setSystemTime(at("2026-03-02T10:00:30Z"));
    const fired: string[] = [];
    const stop = scheduleCrons(
      [parseCron("* * * * *"), parseCron("*/2 * * * *")],
      async (cron) => void fired.push(`${new Date().toISOString().slice(11, 16)} ${cron}`),
      () => {},
    );
    await vi.advanceTimersByTimeAsync(3 * 60_000);
    expect(fired).toEqual(["10:01 * * * * *", "10:02 * * * * *", "10:02 */2 * * * *", "10:03 * * * * *"]);
    stop();
    await vi.advanceTimersByTimeAsync(5 * 60_000);
    expect(fired).toHaveLength(4);
  });

  it("reports a failed firing and keeps the schedule", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "Date"] });
    vi.setSystemTime(at("2026-03-02T10:00:30Z"));
    const errors: string[] = [];
    let calls = 0;
    const stop = scheduleCrons(
      [parseCron("* * * * *")],
      async () => {
        if (++calls === 1) throw new Error("wrangler dev answered 500");
      },
      (cron, err) => errors.push(`${cron}: ${(err as Error).message}`),
    );
    await vi.advanceTimersByTimeAsync(2 * 60_000);
    stop();
    expect(calls).toBe(2);
    expect(errors).toEqual(["* * * * *: wrangler dev answered 500"]);
  });
});
