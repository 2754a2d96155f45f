// The pieces the NodeDO reads an agent's frames with: the strict reader (limits by parsed type,
// duplicated keys refused) and a socket's frame budget, on a clock the test moves.
import { describe, expect, it } from "vitest";
import { DEFAULT_FRAME_BUDGETS, frameBudgets, REFUSAL_LOG_PERIOD_MS, SocketBudget } from "../core/agents/frame-budget.ts";
import { CloseCode, hasDuplicateKey, MAX_FRAME_BYTES, readAgentFrame } from "../core/protocol.ts";

describe("hasDuplicateKey", () => {
  it("finds a key named twice in any object, escapes decoded; strings and arrays are not keys", () => {
    const cases: [string, boolean][] = [
      ['{"t":"ack","id":"1"}', false],
      ['{"t":"ack","t":"result"}', true],
      ['{"a":{"b":1,"b":2}}', true],
      ['{"a":{"b":1},"c":{"b":2}}', false],
      ['{"a":1,"\\u0061":2}', true],
      ['{"a\\"":1,"a":2}', false],
      ['{"a\\\\":1,"a\\\\":2}', true],
      ['{"s":"\\"t\\":1,\\"t\\":2","t":3}', false],
      ['{"l":[{"x":1},{"x":2}],"x":3}', false],
      ['{"l":["k","k"],"k":1}', false],
      ['{"l":[{"x":1,"x":2}]}', true],
      ['{"e":{},"f":[],"e2":{"g":[1,{"h":{}}]}}', false],
      ['[{"a":1},{"a":1,"a":2}]', true],
    ];
    for (const [text, duplicated] of cases) {
      JSON.parse(text); // every case is valid JSON
      expect([text, hasDuplicateKey(text)]).toEqual([text, duplicated]);
    }
  });
});

describe("readAgentFrame", () => {
  const pad = "x".repeat(MAX_FRAME_BYTES);
  it("limits a frame by the type it parses as, whatever its text starts with", () => {
    expect(readAgentFrame(`{"t":"status","generation":1,"sections":{},"pad":"${pad}"}`)).toMatchObject({ frame: { t: "status" } });
    expect(readAgentFrame(`{"t":"status","generation":1,"sections":{},"t":"ack","id":"1","pad":"${pad}"}`)).toMatchObject({
      close: CloseCode.FRAME_TOO_LARGE,
    });
    expect(readAgentFrame(`{"t":"ack","id":"1","pad":"${"é".repeat(MAX_FRAME_BYTES / 2)}"}`)).toMatchObject({
      close: CloseCode.FRAME_TOO_LARGE,
    });
    expect(readAgentFrame(new ArrayBuffer(8))).toMatchObject({ close: CloseCode.MALFORMED_FRAME });
    expect(readAgentFrame('{"t":"ack","id":"1","id":"2"}')).toEqual({
      close: CloseCode.MALFORMED_FRAME,
      reason: "the frame names a key twice",
    });
    expect(readAgentFrame('{"t":"ack","id":"1"}')).toEqual({ frame: { t: "ack", id: "1" } });
  });
});

describe("SocketBudget", () => {
  const clock = () => {
    let t = 0;
    return { now: () => t, advance: (ms: number) => void (t += ms) };
  };

  it("takes one ack per command sent, results and statuses at their rate, and refills", () => {
    const time = clock();
    const budget = new SocketBudget(frameBudgets({ result: { perSecond: 10, burst: 3 } }), time.now);
    expect(budget.admit("ack")).toBe(false);
    budget.sent(2);
    expect([budget.admit("ack"), budget.admit("ack"), budget.admit("ack")]).toEqual([true, true, false]);
    expect([1, 2, 3, 4].map(() => budget.admit("result"))).toEqual([true, true, true, false]);
    time.advance(100); // one token back at 10 a second
    expect([budget.admit("result"), budget.admit("result")]).toEqual([true, false]);
    expect(budget.summary().frames).toEqual({
      ack: { taken: 2, dropped: 2 },
      result: { taken: 4, dropped: 2 },
      status: { taken: 0, dropped: 0 },
    });
  });

  it("logs the first strike and then one a period with the count between; closes once the strikes run out, once", () => {
    const time = clock();
    const budget = new SocketBudget(frameBudgets({ strikes: { perSecond: 1, burst: 3 } }), time.now);
    expect(budget.strike("UNKNOWN_COMMAND")).toEqual({ close: false, log: { suppressed: 0 } });
    expect(budget.strike()).toEqual({ close: false, log: undefined });
    time.advance(REFUSAL_LOG_PERIOD_MS);
    // Refilled to 3 by the wait; the first after a period is logged with the one not logged before it.
    expect(budget.strike()).toEqual({ close: false, log: { suppressed: 1 } });
    expect([budget.strike(), budget.strike()]).toEqual(Array(2).fill({ close: false, log: undefined }));
    expect(budget.strike()).toEqual({ close: true, log: undefined });
    expect(budget.closed).toBe(true);
    expect(budget.strike()).toEqual({ close: false, log: undefined });
    expect(budget.summary().refused).toEqual({ UNKNOWN_COMMAND: 1 });
  });

  it("refuses a budget that is not a positive rate", () => {
    expect(frameBudgets(undefined)).toEqual(DEFAULT_FRAME_BUDGETS);
    expect(() => frameBudgets({ result: { perSecond: 0, burst: 10 } })).toThrow(/limits.agentFrames.result/);
    expect(() => frameBudgets({ strikes: { perSecond: 1, burst: 0.5 } })).toThrow(expect.objectContaining({ code: "INVALID_CONFIG" }));
  });
});
