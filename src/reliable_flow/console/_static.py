"""The console's stylesheet and its one script, served from ``/static/``
(no third-party asset, no build step).

The script only refreshes: a ``<main data-refresh-ms="N">`` is fetched
again every N milliseconds while the tab is visible and replaced by the
new one (parsed with ``DOMParser``, which runs no script; the server
escaped every value already).  Every page is complete without it.
"""

from __future__ import annotations

__all__ = ["ASSETS"]

_CSS = """
:root { color-scheme: light dark; --line: #8886; --warn: #b35900; --bad: #c0392b; --ok: #2e7d32; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; }
nav { display: flex; gap: 1em; padding: .6em 1em; border-bottom: 1px solid var(--line); flex-wrap: wrap; }
main { padding: 0 1em 2em; max-width: 80em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border-bottom: 1px solid var(--line); padding: .25em .6em; text-align: left; vertical-align: top; }
td { overflow-wrap: anywhere; max-width: 40em; }
pre.payload { margin: 0; max-height: 20em; overflow: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
.attention td:first-child { color: var(--bad); font-weight: 600; }
.healthy { color: var(--ok); } .unhealthy { color: var(--bad); }
.why { font-weight: 600; } .empty { opacity: .7; }
.chart { vertical-align: middle; }
form.filter { display: flex; gap: .6em; align-items: end; flex-wrap: wrap; }
form.act { display: grid; gap: .6em; max-width: 40em; } form.act label { display: grid; gap: .2em; }
.flash { padding: .5em .8em; border-left: 4px solid var(--ok); } .flash.refused { border-color: var(--bad); }
.acts a { margin-left: .6em; } .selection { font-weight: 600; }
"""

_JS = """
"use strict";
(function () {
  function schedule() {
    var main = document.getElementById("main");
    if (!main) { return; }
    var every = parseInt(main.getAttribute("data-refresh-ms") || "", 10);
    if (!(every > 0)) { return; }
    setTimeout(function () {
      if (document.hidden) { schedule(); return; }
      fetch(window.location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (text) {
          if (text !== null) {
            var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("main");
            var current = document.getElementById("main");
            var typing = document.activeElement && current.contains(document.activeElement) &&
                         document.activeElement.tagName === "INPUT";
            if (fresh && current && !typing) {
              fresh.setAttribute("data-refreshed-at", String(Date.now()));
              current.replaceWith(document.importNode(fresh, true));
            }
          }
        })
        .catch(function () {})
        .then(schedule);
    }, every);
  }
  document.addEventListener("DOMContentLoaded", schedule);
})();
"""

#: path under ``/static/`` -> (content type, body)
ASSETS = {
    "console.css": ("text/css; charset=utf-8", _CSS.encode("utf-8")),
    "console.js": ("text/javascript; charset=utf-8", _JS.encode("utf-8")),
}
