/* mqttamqp console: confirm prompts, live counters, live tables and the rate chart.
 *
 * Loaded as a file (the Content-Security-Policy allows no inline script).  The
 * live feed is one EventSource on /api/events; each "stats" event updates the
 * elements marked data-stat, adds a point to the chart and re-fetches the
 * regions marked data-live-src (HTML rendered and escaped by the server).
 * Background requests carry X-Background so they do not keep an idle login alive.
 */
(function () {
  "use strict";

  // -- bulk selection (clients page): checkboxes in the live table belong to #bulk-form

  function picked() {
    return document.querySelectorAll('input[name="keys"][form="bulk-form"]:checked');
  }
  function countPicked() {
    var el = document.getElementById("bulk-count");
    if (el) { el.textContent = String(picked().length); }
  }
  document.addEventListener("change", function (ev) {
    var t = ev.target;
    if (t && t.id === "bulk-all") {
      document.querySelectorAll('input[name="keys"][form="bulk-form"]').forEach(function (b) {
        b.checked = t.checked;
      });
    }
    if (t && (t.id === "bulk-all" || t.name === "keys")) { countPicked(); }
  });

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var button = ev.submitter;
    var question = (button && button.getAttribute && button.getAttribute("data-confirm")) ||
      (form.getAttribute && form.getAttribute("data-confirm"));
    if (form.id === "bulk-form") {
      var n = picked().length;
      if (!n) {
        ev.preventDefault();
        var el = document.getElementById("bulk-count");
        if (el) { el.textContent = "0 (tick some clients first)"; }
        return;
      }
      question = question && question.replace("the selected", "the " + n + " selected");
    }
    if (question && !window.confirm(question)) {
      ev.preventDefault();
    }
  });

  var statEls = document.querySelectorAll("[data-stat]");
  var liveEls = document.querySelectorAll("[data-live-src]");
  var canvas = document.getElementById("rate-chart");
  if (!statEls.length && !liveEls.length && !canvas) {
    return;
  }

  // -- formatting (same as the server's filters) ---------------------------------

  function num(v) {
    return typeof v === "number" ? v.toLocaleString("en-US") : "—";
  }
  function rate(v) {
    return typeof v === "number"
      ? v.toLocaleString("en-US", {minimumFractionDigits: 1, maximumFractionDigits: 1}) : "—";
  }
  function bytes(v) {
    if (typeof v !== "number") { return "—"; }
    var units = ["B", "KiB", "MiB", "GiB"];
    var i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return i === 0 ? v.toFixed(0) + " B" : v.toFixed(1) + " " + units[i];
  }
  function duration(v) {
    var s = Math.max(0, Math.floor(v || 0));
    var parts = [[Math.floor(s / 86400), "d"], [Math.floor(s % 86400 / 3600), "h"],
                 [Math.floor(s % 3600 / 60), "m"], [s % 60, "s"]];
    while (parts.length > 1 && parts[0][0] === 0) { parts.shift(); }
    return parts.slice(0, 2).map(function (p) { return p[0] + p[1]; }).join(" ");
  }
  function text(v) { return String(v); }
  var formats = {num: num, rate: rate, bytes: bytes, duration: duration, text: text};

  function lookup(obj, path) {
    return path.split(".").reduce(function (o, k) {
      return o === null || o === undefined ? undefined : o[k];
    }, obj);
  }

  function updateStats(data) {
    statEls.forEach(function (el) {
      var value = lookup(data, el.getAttribute("data-stat"));
      if (value === undefined) { return; }
      var f = formats[el.getAttribute("data-format")] || num;
      var text = f(value);
      if (el.textContent !== text) { el.textContent = text; }
    });
  }

  // -- live regions ------------------------------------------------------------------

  var refreshing = false;
  function toLogin() {
    window.location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
  }
  function refreshRegions() {
    if (refreshing || document.hidden || !liveEls.length) { return; }
    refreshing = true;
    var jobs = Array.prototype.map.call(liveEls, function (el) {
      return fetch(el.getAttribute("data-live-src"), {
        credentials: "same-origin",
        headers: {"X-Background": "1"}
      }).then(function (resp) {
        if (resp.redirected || resp.status === 401) { toLogin(); return; }
        if (!resp.ok) { return; }
        return resp.text().then(function (html) {
          // Server-rendered, autoescaped HTML of this same page.
          if (el.getAttribute("data-last") !== html) {
            // Keep what the operator ticked across the refresh.
            var ticked = {};
            el.querySelectorAll('input[type="checkbox"]:checked').forEach(function (b) {
              ticked[b.id || b.value] = true;
            });
            el.innerHTML = html;
            el.setAttribute("data-last", html);
            el.querySelectorAll('input[type="checkbox"]').forEach(function (b) {
              if (ticked[b.id || b.value]) { b.checked = true; }
            });
            countPicked();
          }
        });
      });
    });
    Promise.all(jobs).catch(function () {}).then(function () { refreshing = false; });
  }

  // -- chart (uPlot, vendored as static/uplot.min.js) --------------------------------

  var points = [];
  var MAX_POINTS = 300;
  var plot = null;

  function chartData() {
    return [points.map(function (p) { return p.t; }),
            points.map(function (p) { return p["in"]; }),
            points.map(function (p) { return p.out; })];
  }
  function chartWidth() { return Math.max(320, canvas.clientWidth || 600); }
  function makeChart() {
    // uPlot and its time axis (timeaxis.js) are loaded with defer after this file,
    // and the feed's events can run between those two scripts: build the chart once
    // both are there (DOMContentLoaded comes after both), never with uPlot's own axis.
    if (!canvas || plot || typeof uPlot === "undefined" || !window.mqttamqpTime) { return; }
    var css = getComputedStyle(document.documentElement);
    var axis = {stroke: "#697386", grid: {stroke: "#e3e7ee", width: 1},
                ticks: {stroke: "#e3e7ee", width: 1}, font: "11px system-ui, sans-serif"};
    plot = new uPlot({
      width: chartWidth(), height: 180, legend: {show: false}, cursor: {show: true},
      tzDate: window.mqttamqpTime.tzDate,
      // Always the last five minutes, so the time axis reads in minutes.
      scales: {x: {time: true, range: function (u, min, max) {
        var end = max || Date.now() / 1000;
        return [end - 300, end];
      }}, y: {range: function (u, min, max) {
        return [0, niceCeil(Math.max(1, max) * 1.05)];
      }}},
      // Time labels in UTC on a 24-hour clock (static/timeaxis.js).
      axes: [window.mqttamqpTime.axis(axis),
             Object.assign({}, axis, {size: 56, values: function (u, ticks) {
        return ticks.map(rateLabel);
      }})],
      series: [{}, {label: "in", stroke: css.getPropertyValue("--in").trim() || "#2f6fdb",
                    width: 2, points: {show: false}},
               {label: "out", stroke: css.getPropertyValue("--out").trim() || "#1e9e6a",
                width: 2, points: {show: false}}]
    }, chartData(), canvas);
    canvas.setAttribute("data-drawn", "1");
    window.addEventListener("resize", function () {
      plot.setSize({width: chartWidth(), height: 180});
    });
  }
  function drawChart() {
    if (!canvas) { return; }
    makeChart();
    if (plot) { plot.setData(chartData()); }
  }
  function niceCeil(v) {
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i += 1) {
      if (steps[i] * p >= v) { return steps[i] * p; }
    }
    return 10 * p;
  }
  function rateLabel(v) {
    if (v >= 1000) { return (v / 1000).toFixed(v >= 10000 ? 0 : 1) + "k/s"; }
    return (v >= 10 || v === 0 ? v.toFixed(0) : v.toFixed(1)) + "/s";
  }
  if (canvas) {
    document.addEventListener("DOMContentLoaded", drawChart);
  }

  // -- the feed ------------------------------------------------------------------------

  var dots = document.querySelectorAll(".live-dot");
  var banner = document.getElementById("feed-banner");
  var lastUpdate = 0;        // ms since the epoch of the last "stats" event
  var STALE_MS = 5000;       // stats come every second: five missed means the feed is down
  function clock(ms) {          // UTC, as every time the console shows
    var d = new Date(ms);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()) + ":" +
      two(d.getUTCSeconds()) + " UTC";
  }
  function setLive(on) {
    dots.forEach(function (d) { d.classList.toggle("on", on); });
    if (!banner) { return; }
    if (on) {
      banner.hidden = true;
      return;
    }
    banner.textContent = "Live updates lost" + (lastUpdate ? " — last update at " +
      clock(lastUpdate) + "; what is shown may be out of date" : "") + ". Reconnecting…";
    banner.setAttribute("data-last-update", String(lastUpdate));
    banner.hidden = false;
  }
  // A feed can also stall without an error (a proxy holding the stream): watch the clock.
  setInterval(function () {
    if (lastUpdate && Date.now() - lastUpdate > STALE_MS) { setLive(false); }
  }, 1000);

  var source = null;
  function connect() {
    source = new EventSource("/api/events");
    source.addEventListener("open", function () { setLive(true); });
    source.addEventListener("history", function (ev) {
      points = JSON.parse(ev.data).slice(-MAX_POINTS);
      drawChart();
    });
    source.addEventListener("stats", function (ev) {
      var data = JSON.parse(ev.data);
      lastUpdate = Date.now();
      setLive(true);
      updateStats(data);
      if (canvas && data.rates) {
        points.push({t: data.now, "in": data.rates["in"], out: data.rates.out});
        if (points.length > MAX_POINTS) { points.shift(); }
        drawChart();
      }
      refreshRegions();
    });
    source.addEventListener("logout", function () {
      source.close();
      toLogin();
    });
    source.addEventListener("error", function () {
      setLive(false);
      if (source.readyState === EventSource.CLOSED) {
        // Refused (e.g. the login expired): find out which, then retry or log in.
        fetch("/api/whoami", {credentials: "same-origin", headers: {"X-Background": "1"}})
          .then(function (resp) {
            if (resp.status === 401) { toLogin(); } else { setTimeout(connect, 5000); }
          }, function () { setTimeout(connect, 5000); });
      }
    });
  }
  connect();
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) { refreshRegions(); }
  });
}());
