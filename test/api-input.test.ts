// The API refuses bad input cleanly, everywhere: every POST method of /openapi.json, on the
// default deployment's modules (better-compute.config.ts) plus a third-party plugin, is sent
// unknown keys, wrong types, control characters in every string and key, 100- and 2,000-deep
// nesting, 10,000-character strings and no body. Every answer is a 4xx JSON error with its
// request id; none is a 5xx, none echoes more than 200 characters of what was sent. The cases
// are derived from the OpenAPI document, so a plugin's methods are covered without a line here.
import { env } from "cloudflare:workers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { betterCompute } from "better-compute";
import { createTestClient, type TestClient } from "better-compute/testing";
import { compute as defaultDeployment } from "../better-compute.config.ts";
import { acmeRacks } from "./extensions/acme-racks/plugin.ts";

const compute = betterCompute({ ...defaultDeployment.options, plugins: [...(defaultDeployment.options.plugins ?? []), acmeRacks] });
let client: TestClient;
beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

// ---------------------------------------------------------------- bodies from the schema

interface JsonSchema {
  type?: string | string[];
  properties?: Record<string, JsonSchema>;
  required?: string[];
  additionalProperties?: JsonSchema | boolean;
  items?: JsonSchema;
  enum?: unknown[];
  const?: unknown;
  anyOf?: JsonSchema[];
  oneOf?: JsonSchema[];
  minimum?: number;
  exclusiveMinimum?: number;
  minItems?: number;
}

type Path = (string | number)[];

/** A body the schema plausibly takes: every declared property, a record with one entry, an array with one item. */
function sample(schema: JsonSchema): unknown {
  if (schema.const !== undefined) return schema.const;
  if (schema.enum) return schema.enum[0];
  const option = schema.anyOf?.[0] ?? schema.oneOf?.[0];
  if (option) return sample(option);
  const type = Array.isArray(schema.type) ? schema.type[0] : schema.type;
  if (type === "object") {
    if (schema.properties) return Object.fromEntries(Object.entries(schema.properties).map(([key, property]) => [key, sample(property)]));
    return { entry: sample(typeof schema.additionalProperties === "object" ? schema.additionalProperties : { type: "string" }) };
  }
  if (type === "array") return Array.from({ length: Math.max(1, schema.minItems ?? 1) }, () => sample(schema.items ?? { type: "string" }));
  if (type === "integer" || type === "number")
    return schema.minimum ?? (schema.exclusiveMinimum !== undefined ? schema.exclusiveMinimum + 1 : 1);
  if (type === "boolean") return false;
  return "x";
}

/** Every place in a sample body (the root excluded), with the schema that describes it. */
function places(value: unknown, schema: JsonSchema, path: Path = []): { path: Path; value: unknown; schema: JsonSchema }[] {
  const here = path.length ? [{ path, value, schema }] : [];
  if (Array.isArray(value)) return [...here, ...value.flatMap((item, i) => places(item, schema.items ?? {}, [...path, i]))];
  if (value !== null && typeof value === "object") {
    const of = (key: string) =>
      schema.properties?.[key] ?? (typeof schema.additionalProperties === "object" ? schema.additionalProperties : {});
    return [...here, ...Object.entries(value).flatMap(([key, item]) => places(item, of(key), [...path, key]))];
  }
  return here;
}

/** A copy of the body with the value at `path` replaced (or, with `renameTo`, its key renamed). */
function edited(body: unknown, path: Path, replace: (value: unknown) => unknown, renameTo?: string): unknown {
  const copy = structuredClone(body) as Record<string | number, unknown>;
  const parent = path.slice(0, -1).reduce<Record<string | number, unknown>>((at, key) => at[key] as Record<string | number, unknown>, copy);
  const last = path[path.length - 1]!;
  if (renameTo === undefined) parent[last] = replace(parent[last]);
  else {
    parent[renameTo] = parent[last];
    delete parent[last];
  }
  return copy;
}

const wrongType = (value: unknown): unknown =>
  typeof value === "string"
    ? 12345
    : typeof value === "number"
      ? "12"
      : typeof value === "boolean"
        ? "yes"
        : Array.isArray(value)
          ? { "0": "x" }
          : "x";

/** 10,000 characters that never repeat a 201-character run, so any echo of 201 is this string's. */
const LONG = Array.from(crypto.getRandomValues(new Uint8Array(5000)), (b) => b.toString(16).padStart(2, "0")).join("");
const CONTROL_CHARACTERS = ["\u0000", "\u0001", "\u001b", "\u007f"];
const deep = (levels: number, open = "[", close = "]") => open.repeat(levels) + close.repeat(levels);

/** The malformed bodies for one method: [what, body text]. */
function malformed(schema: JsonSchema): [string, string][] {
  const base = sample(schema) as Record<string, unknown>;
  const where = places(base, schema);
  const json = (value: unknown) => JSON.stringify(value);
  const cases: [string, string][] = [
    ["an unknown key", json({ ...base, unknownKey: 1 })],
    ["an unknown 10,000-character key", json({ ...base, [LONG]: 1 })],
    ...where
      .filter((p) => p.schema.additionalProperties === false)
      .map((p): [string, string] => [
        `an unknown key in ${p.path.join(".")}`,
        json(edited(base, p.path, (v) => ({ ...(v as object), unknownKey: 1 }))),
      ]),
    ...["x", 42, null, [], [base]].map((root): [string, string] => [`a body of the wrong type (${json(root)})`, json(root)]),
    ...where.map((p): [string, string] => [`a wrong type at ${p.path.join(".")}`, json(edited(base, p.path, wrongType))]),
    ...where
      .filter((p) => typeof p.value === "string")
      .flatMap((p) => [
        ...CONTROL_CHARACTERS.map((ch): [string, string] => [
          `${json(ch)} in ${p.path.join(".")}`,
          json(edited(base, p.path, (v) => `${v as string}${ch}tail`)),
        ]),
        [`a 10,000-character ${p.path.join(".")}`, json(edited(base, p.path, () => LONG))] as [string, string],
      ]),
    ...where
      .filter((p) => typeof p.path[p.path.length - 1] === "string")
      .map((p): [string, string] => [
        `NUL in the key ${p.path.join(".")}`,
        json(edited(base, p.path, (v) => v, `${String(p.path[p.path.length - 1])}\u0000`)),
      ]),
    ["100-deep nesting", `{"nested":${deep(100)}}`],
    ["2,000-deep nesting", `{"nested":${deep(2000)}}`],
    ["a 2,000-deep body of objects", deep(2000, '{"a":', "}").replace(/:}/, ":1}")],
  ];
  return cases;
}

/** Whether the answer repeats a run of more than 200 characters of what was sent. */
function echoes(sent: string, answer: string): boolean {
  for (let i = 0; i + 201 <= sent.length; i++) if (answer.includes(sent.slice(i, i + 201))) return true;
  return false;
}

const doc = (await (await compute.fetch(new Request("http://bc.test/openapi.json"), env)).json()) as {
  paths: Record<string, { post?: { requestBody: { required: boolean; content: { "application/json": { schema: JsonSchema } } } } }>;
};
const postMethods = Object.entries(doc.paths)
  .filter(([, item]) => item.post)
  .map(([path, item]) => ({ path, requestBody: item.post!.requestBody }));

// ---------------------------------------------------------------- the sweep

describe("every POST method of /openapi.json refuses malformed input cleanly", () => {
  it("covers the default modules and the third-party plugin", () => {
    const names = postMethods.map((m) => m.path);
    for (const path of [
      "/v1/iam.apiKeys.create",
      "/v1/nodes.get",
      "/v1/workflows.start",
      "/v1/metal.enroll",
      "/v1/racks.create",
      "/v1/racks.get",
    ])
      expect(names).toContain(path);
  });

  it.each(postMethods)(
    "$path",
    async ({ path, requestBody }) => {
      const schema = requestBody.content["application/json"].schema;
      const problems: string[] = [];
      const send = async (what: string, body: string | undefined) => {
        const headers: Record<string, string> = { authorization: `Bearer ${client.key}` };
        if (body !== undefined) headers["content-type"] = "application/json";
        const res = await client.request(path, { method: "POST", headers, body });
        const text = await res.text();
        const problem = (why: string) => problems.push(`${what}: ${why} (${res.status} ${text.slice(0, 300)})`);
        let parsed: { code?: unknown; requestId?: unknown } | undefined;
        try {
          parsed = JSON.parse(text);
        } catch {
          problem("the answer is not JSON");
        }
        if (res.status >= 500) problem("a server error");
        else if (res.status < 400 && (body !== undefined || requestBody.required)) problem("accepted");
        else if (res.status >= 400 && (typeof parsed?.code !== "string" || parsed.requestId !== res.headers.get("x-request-id")))
          problem("no JSON code and request id");
        if (body !== undefined && echoes(body, text)) problem("echoes more than 200 characters of the input");
      };

      for (const [what, body] of malformed(schema)) await send(what, body);
      // No body: refused when the input requires a field, served as {} when it does not.
      await send("no body", undefined);
      expect(requestBody.required).toBe((schema.required ?? []).length > 0);
      expect(problems).toEqual([]);
    },
    120_000,
  );
});

// ---------------------------------------------------------------- what the sweep relies on, spelled out

describe("the input rules", () => {
  const call = (name: string, body: string) =>
    client.request(`/v1/${name}`, {
      method: "POST",
      headers: { authorization: `Bearer ${client.key}`, "content-type": "application/json" },
      body,
    });

  it("names an unknown key with its path, nested or at the root, and writes nothing", async () => {
    const res = await call(
      "racks.create",
      JSON.stringify({ id: "r-strict", site: "lab", slots: 2, position: { row: "a", column: 1, colum: 2 }, color: "red" }),
    );
    expect(res.status).toBe(400);
    const body = (await res.json()) as any;
    expect(body.code).toBe("INVALID_ARGUMENT");
    expect(body.details.issues.map((i: any) => i.path).sort()).toEqual(["color", "position.colum"]);
    expect(body.message).toContain("position.colum");
    expect((await client.call("racks.get", { id: "r-strict" })).status).toBe(404);
  });

  it("keeps the keys of records (labels) and serves a body without unknown keys", async () => {
    const created = await client.call("racks.create", {
      id: "r-labels",
      site: "lab",
      slots: 2,
      position: { row: "a", column: 1 },
      labels: { "acme.dev/aisle": "3" },
    });
    expect(created.status).toBe(200);
    expect((await client.call("racks.get", { id: "r-labels" })).body.labels).toEqual({ "acme.dev/aisle": "3" });
  });

  it("refuses NUL in an id with 400 naming the field, where Postgres would have failed the call", async () => {
    for (const [name, field] of [
      ["nodes.get", "node"],
      ["workflows.get", "id"],
      ["racks.get", "id"],
    ] as const) {
      const res = await call(name, JSON.stringify({ [field]: "n-\u0000" }));
      expect(res.status).toBe(400);
      expect((await res.json()) as any).toMatchObject({
        code: "INVALID_ARGUMENT",
        details: { issues: [{ path: field, code: "control_character" }] },
      });
    }
  });

  it("takes tabs and newlines in strings", async () => {
    const res = await call(
      "racks.create",
      JSON.stringify({
        id: "r-text",
        site: "lab",
        slots: 1,
        position: { row: "a\tb", column: 0 },
        labels: { note: "line one\r\nline two" },
      }),
    );
    expect(res.status).toBe(200);
  });

  it("refuses nesting deeper than 32 levels before parsing, and takes 32", async () => {
    const at = (levels: number) => call("joinTokens.create", `{"role":"node","labels":{},"x":${deep(levels - 1)}}`);
    const refused = await at(33);
    expect(refused.status).toBe(400);
    expect(((await refused.json()) as any).message).toMatch(/nests deeper than 32 levels/);
    // 32 levels pass the depth rule; the key is then unknown.
    expect(((await (await at(32)).json()) as any).details.issues).toEqual([
      { path: "x", message: "unknown key", code: "unrecognized_keys" },
    ]);
  });

  it("never quotes a long input whole, even where a plugin's handler does", async () => {
    const res = await call("racks.get", JSON.stringify({ id: LONG }));
    expect(res.status).toBe(404);
    const body = (await res.json()) as any;
    expect(body.message).toBe(`rack ${LONG.slice(0, 64)}…(10000 characters) does not exist`);
    expect(body.details.id).toBe(`${LONG.slice(0, 64)}…(10000 characters)`);
  });

  it("serves a method whose input requires nothing without a body (README's curl)", async () => {
    const res = await client.request("/v1/modules.list", { method: "POST", headers: { authorization: `Bearer ${client.key}` } });
    expect(res.status).toBe(200);
  });
});
