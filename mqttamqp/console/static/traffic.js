/* mqttamqp console, Traffic page: draws the report's charts with uPlot.
 *
 * Loaded as a file (the Content-Security-Policy allows no inline script). The
 * data is the report summary the server put, JSON-escaped, in the data-report
 * attribute of #traffic-data (no inline script, even a data block); nothing here
 * fetches.
 * Topic names reach the page only as uPlot series labels (text, not HTML).
 * Times are UTC on a 24-hour clock (static/timeaxis.js), as the report's are.
 */
(function () {
  "use strict";

  var holder = document.getElementById("traffic-data");
  if (!holder || typeof uPlot === "undefined") { return; }
  var report = JSON.parse(holder.getAttribute("data-report") || "null");
  if (!report) { return; }

  var time = window.mqttamqpTime;
  var palette = ["#2f6fde", "#e07b28", "#2aa876", "#c2418a", "#8a63d2", "#b59a16",
                 "#1b9aaa", "#d1495b", "#8d99ae"];

  function seconds(iso) { return Date.parse(iso) / 1000; }
  function width(el) { return Math.max(320, el.clientWidth || 600); }

  function chart(el, opts, data) {
    if (!el) { return null; }
    opts.width = width(el);
    var plot = new uPlot(opts, data, el);
    window.addEventListener("resize", function () {
      plot.setSize({width: width(el), height: opts.height});
    });
    el.setAttribute("data-drawn", "1");
    return plot;
  }

  // Messages per minute, stacked: each series is drawn as the running sum of
  // those before it, so the bands sit on top of each other.
  (function perMinute() {
    var pm = report.per_minute || {minutes: [], series: []};
    var xs = pm.minutes.map(seconds);
    var names = pm.series.map(function (s) { return s.name; });
    var running = xs.map(function () { return 0; });
    var data = [xs];
    var series = [{label: "Minute (UTC)", value: function (u, v) {
      return v == null ? "—" : (time ? time.stamp(v) : String(v));
    }}];
    pm.series.forEach(function (entry, i) {
      var name = entry.name;
      var values = entry.values;
      running = running.map(function (v, j) { return v + (values[j] || 0); });
      data.push(running.slice());
      var colour = palette[i % palette.length];
      series.push({label: name, stroke: colour, fill: colour + "55", width: 1,
                   value: (function (raw) {
                     return function (u, v, si, idx) {
                       return idx == null ? "—" : String(raw[idx] || 0);
                     };
                   })(values)});
    });
    // Fill each band down to the one below it.
    var bands = [];
    for (var s = names.length; s > 1; s -= 1) { bands.push({series: [s, s - 1]}); }
    chart(document.getElementById("traffic-per-minute"), {
      height: 260, series: series, bands: bands, tzDate: time && time.tzDate,
      scales: {x: {time: true}}, axes: [time ? time.axis() : {}, {label: "messages / min"}],
    }, data);
  })();

  // A bar per label.  The legend names the series only (not live): a live one
  // shows an unnamed "Value" for the bars' index and dashes until hovered.
  function bars(el, labels, counts, colour, yLabel) {
    var xs = labels.map(function (_, i) { return i; });
    chart(el, {
      height: 200,
      scales: {x: {time: false, range: [-0.5, Math.max(0.5, labels.length - 0.5)]}},
      series: [{},
               {label: yLabel, stroke: colour, fill: colour + "aa",
                paths: uPlot.paths.bars({size: [0.7, 60]}), points: {show: false}}],
      axes: [{splits: function () { return xs; },
              values: function (u, vals) { return vals.map(function (v) { return labels[v] || ""; }); }},
             {}],
      legend: {show: true, live: false},
    }, [xs, counts]);
  }

  (function durations() {
    var hist = (report.sessions && report.sessions.duration_histogram) || [];
    function label(b, i) {
      var prev = i ? hist[i - 1].le : 0;
      function fmt(s) { return s >= 3600 ? (s / 3600) + "h" : s >= 60 ? (s / 60) + "m" : s + "s"; }
      return b.le == null ? "> " + fmt(prev) : "≤ " + fmt(b.le);
    }
    bars(document.getElementById("traffic-durations"), hist.map(label),
         hist.map(function (b) { return b.count; }), palette[0], "sessions");
  })();

  (function wills() {
    var perHour = (report.wills && report.wills.per_hour) || [];
    bars(document.getElementById("traffic-wills"),
         perHour.map(function (w) { return w.hour.slice(5, 13).replace("T", " ") + "h"; }),
         perHour.map(function (w) { return w.count; }), palette[1], "wills");
  })();
})();
