// What the everyday methods over a module's records share (better-compute/core): read one by its
// id (NOT_FOUND when there is none), list them, delete one once nothing uses it, and create one
// idempotently: the same fields again writes nothing (created: false), other fields are a CONFLICT
// naming them, never their values. The define* helpers build on defineMethod: what they declare is a
// method like any other (its action defaults to its name).
import { sql, type SQL } from "drizzle-orm";
import { z } from "zod";
import { defineMethod, type MethodDefinition } from "./contracts.ts";
import type { EventInput, EventsPort, MethodContext } from "./context.ts";
import { conflict, notFound } from "./errors.ts";
import { canonicalJson } from "./protocol.ts";
import { resourceId } from "./schemas.ts";
import { one, type Tx } from "./store/database.ts";

// ---------------------------------------------------------------- reading

/**
 * A read-only method answering one record by its id: what `find` answers, or NOT_FOUND
 * ("<what> <id> does not exist") when it answers undefined. Its input is the id under `key`
 * ("id" unless named); IAM checks its action against `<collection>/<id>`.
 */
export function defineGetMethod<O extends z.ZodType, K extends string = "id">(def: {
  name: string;
  /** What the id names, as NOT_FOUND says it: "pool" → "pool p-1 does not exist". */
  what: string;
  /** The records' resource path: "vps/pools" checks the action against vps/pools/<id>. */
  collection: string;
  key?: K;
  description?: string;
  output: O;
  /** The record of that id as `output` shows it, or undefined; ctx when what the caller may see depends on it. */
  find: (tx: Tx, id: string, ctx: MethodContext) => Promise<z.input<O> | undefined>;
}): MethodDefinition<z.ZodObject<Record<K, typeof resourceId>>, O> {
  const key = (def.key ?? "id") as K;
  return defineMethod({
    name: def.name,
    readOnly: true,
    resource: (input) => `${def.collection}/${(input as Record<K, string>)[key]}`,
    description: def.description,
    input: z.object({ [key]: resourceId } as Record<K, typeof resourceId>),
    output: def.output,
    handler: async (ctx, input, tx) => {
      const id = (input as Record<K, string>)[key];
      const found = await def.find(tx, id, ctx);
      if (found === undefined) throw notFound(`${def.what} ${id} does not exist`);
      return found;
    },
  });
}

/**
 * A read-only method answering the records `find` lists, under one key: `items: { sites: site }`
 * answers `{ sites: [...] }`. `input` holds its filters (none unless given).
 */
export function defineListMethod<K extends string, T extends z.ZodType, I extends z.ZodType = z.ZodObject<{}>>(def: {
  name: string;
  description?: string;
  input?: I;
  items: Record<K, T>;
  find: (tx: Tx, input: z.output<I>, ctx: MethodContext) => Promise<z.input<T>[]>;
}): MethodDefinition<I, z.ZodObject<Record<K, z.ZodArray<T>>>> {
  const [key, item] = Object.entries(def.items)[0] as [K, T];
  const output = z.object({ [key]: z.array(item) } as Record<K, z.ZodArray<T>>);
  return defineMethod<I, typeof output>({
    name: def.name,
    readOnly: true,
    description: def.description,
    input: (def.input ?? z.object({})) as I,
    output,
    handler: async (ctx, input, tx) => ({ [key]: await def.find(tx, input, ctx) }) as z.input<typeof output>,
  });
}

// ---------------------------------------------------------------- deleting

/**
 * A method deleting one record by its id, once nothing uses it: the row of `table` (its key
 * column `id`) is locked (NOT_FOUND "<what> <id> does not exist" when there is none), `refuse`
 * throws while something still uses it, then the row is deleted and `event` published on
 * `<collection>/<id>`, the resource IAM checks the action against. Answers `{ id, deleted: true }`.
 */
export function defineDeleteMethod(def: {
  name: string;
  what: string;
  collection: string;
  description: string;
  table: string;
  event: string;
  refuse?: (tx: Tx, id: string, ctx: MethodContext) => Promise<void>;
}) {
  const table = sql.identifier(def.table);
  return defineMethod({
    name: def.name,
    resource: (input) => `${def.collection}/${input.id}`,
    description: def.description,
    input: z.object({ id: resourceId }),
    output: z.object({ id: z.string(), deleted: z.literal(true) }),
    handler: async (ctx, input, tx) => {
      const found = await tx.execute(sql`SELECT 1 FROM ${table} WHERE id = ${input.id} FOR UPDATE`);
      if (found.rows.length === 0) throw notFound(`${def.what} ${input.id} does not exist`);
      await def.refuse?.(tx, input.id, ctx);
      await tx.execute(sql`DELETE FROM ${table} WHERE id = ${input.id}`);
      await ctx.events.publish(tx, { type: def.event, subject: `${def.collection}/${input.id}` });
      return { id: input.id, deleted: true as const };
    },
  });
}

// ---------------------------------------------------------------- idempotent create

/** The fields whose values differ, sorted (nested objects by their keys: "config.region"). */
export function differingFields(stored: Record<string, unknown>, wanted: Record<string, unknown>, prefix = ""): string[] {
  const fields: string[] = [];
  for (const key of [...new Set([...Object.keys(stored), ...Object.keys(wanted)])].sort()) {
    const [a, b] = [stored[key] ?? null, wanted[key] ?? null];
    if (canonicalJson(a) === canonicalJson(b)) continue;
    const nested = (v: unknown) => typeof v === "object" && v !== null && !Array.isArray(v);
    if (nested(a) && nested(b))
      fields.push(...differingFields(a as Record<string, unknown>, b as Record<string, unknown>, `${prefix}${key}.`));
    else fields.push(`${prefix}${key}`);
  }
  return fields;
}

/** Create of something that exists: the same fields is idempotent, other fields a CONFLICT naming them (never their values). */
export function refuseOtherFields(what: string, id: string, stored: Record<string, unknown>, wanted: Record<string, unknown>): void {
  const fields = differingFields(stored, wanted);
  if (fields.length > 0) throw conflict(`${what} ${id} exists with other fields: ${fields.join(", ")}`, { [what]: id, fields });
}

/** What an idempotent create writes (createOnce). */
export interface CreateOnce {
  /** An INSERT ... ON CONFLICT DO NOTHING RETURNING: it writes nothing when the id is taken. */
  insert: SQL;
  /** Selects the stored record's fields a create compares, by the names `wanted` gives them. */
  stored: SQL;
  wanted: Record<string, unknown>;
  /** Published when it created the record. */
  event: EventInput;
}

/**
 * An idempotent create of the `what` of that id: the record is inserted and its event published,
 * or, when the id is taken, what is stored must have the wanted fields (refuseOtherFields) and
 * nothing is written. Answers whether it created the record.
 */
export async function createOnce(ctx: { events: EventsPort }, tx: Tx, what: string, id: string, create: CreateOnce): Promise<boolean> {
  if ((await tx.execute(create.insert)).rows.length === 0) {
    refuseOtherFields(what, id, (await one(tx, create.stored))!, create.wanted);
    return false;
  }
  await ctx.events.publish(tx, create.event);
  return true;
}
