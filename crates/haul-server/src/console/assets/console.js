// The operator console's only script (served from /console/assets, so the
// Content-Security-Policy's script-src 'self' allows it; nothing inline).
// - Times: each <time datetime> in UTC also shows the viewer's local time.
// - Copy buttons: copy the id next to them.
// - A load's page: its timeline refreshes while the page is open.
// Everything it inserts is text (textContent), or HTML the server escaped.
"use strict";

function localTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    if (el.dataset.local) continue;
    const d = new Date(el.getAttribute("datetime"));
    if (isNaN(d)) continue;
    el.dataset.local = "1";
    el.title = el.textContent;
    const span = document.createElement("span");
    span.className = "sub local";
    span.textContent = " (" + d.toLocaleString() + " local)";
    el.after(span);
  }
}

document.addEventListener("click", async (ev) => {
  const b = ev.target.closest("button.copy");
  if (!b) return;
  const text = b.dataset.copy || "";
  try {
    await navigator.clipboard.writeText(text);
    b.textContent = "Copied";
  } catch (_) {
    // No clipboard access: select the id so that the viewer can copy it.
    const code = b.previousElementSibling;
    if (code) {
      const r = document.createRange();
      r.selectNodeContents(code);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(r);
    }
    b.textContent = "Selected";
  }
  setTimeout(() => { b.textContent = "Copy"; }, 1500);
});

const REFRESH_MS = 3000;

function live() {
  const section = document.getElementById("timeline");
  if (!section || !section.dataset.live) return;
  const status = () => section.querySelector(".live");
  let last = null;
  const tick = async () => {
    if (document.hidden) return;
    try {
      const r = await fetch(section.dataset.live, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      if (r.redirected || r.status === 401 || r.status === 403) {
        const s = status();
        if (s) s.textContent = "Live refresh stopped: signed out.";
        clearInterval(timer);
        return;
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const html = await r.text();
      const doc = new DOMParser().parseFromString(html, "text/html");
      const fresh = doc.getElementById("timeline");
      // Any change since the last look (a record appended, an outbox row sent or
      // retried) replaces the section.
      if (fresh && html !== last) {
        section.replaceChildren(...fresh.childNodes);
        section.dataset.version = fresh.dataset.version;
        localTimes(section);
      }
      last = html;
      const s = status();
      if (s) s.textContent = "Live: checked " + new Date().toLocaleTimeString() + ", version " + section.dataset.version + ".";
    } catch (e) {
      const s = status();
      if (s) s.textContent = "Live refresh failed (" + e.message + "); retrying.";
    }
  };
  const timer = setInterval(tick, REFRESH_MS);
  tick();
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  live();
});
