// Live updates: htmx's ws extension applies the server's out-of-band fragments. When the
// websocket fails (a proxy that blocks upgrades, a server restart), poll the same fragments
// — every 3 s, every 15 s while the tab is hidden — until the socket delivers again.
// "updated N s ago" counts from the last message (socket or poll); the server sends a small
// status fragment every few seconds when nothing changed, so a quiet page stays "current".
(function () {
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  if (!live) return;
  let pollTimer = null;
  let polling = false;
  let lastUpdate = null;

  function touched() { lastUpdate = Date.now(); tick(); }
  function tick() {
    const ago = document.getElementById("live-ago");
    if (!ago || lastUpdate === null) return;
    const s = Math.max(0, Math.round((Date.now() - lastUpdate) / 1000));
    ago.textContent = "updated " + (s < 90 ? s + " s" : Math.round(s / 60) + " min") + " ago";
    ago.dataset.ageS = String(s);
    ago.classList.toggle("old", s > 15);
  }
  setInterval(tick, 1000);

  function setStatus(text, cls) {
    const el = document.getElementById("live-status");
    if (el) { el.textContent = text; el.className = "live-status " + cls; }
  }
  function pollDelay() { return document.hidden ? 15000 : 3000; }
  function poll() {
    fetch(live.dataset.pollUrl, { credentials: "same-origin", headers: { "HX-Request": "true" } })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((html) => {
        const tpl = document.createElement("template");
        tpl.innerHTML = html;
        tpl.content.querySelectorAll("[hx-swap-oob]").forEach((frag) => {
          const old = document.getElementById(frag.id);
          if (old) { frag.removeAttribute("hx-swap-oob"); old.replaceWith(frag); }
        });
        setStatus("polling", "poll");
        touched();
      })
      .catch(() => setStatus("offline", "off"))
      .finally(() => { if (polling) pollTimer = setTimeout(poll, pollDelay()); });
  }
  function startPolling() { if (!polling) { polling = true; pollTimer = setTimeout(poll, 0); } }
  function stopPolling() { polling = false; clearTimeout(pollTimer); pollTimer = null; }

  // A socket that opens and closes without delivering anything (a proxy that accepts the
  // upgrade, then drops it) is a failure too: only a received message proves it works.
  document.body.addEventListener("htmx:wsAfterMessage", () => { stopPolling(); setStatus("live", "on"); touched(); });
  document.body.addEventListener("htmx:wsClose", () => {
    setStatus("reconnecting…", "off");
    // Poll while the extension backs off and reconnects; the first message it delivers
    // stops the polling again.
    startPolling();
  });
  document.body.addEventListener("htmx:wsError", startPolling);
  if (status && !window.WebSocket) startPolling();
})();
