// What the airflow-sky pages share: the embedding Airflow UI's theme, and elements built from text (never
// HTML: every value from an API reaches a page through textContent or setAttribute).
window.skyUi = (function () {
  "use strict";

  // Follow the embedding Airflow UI's theme (same origin), else the browser's preference.
  function applyTheme() {
    var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
    try {
      var host = window.parent !== window ? window.parent.document.documentElement : null;
      if (host) {
        var scheme = host.getAttribute("data-theme") || host.style.colorScheme || "";
        dark = host.classList.contains("dark") || scheme === "dark" || (dark && !host.classList.contains("light"));
      }
    } catch (e) { /* not same origin: keep the browser's preference */ }
    document.documentElement.setAttribute("data-theme", dark ? "dark" : "light");
  }

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  return { applyTheme: applyTheme, el: el };
})();
