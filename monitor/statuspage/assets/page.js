// vipd's status page: refresh the main part from /status.json at most once
// a second while the tab is visible. The server renders (and escapes) the
// HTML; this script only swaps it in.
(function () {
  "use strict";
  var body = document.body;
  var version = body.dataset.version;
  var live = document.getElementById("live");
  var main = document.getElementById("main");
  var busy = false;
  var failures = 0;
  function url() {
    var p = new URLSearchParams();
    if (body.dataset.q) p.set("q", body.dataset.q);
    if (body.dataset.page && body.dataset.page !== "1") p.set("page", body.dataset.page);
    p.set("v", version);
    return "status.json?" + p.toString();
  }
  function poll() {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    fetch(url(), { cache: "no-store", credentials: "omit" })
      .then(function (r) {
        if (r.status === 204) return null;
        if (!r.ok) throw new Error(r.status);
        return r.json();
      })
      .then(function (d) {
        failures = 0;
        live.className = "live on";
        live.textContent = "live";
        if (!d) return;
        version = d.version;
        main.innerHTML = d.main;
        document.title = d.title;
      })
      .catch(function () {
        failures++;
        live.className = "live stale";
        live.textContent = "stale (no answer)";
      })
      .then(function () { busy = false; });
  }
  live.className = "live on";
  live.textContent = "live";
  poll();
  setInterval(poll, 1000);
  document.addEventListener("visibilitychange", poll);
})();
