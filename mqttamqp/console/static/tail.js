/* mqttamqp console: the live message tail (/tail).
 *
 * One EventSource on /api/tail?filter=…&view=…; each "message" event becomes a
 * table row built with textContent only (a payload is never parsed as markup).
 * Pause keeps the stream open and holds new messages back (at most MAX_ROWS of
 * them); the table keeps the newest MAX_ROWS rows.
 */
(function () {
  "use strict";
  var box = document.getElementById("tail");
  if (!box) { return; }
  var MAX_ROWS = 200;
  var body = document.querySelector("#tail-table tbody");
  var stateEl = document.getElementById("tail-state");
  var countEl = document.getElementById("tail-count");
  var skippedEl = document.getElementById("tail-skipped");
  var pauseBtn = document.getElementById("tail-pause");
  var paused = false;
  var held = [];
  var received = 0;
  var skipped = 0;

  function two(n) { return (n < 10 ? "0" : "") + n; }
  function time(t) {            // UTC, as every time the console shows
    var d = new Date(t * 1000);
    return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes()) + ":" +
      two(d.getUTCSeconds()) + "." + String(d.getUTCMilliseconds() + 1000).slice(1);
  }
  function cell(text, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    td.textContent = text;
    return td;
  }
  function row(m) {
    var tr = document.createElement("tr");
    tr.appendChild(cell(time(m.timestamp)));
    tr.appendChild(cell(m.topic, "mono wrap"));
    tr.appendChild(cell(String(m.qos), "num"));
    tr.appendChild(cell(m.retain ? "yes" : "no"));
    tr.appendChild(cell(m.publisher === null ? "—" : m.publisher, "id"));
    tr.appendChild(cell(m.size.toLocaleString("en-US") + " B", "num"));
    var td = document.createElement("td");
    var tag = document.createElement("span");
    tag.className = "tag";
    tag.textContent = m.mode;
    var pre = document.createElement("pre");
    pre.className = "payload tail-payload";
    pre.textContent = m.body + (m.truncated ? "\n… (cut)" : "");
    td.appendChild(tag);
    td.appendChild(pre);
    tr.appendChild(td);
    return tr;
  }
  function show(m) {
    body.insertBefore(row(m), body.firstChild);
    while (body.rows.length > MAX_ROWS) { body.deleteRow(body.rows.length - 1); }
  }
  function counts() {
    countEl.textContent = received.toLocaleString("en-US");
    skippedEl.textContent = (skipped ? " · " + skipped.toLocaleString("en-US") +
      " skipped (over the rate)" : "") + (held.length ? " · " + held.length + " held while paused" : "");
  }

  pauseBtn.addEventListener("click", function () {
    paused = !paused;
    pauseBtn.textContent = paused ? "Resume" : "Pause";
    stateEl.textContent = paused ? "paused" : "live";
    if (!paused) {
      held.forEach(show);
      held = [];
    }
    counts();
  });
  document.getElementById("tail-clear").addEventListener("click", function () {
    while (body.rows.length) { body.deleteRow(0); }
    held = [];
    received = skipped = 0;
    counts();
  });

  var url = "/api/tail?filter=" + encodeURIComponent(box.getAttribute("data-filter")) +
    "&view=" + encodeURIComponent(box.getAttribute("data-view"));
  var source = new EventSource(url);
  source.addEventListener("open", function () {
    stateEl.textContent = paused ? "paused" : "live";
    box.setAttribute("data-live", "1");
  });
  source.addEventListener("message", function (ev) {
    var m = JSON.parse(ev.data);
    received += 1;
    if (paused) {
      held.push(m);
      if (held.length > MAX_ROWS) { held.shift(); }
    } else {
      show(m);
    }
    counts();
  });
  source.addEventListener("tick", function (ev) {
    skipped += JSON.parse(ev.data).skipped;
    counts();
  });
  source.addEventListener("logout", function () {
    source.close();
    window.location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
  });
  source.addEventListener("error", function () {
    stateEl.textContent = "disconnected — reconnecting…";
    box.removeAttribute("data-live");
  });
}());
