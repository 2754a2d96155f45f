/** @jsxRuntime automatic @jsxImportSource hono/jsx */
// The parts every console page is built from (pages.tsx, operator-pages.tsx, approval-pages.tsx):
// values as the pages show them, the table, empty state and "more" link of a list, and the forms
// that post (each with the session's CSRF token in its hidden field csrf).
import type { Child, FC, PropsWithChildren } from "hono/jsx";

// ------------------------------------------------------------------ values

export const Time: FC<{ at: string | null }> = ({ at }) =>
  at ? <time datetime={at}>{at.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time> : <>–</>;

export const State: FC<{ state: string }> = ({ state }) => <span class={`state state-${state}`}>{state}</span>;

/** A value the API answered as JSON (an error, event data), shown compactly. */
export const Json: FC<{ value: unknown }> = ({ value }) =>
  value === null || value === undefined ? <>–</> : <code>{typeof value === "string" ? value : JSON.stringify(value)}</code>;

/** "1 machine", "3 machines". */
export const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

// ------------------------------------------------------------------ a page's parts

/** A section of a page, labelled by its heading. */
export const Section: FC<PropsWithChildren<{ id: string; title: Child }>> = ({ id, title, children }) => (
  <section aria-labelledby={id}>
    <h2 id={id}>{title}</h2>
    {children}
  </section>
);

/** What a list shows when it has nothing to list: that, and what to do about it. */
export const Empty: FC<PropsWithChildren> = ({ children }) => (
  <div class="empty">
    <p>{children}</p>
  </div>
);

/** A column's header; a wide one is left out on a phone. */
export type Column = string | { label: string; wide: true };

/**
 * A table (its rows are the children) in a labelled region keyboard users can focus and scroll
 * sideways on a phone. A column that is `false` is left out (one a role may not use).
 */
export const DataTable: FC<PropsWithChildren<{ label: string; caption: Child; columns: (Column | false)[] }>> = ({
  label,
  caption,
  columns,
  children,
}) => (
  <div class="table" role="region" aria-label={label} tabindex={0}>
    <table>
      <caption>{caption}</caption>
      <thead>
        <tr>
          {columns.map((column) =>
            column === false ? null : typeof column === "string" ? (
              <th scope="col">{column}</th>
            ) : (
              <th scope="col" class="wide">
                {column.label}
              </th>
            ),
          )}
        </tr>
      </thead>
      <tbody>{children}</tbody>
    </table>
  </div>
);

/** The link to a list's next page (id next-page, on every list). */
export const MorePage: FC<PropsWithChildren<{ href: string }>> = ({ href, children }) => (
  <p>
    <a id="next-page" href={href}>
      {children}
    </a>
  </p>
);

/** A list's filters (the children: labelled fields, each in a div): a search form that reloads the list, and a link that clears them. */
export const FilterForm: FC<PropsWithChildren<{ action: string; label: string }>> = ({ action, label, children }) => (
  <form class="filters panel" method="get" action={action} role="search" aria-label={label}>
    {children}
    <div>
      <button type="submit">Filter</button> <a href={action}>Clear</a>
    </div>
  </form>
);

// ------------------------------------------------------------------ forms that post

export const CsrfField: FC<{ csrf: string }> = ({ csrf }) => <input type="hidden" name="csrf" value={csrf} />;

/** A form of its fields (the children) and a submit button (<Submit>), posting with the CSRF token. */
export const PostForm: FC<PropsWithChildren<{ action: string; csrf: string; "aria-labelledby"?: string }>> = ({
  action,
  csrf,
  children,
  ...rest
}) => (
  <form class="stack panel" method="post" action={action} {...rest}>
    <CsrfField csrf={csrf} />
    {children}
  </form>
);

export const Submit: FC<PropsWithChildren<{ id?: string; class?: string }>> = ({ id, class: kind, children }) => (
  <div>
    <button id={id} type="submit" class={kind}>
      {children}
    </button>
  </div>
);

/** One button that posts (with the CSRF token and any fixed fields): an action that needs no more input. */
export const PostButton: FC<
  PropsWithChildren<{ action: string; csrf: string; id?: string; class?: string; label?: string; fields?: Record<string, string> }>
> = ({ action, csrf, id, class: kind, label, fields = {}, children }) => (
  <form class="inline" method="post" action={action}>
    <CsrfField csrf={csrf} />
    {Object.entries(fields).map(([name, value]) => (
      <input type="hidden" name={name} value={value} />
    ))}
    <button id={id} type="submit" class={kind} aria-label={label}>
      {children}
    </button>
  </form>
);

/** "Are you sure?" before a destructive action: only its button posts. */
export const Confirm: FC<{ text: Child; action: string; label: string; back: string; csrf: string }> = ({
  text,
  action,
  label,
  back,
  csrf,
}) => (
  <div class="panel">
    <p>{text}</p>
    <PostButton action={action} csrf={csrf} id="confirm" class="danger">
      {label}
    </PostButton>{" "}
    <a class="button secondary" href={back}>
      Cancel
    </a>
  </div>
);
