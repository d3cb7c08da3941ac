// The Sky page: every cluster, job and dollar, read from the fleet API every 5 s.
// Every value from the API reaches the page through textContent or setAttribute, never as HTML.
(function () {
  "use strict";
  var REFRESH_MS = 5000;
  var root = document.getElementById("sky-fleet");
  var statusLine = root.querySelector('[data-field="status"]');
  var catalogLine = root.querySelector('[data-field="catalog"]');
  var totalsBox = document.getElementById("sky-totals");
  var clusterRows = document.querySelector("#sky-clusters tbody");
  var jobRows = document.querySelector("#sky-fleet-jobs tbody");
  var notesBox = document.getElementById("sky-notes");
  var apiUrl = "api/v1/fleet";
  var refreshes = 0;
  var openEvents = {};  // the clusters whose event list the user opened stay open across refreshes

  var applyTheme = window.skyUi.applyTheme;
  var el = window.skyUi.el;

  function money(value) {
    if (value === null || value === undefined) return "unknown";
    var n = Number(value);
    return n >= 0.01 || n === 0 ? "$" + n.toFixed(2) : "$" + n.toFixed(4);
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    var s = Math.round(Number(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function when(epoch) {
    return new Date(Number(epoch) * 1000).toISOString().replace("T", " ").slice(0, 19);
  }

  function cell(row, field, text, cls) {
    var td = el("td", { "data-field": field }, text);
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function link(text, href) {
    return href ? el("a", { "href": href, "target": "_top" }, text) : document.createTextNode(text);
  }

  function nodeType(c) {
    var b = c.billing;
    if (!b) return String(c.nodes);
    return c.nodes + " × " + b.instance_type + (b.use_spot ? " (spot)" : "");
  }

  function ownerText(o) {
    if (!o) return "unknown";
    var who = o.user ? o.user : "";
    if (o.via === "cli") return (who || "?") + " (CLI)";
    return o.dag_id + (who ? " · " + who : "");
  }

  function post(url, what, button) {
    if (!window.confirm(what + "?")) return;
    button.disabled = true;
    fetch(url, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json", "Accept": "application/json" }, body: JSON.stringify({ confirm: true }) })
      .then(function (response) {
        if (response.ok) { button.textContent = "Done"; return null; }
        return response.json().catch(function () { return {}; }).then(function (body) {
          var why = body && body.detail ? body.detail : response.status + " " + response.statusText;
          throw new Error(why);
        });
      })
      .catch(function (err) {
        button.disabled = false;
        statusLine.classList.add("error");
        statusLine.textContent = "Could not " + what + ": " + err.message;
      })
      .then(function () { setTimeout(load, 300); });
  }

  function actionButton(action, label, url, what) {
    var button = el("button", { "class": "sky-action", "type": "button", "data-action": action }, label);
    button.addEventListener("click", function () { post(url, what, button); });
    return button;
  }

  function clusterUrl(c, action) {
    return "api/v1/fleet/clusters/" + encodeURIComponent(c.cluster) + "/" + action + "?infra=" + encodeURIComponent(c.infra);
  }

  function eventsCell(row, c) {
    var td = cell(row, "events", "");
    if (!c.events.length) { td.textContent = "–"; return; }
    var key = c.infra + "/" + c.cluster + "/" + (c.launched_at || "");
    var details = el("details", { "class": "sky-events" });
    if (openEvents[key]) details.open = true;
    details.addEventListener("toggle", function () { openEvents[key] = details.open; });
    var last = c.events[c.events.length - 1];
    details.appendChild(el("summary", {}, c.events.length + " · " + last.kind));
    var list = el("ol", {});
    if (c.events_dropped) list.appendChild(el("li", {}, c.events_dropped + " earlier events dropped"));
    c.events.forEach(function (e) {
      var item = el("li", { "data-kind": e.kind, "data-rank": e.rank === null ? "" : e.rank });
      item.appendChild(el("span", { "class": "sky-kind" }, e.kind));
      item.appendChild(document.createTextNode(when(e.at) + " " + e.text));
      list.appendChild(item);
    });
    details.appendChild(list);
    td.appendChild(details);
  }

  function clusterRow(c) {
    var row = el("tr", { "class": "sky-cluster" + (c.ended_at ? " ended" : ""), "data-cluster": c.cluster, "data-infra": c.infra, "data-status": c.status });
    cell(row, "cluster", c.cluster);
    cell(row, "infra", c.infra);
    cell(row, "nodes", nodeType(c));
    cell(row, "status", c.status, "sky-state-" + c.status);
    cell(row, "age", c.ended_at ? "ended " + when(c.ended_at) : duration(c.age_s));
    cell(row, "idle", c.idle_s === null || c.idle_s === undefined ? "–" : duration(c.idle_s));
    cell(row, "autostop", c.autostop ? c.autostop.idle_minutes + "m" + (c.autostop.down ? " (down)" : "") : "–");
    cell(row, "cost_per_hour", c.ended_at ? "–" : money(c.cost_per_hour), "num");
    cell(row, "cost", money(c.cost), "num");
    var owner = cell(row, "owner", "");
    owner.appendChild(link(ownerText(c.owner), c.owner_url));
    cell(row, "jobs", c.live_jobs ? c.live_jobs + " running / " + c.jobs : String(c.jobs), "num");
    eventsCell(row, c);
    var actions = cell(row, "actions", "");
    if (c.editable) {
      if (c.status === "UP" && !c.live_jobs) {
        actions.appendChild(actionButton("stop", "Stop", clusterUrl(c, "stop"), "stop cluster " + c.cluster));
      }
      if (!c.live_jobs) {
        actions.appendChild(actionButton("down", "Down", clusterUrl(c, "down"), "tear down cluster " + c.cluster));
      }
    } else if (!c.ended_at) {
      actions.appendChild(el("span", { "class": "sky-readonly" }, "read-only"));
    }
    return row;
  }

  function progressText(j) {
    var p = j.progress;
    if (!p || p.step === null || p.step === undefined) return "–";
    var text = "step " + p.step + (p.total ? " / " + p.total : "");
    if (p.percent !== null && p.percent !== undefined) text += " (" + Number(p.percent).toFixed(0) + "%)";
    return text;
  }

  function jobRow(j) {
    var row = el("tr", { "class": "sky-fleet-job", "data-cluster": j.cluster, "data-job-id": j.job_id, "data-status": j.status });
    cell(row, "cluster", j.cluster);
    cell(row, "job_id", j.job_id, "num");
    cell(row, "name", (j.name || "–") + (j.managed ? " (managed)" : ""));
    cell(row, "status", j.status, "sky-state-" + j.status);
    cell(row, "progress", progressText(j));
    cell(row, "recoveries", j.recoveries, "num");
    cell(row, "goodput", j.goodput === null || j.goodput === undefined ? "–" : (100 * j.goodput).toFixed(0) + "%", "num");
    cell(row, "cost", money(j.cost), "num");
    var run = cell(row, "run", "");
    run.appendChild(link(j.run_id || "–", j.run_url));
    var actions = cell(row, "actions", "");
    if (j.editable) {
      var url = "api/v1/fleet/jobs/" + encodeURIComponent(j.cluster) + "/" + encodeURIComponent(j.job_id) + "/cancel?infra=" + encodeURIComponent(j.infra);
      actions.appendChild(actionButton("cancel", "Cancel", url, "cancel job " + j.job_id + " on " + j.cluster));
    }
    return row;
  }

  function totals(t) {
    var items = [["Clusters", t.clusters], ["Nodes", t.nodes], ["Running jobs", t.jobs_running], ["Per hour now", money(t.cost_per_hour)], ["Cost shown", money(t.cost)]];
    totalsBox.replaceChildren.apply(totalsBox, items.map(function (item) {
      var box = el("div", { "data-total": item[0] });
      box.appendChild(el("dt", {}, item[0]));
      box.appendChild(el("dd", {}, item[1]));
      return box;
    }));
  }

  function render(data) {
    totals(data.totals);
    clusterRows.replaceChildren.apply(clusterRows, data.clusters.map(clusterRow));
    jobRows.replaceChildren.apply(jobRows, data.jobs.map(jobRow));
    var notes = data.notes.map(function (n) { return n.infra + " could not be read: " + n.why; });
    if (data.jobs_hidden) notes.unshift(data.jobs_hidden + " older ended jobs not listed (cost-report and each cluster's queue have them)");
    notesBox.textContent = notes.join(" · ");
    catalogLine.textContent = "Costs: the packaged catalog's hourly prices (as of " + (data.catalog_as_of || "?") +
      ") × node-hours; local nodes and ssh pool hosts cost nothing here.";
    statusLine.classList.remove("error");
    statusLine.textContent = data.clusters.length ? "" : "No clusters on the configured infras.";
  }

  function load() {
    applyTheme();
    fetch(apiUrl, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          var why = response.status === 401 || response.status === 403 ? "not signed in, or no access" : response.statusText;
          throw new Error(response.status + " " + why);
        }
        return response.json();
      })
      .then(function (data) {
        render(data);
        refreshes += 1;
        root.setAttribute("data-loaded", "true");
        root.setAttribute("data-refreshes", String(refreshes));
      })
      .catch(function (err) {
        statusLine.classList.add("error");
        statusLine.textContent = "Could not load the fleet: " + err.message;
      });
  }

  function loop() {
    load();
    setTimeout(loop, REFRESH_MS);
  }

  loop();
})();
