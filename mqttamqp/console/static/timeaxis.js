/* mqttamqp console: the time axis of the uPlot charts (the Overview's rate chart,
 * the Traffic page's messages per minute), in UTC on a 24-hour clock like every
 * other time the console shows.
 *
 * Loaded as a file (the Content-Security-Policy allows no inline script), after
 * uplot.min.js and before the scripts that draw charts, which use it as
 * window.mqttamqpTime.  uPlot's own labels are in the browser's time zone with a
 * 12-hour clock, and put a long date under the first label of each minute, where
 * it runs into the next one.
 */
(function () {
  "use strict";

  function two(n) { return (n < 10 ? "0" : "") + n; }
  function day(d) {
    return d.getUTCFullYear() + "-" + two(d.getUTCMonth() + 1) + "-" + two(d.getUTCDate());
  }
  function clock(d, seconds) {
    return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()) +
      (seconds ? ":" + two(d.getUTCSeconds()) : "");
  }

  // Tick labels: HH:MM (HH:MM:SS for ticks less than a minute apart, YYYY-MM-DD
  // alone for ticks a day or more apart), and the date on a second line under the
  // first tick and where the day changes.  Ticks are at least SPACE pixels apart,
  // more than a date is wide, so two dates never meet.
  var SPACE = 80;
  function values(u, splits, axisIdx, foundSpace, foundIncr) {
    var last = "";
    return splits.map(function (t) {
      var d = new Date(t * 1000);
      var date = day(d);
      if (foundIncr >= 86400) { return date; }
      var label = clock(d, foundIncr < 60);
      if (date !== last) { label += "\n" + date; }
      last = date;
      return label;
    });
  }

  // An x axis for seconds since the epoch: uPlot's axis options ``base`` with
  // these labels.
  function axis(base) {
    return Object.assign({}, base || {}, {space: SPACE, values: values});
  }

  // uPlot's ``tzDate`` option: ticks fall on whole UTC minutes, hours and days
  // (uPlot aligns them in the browser's time zone otherwise, which is not always
  // a whole number of hours from UTC).
  function tzDate(t) { return uPlot.tzDate(new Date(t * 1000), "Etc/UTC"); }

  // One instant as text (legends): "2026-11-24 08:15 UTC".
  function stamp(t) {
    var d = new Date(t * 1000);
    return day(d) + " " + clock(d, false) + " UTC";
  }

  window.mqttamqpTime = {axis: axis, tzDate: tzDate, stamp: stamp};
}());
