// Two third-party modules, written as outside packages would write them (public entry
// points only), registered with betterCompute() and served by the platform.
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { betterCompute, definePlugin } from "better-compute";
import { defineMethod, notFound } from "better-compute/core";
import { createTestClient, type TestClient } from "better-compute/testing";

// ---------------------------------------------------------------- @acme/bc-widgets

const widget = z.object({ id: z.string(), name: z.string(), color: z.string() });

const widgetsCreate = defineMethod({
  name: "widgets.create",
  resource: (input) => `widgets/${input.id}`,
  input: z.object({ id: z.string().regex(/^[a-z0-9-]+$/), name: z.string().min(1), color: z.enum(["red", "blue"]) }),
  output: widget,
  handler: async (ctx, input, tx) => {
    await tx.execute(sql`INSERT INTO acme_widgets (id, name, color) VALUES (${input.id}, ${input.name}, ${input.color})`);
    await ctx.events.publish(tx, { type: "widget.created", subject: `widgets/${input.id}`, data: { color: input.color } });
    await ctx.work.enqueue(tx, { queue: "acme-widgets.paint", key: input.id });
    return input;
  },
});

const widgetsGet = defineMethod({
  name: "widgets.get",
  readOnly: true,
  resource: (input) => `widgets/${input.id}`,
  input: z.object({ id: z.string() }),
  output: widget,
  handler: async (_ctx, input, tx) => {
    const result = await tx.execute(sql`SELECT id, name, color FROM acme_widgets WHERE id = ${input.id}`);
    const row = result.rows[0] as z.infer<typeof widget> | undefined;
    if (!row) throw notFound(`widget ${input.id} does not exist`);
    return row;
  },
});

/** Writes its state and its event, then fails: the platform must keep neither. */
const widgetsExplode = defineMethod({
  name: "widgets.explode",
  action: "widgets.create",
  input: z.object({ id: z.string() }),
  output: z.object({}),
  handler: async (ctx, input, tx) => {
    await tx.execute(sql`INSERT INTO acme_widgets (id, name, color) VALUES (${input.id}, 'doomed', 'red')`);
    await ctx.events.publish(tx, { type: "widget.created", subject: `widgets/${input.id}` });
    throw new Error("the paint shop caught fire");
  },
});

/** Takes a secret by value once, keeps only its reference. */
const widgetsSetPassword = defineMethod({
  name: "widgets.setPassword",
  action: "widgets.create",
  resource: (input) => `widgets/${input.id}`,
  input: z.object({ id: z.string(), password: z.string().min(8) }),
  output: z.object({ ref: z.string() }),
  handler: async (ctx, input, tx) => {
    const ref = await ctx.secrets.put(tx, { module: ctx.moduleId, name: `widgets/${input.id}/password`, value: input.password });
    await tx.execute(sql`UPDATE acme_widgets SET password_ref = ${ref} WHERE id = ${input.id}`);
    await ctx.events.publish(tx, { type: "widget.passwordSet", subject: `widgets/${input.id}`, data: { ref } });
    return { ref };
  },
});

const acmeWidgets = definePlugin({
  id: "acme-widgets",
  version: "1.2.0",
  iam: {
    actions: { "widgets.create": "Create widgets", "widgets.get": "Read widgets" },
    roles: { "widgets.editor": ["widgets.*"] },
  },
  migrations: [
    {
      name: "acme-widgets/0001_widgets",
      sql: `CREATE TABLE IF NOT EXISTS acme_widgets (
              id text PRIMARY KEY, name text NOT NULL, color text NOT NULL, password_ref text,
              created_at timestamptz NOT NULL DEFAULT compute_now());`,
    },
  ],
  api: [widgetsCreate, widgetsGet, widgetsExplode, widgetsSetPassword],
});

// ---------------------------------------------------------------- @acme/bc-notes

const notesAttach = defineMethod({
  name: "notes.attach",
  action: "notes.write",
  resource: (input) => `notes/${input.widgetId}`,
  input: z.object({ widgetId: z.string(), text: z.string().max(200) }),
  output: z.object({ id: z.number() }),
  // A composite: attaching a note reads the widget, so the caller must also hold widgets.get.
  // Decided here, before the transaction opens.
  admission: (ctx, input) => ctx.check("widgets.get", `widgets/${input.widgetId}`),
  handler: async (ctx, input, tx) => {
    const result = await tx.execute(sql`INSERT INTO acme_notes (widget_id, text) VALUES (${input.widgetId}, ${input.text}) RETURNING id`);
    const id = Number((result.rows[0] as { id: number }).id);
    await ctx.events.publish(tx, { type: "note.attached", subject: `widgets/${input.widgetId}`, data: { note: id } });
    return { id };
  },
});

/** Breaks rule 2 on purpose: an IAM check awaited inside the transaction. */
const notesSloppy = defineMethod({
  name: "notes.sloppy",
  action: "notes.write",
  input: z.object({ widgetId: z.string() }),
  output: z.object({}),
  handler: async (ctx, input, tx) => {
    await tx.execute(sql`INSERT INTO acme_notes (widget_id, text) VALUES (${input.widgetId}, 'sloppy')`);
    await ctx.check("widgets.get", `widgets/${input.widgetId}`);
    return {};
  },
});

const acmeNotes = definePlugin({
  id: "acme-notes",
  iam: { actions: { "notes.write": "Attach notes to widgets" }, roles: { "notes.writer": ["notes.*"] } },
  migrations: [
    {
      name: "acme-notes/0001_notes",
      sql: `CREATE TABLE IF NOT EXISTS acme_notes (id serial PRIMARY KEY, widget_id text NOT NULL, text text NOT NULL);`,
    },
  ],
  api: [notesAttach, notesSloppy],
});

// ---------------------------------------------------------------- the deployment

const compute = betterCompute({ plugins: [acmeWidgets, acmeNotes] });
let client: TestClient;
const uid = () => crypto.randomUUID().slice(0, 8);

beforeAll(async () => {
  client = await createTestClient(compute, env);
});
afterAll(() => client?.close());

describe("a deployment with two third-party plugins", () => {
  it("lists both plugins and serves their methods", async () => {
    const modules = await client.call("modules.list");
    expect(modules.body.modules).toEqual(
      expect.arrayContaining([
        {
          id: "acme-widgets",
          version: "1.2.0",
          kind: "plugin",
          methods: ["widgets.create", "widgets.get", "widgets.explode", "widgets.setPassword"],
        },
        { id: "acme-notes", version: "1", kind: "plugin", methods: ["notes.attach", "notes.sloppy"] },
      ]),
    );
    const id = `w-${uid()}`;
    const created = await client.call("widgets.create", { id, name: "Sprocket", color: "blue" });
    expect(created).toMatchObject({ status: 200, body: { id, name: "Sprocket", color: "blue" } });
    expect((await client.call("widgets.get", { id })).body).toEqual({ id, name: "Sprocket", color: "blue" });
    const note = await client.call("notes.attach", { widgetId: id, text: "needs oil" });
    expect(note.status).toBe(200);

    const events = await client.store.db.execute(sql`SELECT type, module FROM bc_events WHERE subject = ${`widgets/${id}`} ORDER BY id`);
    expect(events.rows).toEqual([
      { type: "widget.created", module: "acme-widgets" },
      { type: "note.attached", module: "acme-notes" },
    ]);
    const work = await client.store.db.execute(
      sql`SELECT module, state FROM bc_work_items WHERE queue = 'acme-widgets.paint' AND key = ${id}`,
    );
    expect(work.rows).toEqual([{ module: "acme-widgets", state: "pending" }]);
  });

  it("serves a plugin's typed errors and schema refusals", async () => {
    expect(await client.call("widgets.get", { id: "nope" })).toMatchObject({ status: 404, body: { code: "NOT_FOUND" } });
    const bad = await client.call("widgets.create", { id: "UPPER", name: "x", color: "green" });
    expect(bad.status).toBe(400);
    expect(bad.body.details.issues.map((i: any) => i.path).sort()).toEqual(["color", "id"]);
  });

  it("keeps neither state nor event of a handler that throws after writing both", async () => {
    const id = `doomed-${uid()}`;
    const res = await client.call("widgets.explode", { id });
    expect(res.status).toBe(500);
    expect(res.body).toEqual({ code: "INTERNAL", message: "internal error", requestId: res.headers.get("x-request-id") });
    const state = await client.store.db.execute(sql`SELECT 1 FROM acme_widgets WHERE id = ${id}`);
    const events = await client.store.db.execute(sql`SELECT 1 FROM bc_events WHERE subject = ${`widgets/${id}`}`);
    const audit = await client.store.db.execute(sql`SELECT 1 FROM bc_audit WHERE request_id = ${res.headers.get("x-request-id")}`);
    expect([state.rows.length, events.rows.length, audit.rows.length]).toEqual([0, 0, 0]);
  });

  it("grants a plugin's roles over its own actions only", async () => {
    const editor = await client.mintKey(["widgets.editor"]);
    const id = `w-${uid()}`;
    expect((await client.call("widgets.create", { id, name: "A", color: "red" }, { key: editor })).status).toBe(200);
    expect((await client.call("notes.attach", { widgetId: id, text: "x" }, { key: editor })).status).toBe(403);
  });

  it("decides a composite method's sub-call before its transaction opens", async () => {
    const id = `w-${uid()}`;
    await client.call("widgets.create", { id, name: "B", color: "red" });
    const writerOnly = await client.mintKey(["notes.writer"]);
    const refused = await client.call("notes.attach", { widgetId: id, text: "x" }, { key: writerOnly });
    expect(refused.status).toBe(403);
    expect(refused.body.details).toEqual({ action: "widgets.get", resource: `widgets/${id}` });
    const both = await client.mintKey(["notes.writer", "widgets.editor"]);
    expect((await client.call("notes.attach", { widgetId: id, text: "x" }, { key: both })).status).toBe(200);
  });

  it("refuses an IAM check awaited inside a transaction, and rolls it back", async () => {
    const id = `w-${uid()}`;
    const res = await client.call("notes.sloppy", { widgetId: id });
    expect(res.status).toBe(500);
    const notes = await client.store.db.execute(sql`SELECT 1 FROM acme_notes WHERE widget_id = ${id}`);
    expect(notes.rows).toHaveLength(0);
  });

  it("keeps a secret only by reference in rows, events and audit, and resolves it for its consumer", async () => {
    const id = `w-${uid()}`;
    const password = `pw-${crypto.randomUUID()}`;
    await client.call("widgets.create", { id, name: "Safe", color: "red" });
    const res = await client.call("widgets.setPassword", { id, password });
    expect(res.status).toBe(200);
    expect(res.body.ref).toMatch(/^secret:\/\//);
    const everywhere = await client.store.db.execute(sql`
      SELECT (SELECT json_agg(w) FROM acme_widgets w WHERE id = ${id}) AS widget,
             (SELECT json_agg(e) FROM bc_events e WHERE subject = ${`widgets/${id}`}) AS events,
             (SELECT json_agg(a) FROM bc_audit a WHERE resource = ${`widgets/${id}`}) AS audit,
             (SELECT json_agg(s) FROM bc_secrets s WHERE name = ${`widgets/${id}/password`}) AS sealed`);
    const dump = JSON.stringify(everywhere.rows);
    expect(dump).toContain(res.body.ref);
    expect(dump).not.toContain(password);
    const ctx = compute.moduleContext("acme-widgets", env, client.store);
    expect(await ctx.secrets.resolve(res.body.ref)).toBe(password);
  });

  it("applies the plugins' migrations once", async () => {
    const again = await compute.applyModuleMigrations(client.store);
    expect(again.applied).toEqual([]);
    expect(again.skipped).toEqual(["acme-widgets/0001_widgets", "acme-notes/0001_notes"]);
  });
});
