// The console's two static files, served from routes (/console/app.js, /console/app.css): the
// Content-Security-Policy allows no inline script or style, and the Worker bundle has no file
// system to read them from. The script is plain browser JavaScript, written by hand, with no
// build step; the pages work without it (forms post and redirect), it only keeps them live.

/**
 * Live updates: one EventSource on /console/events (the session cookie authenticates it; after a
 * drop the browser reconnects with Last-Event-ID and the stream resumes there). When an event's
 * subject is one the page's #live region shows (data-subjects), the region is fetched again
 * (?part=live) and swapped in; not while a field in it is being edited, and focus stays on the
 * control that had it.
 */
export const CLIENT_JS = `"use strict";
(() => {
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  if (!live) return;
  // "*": every event; "a/b/": every subject under it; "a/b/c": that subject.
  const subjects = (live.dataset.subjects || "").split(" ");
  const wants = (s) => subjects.some((p) => p === "*" || (p.endsWith("/") ? (s || "").startsWith(p) : s === p));
  const say = (text) => { if (status) status.textContent = text; };
  // Not while the user is in a field of the region or has changed one: their input would be lost.
  const editing = () => {
    const a = document.activeElement;
    if (a && live.contains(a) && /^(INPUT|TEXTAREA|SELECT)$/.test(a.tagName)) return true;
    for (const el of live.querySelectorAll("input, textarea")) if (el.type !== "hidden" && el.value !== el.defaultValue) return true;
    for (const el of live.querySelectorAll("select")) {
      const initial = Math.max(0, [...el.options].findIndex((o) => o.defaultSelected));
      if (el.selectedIndex !== initial) return true;
    }
    return false;
  };
  let timer, busy = false, pending = false;
  const schedule = () => { clearTimeout(timer); timer = setTimeout(refresh, 150); };
  async function refresh() {
    if (busy || editing()) { pending = true; if (!busy) say("Updates paused while you edit"); return; }
    busy = true; pending = false;
    try {
      const url = new URL(location.href);
      url.searchParams.set("part", "live");
      const res = await fetch(url, { credentials: "same-origin" });
      if (res.status === 401) return location.assign("/console/sign-in");
      const html = await res.text();
      if (!res.ok) return say("Could not update (" + res.status + ", request " + res.headers.get("x-request-id") + ")");
      // The user may have started editing while the fetch was under way.
      if (editing()) { pending = true; return say("Updates paused while you edit"); }
      const focused = live.contains(document.activeElement) ? document.activeElement.id : "";
      live.innerHTML = html;
      if (focused) document.getElementById(focused)?.focus();
      say("Live, updated " + new Date().toLocaleTimeString());
    } catch {
      say("Could not update: the console is unreachable");
    } finally {
      busy = false;
      if (pending) schedule();
    }
  }
  live.addEventListener("focusout", () => { if (pending) schedule(); });
  // A page without events to follow (a tenant's, a serial console) is read again every data-poll ms.
  if (live.dataset.poll) { say("Live"); setInterval(schedule, +live.dataset.poll); }
  if (!live.dataset.subjects || !window.EventSource) return;
  const source = new EventSource("/console/events");
  // Sent first on every connection: catch up on what happened since the page was rendered.
  source.addEventListener("ready", () => { say("Live"); schedule(); });
  source.onmessage = (e) => { if (wants(JSON.parse(e.data).subject)) schedule(); };
  source.onerror = () => say(source.readyState === 2 ? "Not live: reload the page" : "Reconnecting…");
})();
`;

/** The tab's icon (a rack of three machines); without one the browser asks for /favicon.ico and logs the 404. */
export const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#1f2933"/><g fill="#7fd1a0"><rect x="3" y="3" width="10" height="2.5"/><rect x="3" y="6.75" width="10" height="2.5"/><rect x="3" y="10.5" width="10" height="2.5"/></g></svg>`;

/** Readable on a phone and a laptop; colours chosen for WCAG AA contrast on white. */
export const CSS = `*,*::before,*::after{box-sizing:border-box}
body{margin:0;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Liberation Sans",sans-serif;color:#1b1b1b;background:#fff}
a{color:#0b57d0}
a:focus-visible,.table:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible,textarea:focus-visible{outline:3px solid #0b57d0;outline-offset:2px}
.skip{position:absolute;left:-999px}.skip:focus{left:8px;top:8px;background:#fff;padding:4px 8px;z-index:1}
header{display:flex;flex-wrap:wrap;gap:8px 24px;align-items:center;padding:8px 16px;background:#1f2933;color:#fff}
header a{color:#fff}header .brand{font-weight:700;text-decoration:none}
header nav ul{display:flex;gap:16px;list-style:none;margin:0;padding:0}
header .who{margin-left:auto;display:flex;gap:12px;align-items:center;font-size:14px}
header button{background:transparent;color:#fff;border:1px solid #fff;border-radius:4px;padding:2px 10px;font:inherit;cursor:pointer}
main{padding:16px;max-width:1100px;margin:0 auto}
h1{font-size:1.6rem;margin:.5rem 0 1rem}h2{font-size:1.2rem;margin:1.5rem 0 .5rem}
.table{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:15px}
caption{text-align:left;font-weight:600;padding:4px 0}
th,td{border-bottom:1px solid #d0d5da;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f2f4f6}
code,.mono{font-family:"DejaVu Sans Mono","Liberation Mono",monospace;font-size:14px;overflow-wrap:anywhere}
.state{display:inline-block;border-radius:10px;padding:0 8px;font-size:14px;background:#e8eaed;color:#1b1b1b}
.state-failed,.state-retired{background:#fde7e9;color:#8a1020}
.state-ready,.state-deployed,.state-succeeded{background:#e3f4e8;color:#0d5323}
.state-pending,.state-creating,.state-stopping,.state-starting,.state-deleting,.state-commissioning,.state-deploying,.state-releasing,.state-rescuing,.state-unrescuing,.state-running{background:#fff4d6;color:#5c4200}
.maint,.state-awaiting-approval{background:#efe3fb;color:#4b1c7a}
.state-active,.state-connected{background:#e3f4e8;color:#0d5323}.state-expired,.state-revoked,.state-disconnected{background:#fde7e9;color:#8a1020}
.counts{display:flex;flex-wrap:wrap;gap:8px 24px;margin:0;padding:0;list-style:none}
.counts li{background:#f2f4f6;border-radius:6px;padding:4px 10px}
.panel{border:1px solid #d0d5da;border-radius:6px;padding:12px 16px;margin:12px 0}
.error{border-color:#b3261e;background:#fdf0ef}
.empty{background:#f2f4f6;border-radius:6px;padding:16px}
dl.fields{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;margin:0}
dl.fields dt{font-weight:600}dl.fields dd{margin:0;overflow-wrap:anywhere}dl.fields+.table{margin-top:12px}
form.stack{display:grid;gap:8px;max-width:560px}
form.inline{display:inline}
label{font-weight:600}
input,select,textarea{font:inherit;padding:6px 8px;border:1px solid #6b7480;border-radius:4px;width:100%}
textarea{min-height:5em;font-family:"DejaVu Sans Mono","Liberation Mono",monospace;font-size:14px}
button,.button{font:inherit;padding:6px 14px;border-radius:4px;border:1px solid #0b57d0;background:#0b57d0;color:#fff;cursor:pointer;text-decoration:none;display:inline-block}
.button.secondary,button.secondary{background:#fff;color:#0b57d0}
.danger{background:#b3261e;border-color:#b3261e;color:#fff}
.actions{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.filters{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:8px 12px;align-items:end}
pre.console{background:#1b1b1b;color:#f2f4f6;padding:8px;overflow:auto;max-height:60vh;white-space:pre-wrap}
#live-status{font-size:14px;color:#4a5561;margin:0 0 8px}
@media (max-width:600px){main{padding:10px}.wide{display:none}th,td{padding:4px}header .who{margin-left:0}}
`;
