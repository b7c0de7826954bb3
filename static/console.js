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

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
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
            el.innerHTML = html;
            el.setAttribute("data-last", html);
          }
        });
      });
    });
    Promise.all(jobs).catch(function () {}).then(function () { refreshing = false; });
  }

  // -- chart -------------------------------------------------------------------------

  var points = [];
  var MAX_POINTS = 300;

  function drawChart() {
    if (!canvas) { return; }
    var ratio = window.devicePixelRatio || 1;
    var width = canvas.clientWidth;
    var height = canvas.clientHeight;
    if (canvas.width !== Math.round(width * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    var left = 48;
    var right = 8;
    var top = 8;
    var bottom = 20;
    var w = width - left - right;
    var h = height - top - bottom;
    var max = 1;
    points.forEach(function (p) { max = Math.max(max, p["in"], p.out); });
    max = niceCeil(max * 1.05 / 4) * 4;   // four gridlines at round values
    var css = getComputedStyle(document.documentElement);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#697386";
    ctx.strokeStyle = "#e3e7ee";
    ctx.lineWidth = 1;
    for (var i = 0; i <= 4; i += 1) {
      var y = top + h - (h * i) / 4;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y) + 0.5);
      ctx.lineTo(left + w, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      ctx.fillText(rateLabel((max * i) / 4), left - 6, y);
    }
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.fillText("−5 min", left, top + h + 5);
    ctx.textAlign = "right";
    ctx.fillText("now", left + w, top + h + 5);
    function line(key, color) {
      if (points.length < 2) { return; }
      ctx.strokeStyle = color;
      ctx.lineWidth = 2;
      ctx.lineJoin = "round";
      ctx.beginPath();
      var n = points.length;
      points.forEach(function (p, idx) {
        var x = left + w - ((n - 1 - idx) * w) / (MAX_POINTS - 1);
        var y = top + h - (p[key] / max) * h;
        if (idx === 0) { ctx.moveTo(x, y); } else { ctx.lineTo(x, y); }
      });
      ctx.stroke();
    }
    line("in", css.getPropertyValue("--in").trim() || "#2f6fdb");
    line("out", css.getPropertyValue("--out").trim() || "#1e9e6a");
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
    window.addEventListener("resize", drawChart);
    drawChart();
  }

  // -- the feed ------------------------------------------------------------------------

  var dots = document.querySelectorAll(".live-dot");
  function setLive(on) {
    dots.forEach(function (d) { d.classList.toggle("on", on); });
  }

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
