// Live updates: htmx's ws extension applies the server's out-of-band fragments. When the
// websocket keeps failing (a proxy that blocks upgrades, say), fall back to polling the
// same fragments, slower while the tab is hidden, and go back to the socket when it works.
(function () {
  const live = document.getElementById("live");
  const status = document.getElementById("live-status");
  if (!live) return;
  let failures = 0;
  let pollTimer = null;

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
      })
      .catch(() => setStatus("offline", "off"))
      .finally(() => { pollTimer = setTimeout(poll, pollDelay()); });
  }
  function startPolling() { if (!pollTimer) { pollTimer = setTimeout(poll, 0); } }
  function stopPolling() { if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; } }

  document.body.addEventListener("htmx:wsOpen", () => { failures = 0; stopPolling(); setStatus("live", "on"); });
  document.body.addEventListener("htmx:wsClose", () => {
    failures += 1;
    setStatus("reconnecting…", "off");
    if (failures >= 2) startPolling();
  });
  document.body.addEventListener("htmx:wsError", () => { failures += 1; if (failures >= 2) startPolling(); });
  if (status && !window.WebSocket) startPolling();
})();
