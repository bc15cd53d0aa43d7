// The operator console's only script (served from /console/assets, so the
// Content-Security-Policy's script-src 'self' allows it; nothing inline).
// - Times: each <time datetime> in UTC also shows the viewer's local time.
// - Copy buttons: copy the id next to them.
// - A load's page: its summary and timeline refresh while the page is open.
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

// True while the viewer is using a form of `root`: a field has the focus or holds
// text they typed. Their page is not swapped under them then.
function busy(root) {
  if (root.contains(document.activeElement) && document.activeElement.matches("input, select, textarea, button")) {
    return true;
  }
  for (const el of root.querySelectorAll("input:not([type=hidden]), textarea")) {
    if (el.value !== el.defaultValue || (el.value !== "" && el.defaultValue === "")) return true;
  }
  return false;
}

// A load's page: the summary (facts, last message, asks, dead rows and their forms)
// and the timeline are refreshed from the server while the page is open.
function live() {
  const section = document.getElementById("timeline");
  if (!section || !section.dataset.live) return;
  const status = () => section.querySelector(".live");
  let lastTimeline = null;
  let held = false;
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
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("timeline");
      // Any change since the last look (a record appended, an outbox row sent or
      // retried) replaces the timeline; the echoes the viewer opened stay open.
      if (fresh && fresh.innerHTML !== lastTimeline) {
        lastTimeline = fresh.innerHTML;
        const open = new Set([...section.querySelectorAll("li[data-seq] details[open]")].map((d) => d.parentElement.dataset.seq));
        section.replaceChildren(...fresh.childNodes);
        section.dataset.version = fresh.dataset.version;
        for (const li of section.querySelectorAll("li[data-seq]")) {
          if (open.has(li.dataset.seq)) li.querySelector("details").open = true;
        }
        localTimes(section);
      }
      // The summary follows the log's version; not while a form of it is in use.
      const summary = document.getElementById("summary");
      const freshSummary = doc.getElementById("summary");
      held = false;
      if (summary && freshSummary && freshSummary.dataset.version !== summary.dataset.version) {
        if (busy(summary)) {
          held = true;
        } else {
          summary.replaceChildren(...freshSummary.childNodes);
          summary.dataset.version = freshSummary.dataset.version;
          localTimes(summary);
        }
      }
      const s = status();
      if (s) {
        s.textContent = "Live: checked " + new Date().toLocaleTimeString() + ", version " + section.dataset.version + "." +
          (held ? " The load changed: its summary refreshes once your form is sent or cleared." : "");
      }
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
