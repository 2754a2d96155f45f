// Drizzle view of the core tables. migrations/core/*.sql is the source of truth for their
// shape (it also defines compute_now()); this file gives the code typed queries over them.
import { sql } from "drizzle-orm";
import { bigserial, integer, jsonb, pgTable, text, timestamp, uuid } from "drizzle-orm/pg-core";

const computeNow = sql`compute_now()`;
const at = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });

export const events = pgTable("bc_events", {
  id: bigserial("id", { mode: "number" }).primaryKey(),
  eventId: uuid("event_id").notNull(),
  type: text("type").notNull(),
  module: text("module").notNull(),
  subject: text("subject"),
  data: jsonb("data").$type<Record<string, unknown>>().notNull(),
  actor: text("actor"),
  requestId: text("request_id"),
  occurredAt: at("occurred_at").notNull().default(computeNow),
});

export const workItems = pgTable("bc_work_items", {
  id: bigserial("id", { mode: "number" }).primaryKey(),
  queue: text("queue").notNull(),
  key: text("key").notNull(),
  module: text("module").notNull(),
  payload: jsonb("payload").$type<Record<string, unknown>>().notNull(),
  state: text("state", { enum: ["pending", "running", "done", "dead"] }).notNull(),
  attempts: integer("attempts").notNull(),
  runAt: at("run_at").notNull().default(computeNow),
  lastError: text("last_error"),
  createdAt: at("created_at").notNull().default(computeNow),
  updatedAt: at("updated_at").notNull().default(computeNow),
});

export const audit = pgTable("bc_audit", {
  id: bigserial("id", { mode: "number" }).primaryKey(),
  actor: text("actor").notNull(),
  action: text("action").notNull(),
  resource: text("resource").notNull(),
  method: text("method").notNull(),
  requestId: text("request_id").notNull(),
  at: at("at").notNull().default(computeNow),
});

export const apiKeys = pgTable("bc_api_keys", {
  id: text("id").primaryKey(),
  name: text("name").notNull(),
  secretSha256: text("secret_sha256").notNull(),
  roles: text("roles").array().notNull(),
  createdBy: text("created_by").notNull(),
  createdAt: at("created_at").notNull().default(computeNow),
  revokedAt: at("revoked_at"),
});

export const secrets = pgTable("bc_secrets", {
  id: text("id").primaryKey(),
  module: text("module").notNull(),
  name: text("name").notNull(),
  sealed: text("sealed").notNull(),
  createdAt: at("created_at").notNull().default(computeNow),
});
