// Paged listings (better-compute/core): how many a page holds, what its next is, and the two ways
// a listing pages over rows. The record (events.list, audit.list) pages in commit order, either
// way, after a position; joinTokens.list and workflows.list page newest first, after a row's id.
import { sql, type SQL } from "drizzle-orm";
import { z } from "zod";
import { notFound } from "./errors.ts";
import { rows, type Tx } from "./store/database.ts";

/** How many a page holds: 1 to 500, 100 unless asked. */
export const pageLimit = z.number().int().min(1).max(500).default(100);

/** A page's next: its last item's cursor when the page is full, null on the last page. */
export function nextCursor<T>(page: readonly T[], limit: number, cursor: (item: T) => string): string | null {
  return page.length === limit ? cursor(page.at(-1)!) : null;
}

/**
 * The input fields of a listing of the record in commit order: after (the previous page's next, a
 * position in digits; `afterIs` says what it names), order (asc unless desc) and limit.
 */
export function recordPageInput(afterIs: string) {
  return {
    after: z
      .string()
      .regex(/^\d{1,18}$/, afterIs)
      .optional(),
    order: z.enum(["asc", "desc"]).default("asc"),
    limit: pageLimit,
  };
}

/**
 * A page of the record by `position` (a bigint column), after the cursor in the page's order: the
 * condition for WHERE, and its ORDER BY ... LIMIT.
 */
export function recordPage(position: SQL, page: { after?: string; order: "asc" | "desc"; limit: number }): { after: SQL; orderLimit: SQL } {
  const after = page.after ?? null;
  const newestFirst = page.order === "desc";
  return {
    after: sql`(${after}::bigint IS NULL OR ${newestFirst ? sql`${position} < ${after}::bigint` : sql`${position} > ${after}::bigint`})`,
    orderLimit: sql`ORDER BY ${position} ${newestFirst ? sql`DESC` : sql`ASC`} LIMIT ${page.limit}`,
  };
}

/**
 * A page newest first, by (created_at, id): the rows of `from` that `where` keeps, older than the
 * row of `table` whose id is `after` (NOT_FOUND, saying `missing`, when there is none), at most `limit`.
 */
export async function newestFirst(
  tx: Tx,
  query: { from: SQL; table: string; where: SQL; missing: string },
  page: { after?: string; limit: number },
): Promise<Record<string, any>[]> {
  const table = sql.identifier(query.table);
  if (page.after && (await tx.execute(sql`SELECT 1 FROM ${table} WHERE id = ${page.after}`)).rows.length === 0)
    throw notFound(query.missing);
  return rows<Record<string, any>>(
    tx,
    sql`
    SELECT * FROM ${query.from}
    WHERE ${query.where}
      AND (${page.after ?? null}::text IS NULL OR (created_at, id) < (SELECT created_at, id FROM ${table} WHERE id = ${page.after ?? null}))
    ORDER BY created_at DESC, id DESC LIMIT ${page.limit}`,
  );
}
