// The training progress page: reads its run's jobs from the JSON API every 2 s and draws them.
// Every value from the API reaches the page through textContent or setAttribute, never as HTML.
(function () {
  "use strict";
  var REFRESH_MS = 2000;
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#017cee", "#e53e3e", "#38a169", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#d53f8c"];
  var root = document.getElementById("sky-progress");
  var jobsBox = document.getElementById("sky-jobs");
  var statusLine = root.querySelector('[data-field="status"]');

  // The page is {prefix}/progress/{dag_id}/{run_id}: the API is {prefix}/api/v1/progress/{dag_id}/{run_id}.
  var parts = location.pathname.split("/");
  var dagId = decodeURIComponent(parts[parts.length - 2] || "");
  var runId = decodeURIComponent(parts[parts.length - 1] || "");
  var apiUrl = "../../api/v1/progress/" + encodeURIComponent(dagId) + "/" + encodeURIComponent(runId);
  var params = new URLSearchParams(location.search);
  var selectedRank = rankParam(params);
  var refreshes = 0;

  function rankParam(p) {
    var value = p.get("rank");
    if (value === null) value = p.get("map_index");  // a node-mapped task's map index is its rank
    var n = Number(value);
    return value !== null && value !== "" && Number.isInteger(n) && n >= 0 ? n : null;
  }

  var applyTheme = window.skyUi.applyTheme;
  var el = window.skyUi.el;

  function svgEl(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    return node;
  }

  function num(value) {
    if (value === null || value === undefined || value === "") return "–";
    var n = Number(value);
    if (!isFinite(n)) return String(value);
    return Number.isInteger(n) ? String(n) : String(Number(n.toPrecision(5)));
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    var s = Math.max(0, Math.round(Number(seconds)));
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + r + "s";
    return r + "s";
  }

  function clock(epoch) {
    if (epoch === null || epoch === undefined) return "–";
    return new Date(Number(epoch) * 1000).toLocaleTimeString();
  }

  function ago(epoch) {
    if (epoch === null || epoch === undefined) return "–";
    return duration(Date.now() / 1000 - Number(epoch)) + " ago";
  }

  function headline(doc) {
    var box = el("dl", { "class": "sky-headline" });
    var percent = doc.percent === null || doc.percent === undefined ? "–" : Number(doc.percent).toFixed(1) + "%";
    [
      ["Step", "step", num(doc.step)],
      ["Total", "total", num(doc.total)],
      ["Done", "percent", percent],
      ["ETA", "eta", duration(doc.eta_s)],
      ["Rate", "rate", doc.rate === null || doc.rate === undefined ? "–" : num(doc.rate) + " steps/s"],
      ["Slowest rank", "slowest-rank", num(doc.slowest_rank)],
      ["Generation", "generation", num(doc.generation)],
      ["Updated", "updated", ago(doc.updated_at)]
    ].forEach(function (item) {
      var cell = el("div");
      cell.appendChild(el("dt", {}, item[0]));
      cell.appendChild(el("dd", { "data-field": item[1] }, item[2]));
      box.appendChild(cell);
    });
    return box;
  }

  function metricNames(ranks) {
    var names = [];
    ranks.forEach(function (r) {
      Object.keys(r.metrics || {}).forEach(function (k) { if (names.indexOf(k) < 0) names.push(k); });
    });
    return names;
  }

  function rankTable(ranks, logUrls) {
    var names = metricNames(ranks);
    var table = el("table", { "class": "sky-ranks" });
    var head = el("tr");
    ["Rank", "Step", "Rate (steps/s)"].concat(names).concat(["Log"]).forEach(function (h) {
      head.appendChild(el("th", {}, h));
    });
    table.appendChild(el("thead")).appendChild(head);
    var body = table.appendChild(el("tbody"));
    ranks.forEach(function (r) {
      var row = el("tr", { "class": "sky-rank", "data-rank": r.rank });
      if (r.stale) row.classList.add("stale");
      if (r.rank === selectedRank) row.classList.add("selected");
      var rankCell = el("td", { "data-field": "rank" }, r.rank);
      if (r.stale) rankCell.appendChild(el("span", { "class": "sky-stale", "title": "no report for a while" }, "stale"));
      row.appendChild(rankCell);
      row.appendChild(el("td", { "data-field": "step" }, num(r.step)));
      row.appendChild(el("td", { "data-field": "rate" }, num(r.rate)));
      names.forEach(function (name) {
        var value = (r.metrics || {})[name];
        row.appendChild(el("td", { "data-metric": name }, value === undefined ? "" : num(value)));
      });
      var logCell = el("td");
      var url = (logUrls || {})[String(r.rank)];
      if (url) {
        var link = el("a", { "data-log-rank": r.rank, "href": url }, "log");
        link.addEventListener("click", openInUi);
        logCell.appendChild(link);
      }
      row.appendChild(logCell);
      body.appendChild(row);
    });
    return table;
  }

  // The UI embeds this page in a sandboxed frame that may not navigate the top window: a log link asks the
  // UI's own router (same origin) to show the task instance instead; elsewhere it is a plain link.
  function openInUi(ev) {
    if (window.parent === window || ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;
    try {
      var target = new URL(ev.currentTarget.getAttribute("href"), window.parent.location.href);
      window.parent.history.pushState(null, "", target.pathname + target.search);
      window.parent.dispatchEvent(new PopStateEvent("popstate", { state: null }));
      ev.preventDefault();
    } catch (e) { /* the UI is not reachable: the link opens in this frame */ }
  }

  // One chart per metric over steps: one line per rank and generation (a relaunch starts a new line).
  function charts(ranks) {
    var series = {};
    ranks.forEach(function (r) {
      (r.history || []).forEach(function (p) {
        Object.keys(p[3] || {}).forEach(function (name) {
          var key = r.rank + "/" + p[2];
          series[name] = series[name] || {};
          (series[name][key] = series[name][key] || { rank: r.rank, generation: p[2], points: [] })
            .points.push([Number(p[1]), Number(p[3][name])]);
        });
      });
    });
    var box = el("div", { "class": "sky-charts" });
    Object.keys(series).forEach(function (name) { box.appendChild(chart(name, series[name])); });
    return box;
  }

  function chart(name, lines, label) {
    label = label || "rank";
    var W = 320, H = 150, L = 44, R = 8, T = 8, B = 20;
    var all = [];
    Object.keys(lines).forEach(function (k) { all = all.concat(lines[k].points); });
    var xs = all.map(function (p) { return p[0]; }), ys = all.map(function (p) { return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y1 = y0 + 1; }
    function sx(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function sy(v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
    var wrap = el("div", { "class": "sky-chart-box" });
    wrap.appendChild(el("h3", {}, name));
    var svg = svgEl("svg", { "class": "sky-chart", "data-metric": name, "width": W, "height": H, "viewBox": "0 0 " + W + " " + H });
    svg.appendChild(svgEl("line", { "class": "axis", "x1": L, "y1": H - B, "x2": W - R, "y2": H - B }));
    svg.appendChild(svgEl("line", { "class": "axis", "x1": L, "y1": T, "x2": L, "y2": H - B }));
    [[L - 4, T + 8, num(y1), "end"], [L - 4, H - B, num(y0), "end"], [L, H - 4, num(x0), "start"], [W - R, H - 4, num(x1), "end"]]
      .forEach(function (t) {
        var label = svgEl("text", { "x": t[0], "y": t[1], "text-anchor": t[3] });
        label.textContent = t[2];
        svg.appendChild(label);
      });
    var newest = Math.max.apply(null, Object.keys(lines).map(function (k) { return lines[k].generation; }));
    Object.keys(lines).sort().forEach(function (k) {
      var line = lines[k];
      var pts = line.points.map(function (p) { return sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join(" ");
      var poly = svgEl("polyline", {
        "points": pts, "fill": "none", "data-rank": line.rank, "data-generation": line.generation,
        "stroke": COLORS[line.rank % COLORS.length],
        "stroke-width": line.rank === selectedRank ? 2.5 : 1.5,
        // an earlier generation (before a recovery) is dashed: the relaunch's line starts anew
        "stroke-dasharray": line.generation < newest ? "4 3" : "none"
      });
      var title = svgEl("title");
      title.textContent = label + " " + line.rank + (label === "rank" ? ", generation " + line.generation : "");
      poly.appendChild(title);
      svg.appendChild(poly);
    });
    wrap.appendChild(svg);
    var legend = el("div", { "class": "sky-legend" });
    var shown = {};
    Object.keys(lines).forEach(function (k) {
      var rank = lines[k].rank;
      if (shown[rank]) return;
      shown[rank] = true;
      var item = el("span", {}, label + " " + rank);
      item.insertBefore(el("i", { "style": "background:" + COLORS[rank % COLORS.length] }), item.firstChild);
      legend.appendChild(item);
    });
    wrap.appendChild(legend);
    return wrap;
  }

  function recoveries(items) {
    var list = el("ul", { "class": "sky-recoveries" });
    (items || []).forEach(function (r) {
      var ranks = (r.ranks || []).join(",");
      var text = "Generation " + num(r.generation) + ": " + (r.action || "relaunch") + " of rank " + (ranks || "?");
      if (r.at) text += " at " + clock(r.at);
      if (r.reason) text += " (" + r.reason + ")";
      if (r.notice_at) text += "; notice at " + clock(r.notice_at) + (r.preempt_at ? ", node due to go at " + clock(r.preempt_at) : "");
      text += "; " + (r.lost_s === null || r.lost_s === undefined ? "time lost unknown" : duration(r.lost_s) + " lost");
      if (r.steps_redone !== null && r.steps_redone !== undefined) text += ", " + num(r.steps_redone) + (r.steps_redone === 1 ? " step" : " steps") + " redone";
      list.appendChild(el("li", { "class": "sky-recovery", "data-generation": num(r.generation), "data-ranks": ranks }, text));
    });
    return list;
  }

  function jobSection(job, existing) {
    var section = existing || el("section", { "class": "sky-job" });
    section.setAttribute("data-cluster", job.cluster);
    section.setAttribute("data-job-id", job.job_id);
    section.setAttribute("data-source", job.source);
    section.replaceChildren();
    var title = el("h2", {}, (job.group || "job") + " — job " + job.job_id + " on " + job.cluster);
    var sourceText = { live: "live", final: "final (cluster gone)", none: "no progress reported" }[job.source] || job.source;
    title.appendChild(el("span", { "class": "sky-source" }, sourceText));
    section.appendChild(title);
    var doc = job.progress || {};
    section.appendChild(headline(doc));
    if (doc.percent !== null && doc.percent !== undefined) {
      var bar = el("div", { "class": "sky-bar" });
      bar.appendChild(el("div", { "style": "width:" + Math.max(0, Math.min(100, Number(doc.percent))) + "%" }));
      section.appendChild(bar);
    }
    var ranks = (doc.ranks || []).slice().sort(function (a, b) { return a.rank - b.rank; });
    if (ranks.length) {
      section.appendChild(rankTable(ranks, job.log_urls));
      section.appendChild(charts(ranks));
    } else {
      section.appendChild(el("p", { "class": "sky-empty" }, "No rank has reported progress."));
    }
    if ((doc.recoveries || []).length) {
      section.appendChild(el("h3", {}, "Recoveries"));
      section.appendChild(recoveries(doc.recoveries));
    }
    if (doc.goodput && doc.goodput.wall_s !== undefined) {
      section.appendChild(el("p", { "class": "sky-goodput" }, goodputText(doc.goodput)));
    }
    return section;
  }

  // "Goodput 87% of 5m 12s: first step after 42s, 12s lost, 0 steps redone" (gang/goodput.py's document).
  function goodputText(g) {
    var text = "Goodput " + (g.ratio === null || g.ratio === undefined ? "-" : Math.round(100 * g.ratio) + "%");
    text += " of " + duration(g.wall_s || 0);
    var parts = [];
    if (g.to_first_step_s !== null && g.to_first_step_s !== undefined) parts.push("first step after " + duration(g.to_first_step_s));
    parts.push(duration(g.lost_s || 0) + " lost");
    if (g.steps_redone !== null && g.steps_redone !== undefined) parts.push(num(g.steps_redone) + (g.steps_redone === 1 ? " step" : " steps") + " redone");
    return text + ": " + parts.join(", ");
  }

  // A sweep (dags/sweep.py): every trial with its params, state, step, ETA and metric, the best so far, one
  // chart with a line per trial, and a cancel for users who may edit the DAG's runs (the API says 403 else).
  function sweepSection(sw) {
    var section = el("section", { "class": "sky-sweep", "data-sweep": sw.sweep });
    var trials = sw.trials || [];
    var title = el("h2", {}, "Sweep " + sw.sweep + " — " + trials.length + " trials" + (sw.pool ? " on pool " + sw.pool : ""));
    section.appendChild(title);
    var line = num(sw.finished) + " of " + trials.length + " finished";
    if (sw.percent !== null && sw.percent !== undefined) line += " · " + Number(sw.percent).toFixed(1) + "% of all steps";
    section.appendChild(el("p", { "class": "sky-sweep-total", "data-field": "sweep-total" }, line));
    var metric = sw.metric;
    var table = el("table", { "class": "sky-ranks sky-trials" });
    var head = el("tr");
    ["Trial", "Params", "State", "Step", "ETA"].concat(metric ? [metric] : []).forEach(function (h) { head.appendChild(el("th", {}, h)); });
    table.appendChild(head);
    trials.forEach(function (t) {
      var params = Object.keys(t.params || {}).map(function (k) { return k + "=" + t.params[k]; }).join(" ");
      var row = el("tr", { "class": "sky-trial" + (t.trial === sw.best ? " best" : ""), "data-trial": t.trial, "data-state": t.state });
      [num(t.trial), params, t.state, t.total ? num(t.step) + "/" + num(t.total) : num(t.step), duration(t.eta_s)]
        .concat(metric ? [t.value === null || t.value === undefined ? "–" : num(t.value) + (t.trial === sw.best ? " ★" : "")] : [])
        .forEach(function (c) { row.appendChild(el("td", {}, c)); });
      table.appendChild(row);
    });
    section.appendChild(table);
    var best = trials.filter(function (t) { return t.trial === sw.best; })[0];
    if (metric) {
      section.appendChild(el("p", { "class": "sky-best", "data-trial": best ? best.trial : "" },
        best ? "Best so far: trial " + best.trial + " (" + metric + " " + num(best.value) + ", " + (sw.mode === "max" ? "highest" : "lowest") + ")" : "No trial has reported " + metric + " yet."));
      var lines = {};
      trials.forEach(function (t) {
        if ((t.history || []).length) lines["t" + ("000" + t.trial).slice(-4)] = { rank: t.trial, generation: 0, points: t.history };
      });
      if (Object.keys(lines).length) section.appendChild(chart(metric + " by trial", lines, "trial"));
    }
    if (sw.cancelled) {
      section.appendChild(el("p", { "class": "sky-cancelled" }, "Cancelled: " + sw.cancelled));
    } else if (sw.finished < trials.length) {
      var button = el("button", { "class": "sky-cancel", "type": "button" }, "Cancel sweep");
      button.addEventListener("click", function () { cancelSweep(sw.sweep, button); });
      section.appendChild(button);
    }
    return section;
  }

  function cancelSweep(sweep, button) {
    if (!window.confirm("Cancel every trial of sweep " + sweep + "? Running trials are stopped; the others never start.")) return;
    button.disabled = true;
    var url = "../../api/v1/sweeps/" + [dagId, runId, sweep].map(encodeURIComponent).join("/") + "/cancel";
    fetch(url, { method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json", "Accept": "application/json" }, body: JSON.stringify({ confirm: true }) })
      .then(function (response) {
        if (!response.ok) throw new Error(response.status === 403 ? "you may not edit this DAG's runs" : response.status + " " + response.statusText);
        button.textContent = "Cancelling…";
      })
      .catch(function (err) {
        button.disabled = false;
        statusLine.classList.add("error");
        statusLine.textContent = "Could not cancel the sweep: " + err.message;
      });
  }

  function render(data) {
    var sweepsBox = document.getElementById("sky-sweeps");
    if (!sweepsBox) {
      sweepsBox = el("div", { "id": "sky-sweeps" });
      root.insertBefore(sweepsBox, jobsBox);
    }
    sweepsBox.replaceChildren.apply(sweepsBox, (data.sweeps || []).map(sweepSection));
    var seen = {};
    (data.jobs || []).forEach(function (job) {
      var key = job.cluster + "/" + job.job_id;
      seen[key] = true;
      var existing = null;
      jobsBox.querySelectorAll("section.sky-job").forEach(function (s) {
        if (s.getAttribute("data-cluster") + "/" + s.getAttribute("data-job-id") === key) existing = s;
      });
      var section = jobSection(job, existing);
      if (!existing) jobsBox.appendChild(section);
    });
    jobsBox.querySelectorAll("section.sky-job").forEach(function (s) {
      if (!seen[s.getAttribute("data-cluster") + "/" + s.getAttribute("data-job-id")]) s.remove();
    });
    statusLine.classList.remove("error");
    statusLine.textContent = (data.jobs || []).length || (data.sweeps || []).length ? "" : "This run has no airflow-sky jobs (yet).";
  }

  function load() {
    applyTheme();
    fetch(apiUrl, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          var why = response.status === 401 || response.status === 403 ? "not signed in, or no access to this DAG" : response.statusText;
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
        statusLine.textContent = "Could not load the progress: " + err.message;
      })
      .then(function () { setTimeout(load, REFRESH_MS); });
  }

  load();
})();
