"""Render bench/run.py or bench/amqp_bench.py JSON as the Markdown tables in
docs/performance.md.

    python bench/table.py results.json
"""

from __future__ import annotations

import json
import sys

# (scenario, metric, label, issue 15's goal as text or ""), in the issue's order
ROWS = [
    ("1", "msgs_per_s", "QoS 0 1→1, 64 B — msg/s", "ratio ≥ 0.7"),
    ("8", "msgs_per_s", "QoS 1 1→1, clean subscriber — msg/s", "ratio ≥ 0.7"),
    ("2", "msgs_per_s", "QoS 1 1→1, persistent subscriber (clean session 0) — msg/s",
     "ratio ≥ 0.5"),
    ("3", "msgs_per_s", "QoS 2 1→1 — msg/s", "keep 0 % lost"),
    ("4", "deliveries_per_s", "fan-out QoS 0 1→100 — deliveries/s", "keep"),
    ("5", "msgs_per_s", "fan-in QoS 0 100→1 — msg/s", "ratio ≥ 0.6, 0 % undelivered"),
    ("6", "connect_all_s", "5,000 idle connections — s to connect all", "ratio ≤ 1.5"),
    ("6", "rss_per_conn_bytes", "5,000 idle connections — broker bytes per connection",
     "≤ 3 KB"),
    ("9", "connect_all_s", "20,000 idle connections — s to connect all", ""),
    ("9", "rss_per_conn_bytes", "20,000 idle connections — broker bytes per connection",
     "≤ 3 KB"),
    ("7", "p50_ms", "latency QoS 1 at 1k msg/s — p50 ms", "ratio ≤ 1.3"),
    ("7", "p99_ms", "latency QoS 1 at 1k msg/s — p99 ms", ""),
    ("7", "p999_ms", "latency QoS 1 at 1k msg/s — p99.9 ms", "ratio ≤ 1.0"),
    ("10", "amqp_unsettled_msgs_per_s", "AMQP → AMQP unsettled — msg/s (no Mosquitto peer)", ""),
    ("10", "ratio_amqp_over_mqtt", "AMQP unsettled / this broker's MQTT QoS 1", "≥ 0.7"),
]


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


AMQP_ROWS = [
    ("mqtt_qos1", "MQTT QoS 1 → MQTT (this broker's reference)"),
    ("amqp_presettled", "AMQP → AMQP, pre-settled"),
    ("amqp_unsettled", "AMQP → AMQP, unsettled (Accepted after routing)"),
    ("mqtt_to_amqp", "MQTT QoS 1 → AMQP, unsettled"),
    ("amqp_to_mqtt", "AMQP, unsettled → MQTT QoS 1"),
]


def amqp_table(data: dict) -> None:
    runs = data.get("repeat", "?")
    print(f"| scenario | msg/s (median of {runs}) | runs | broker CPU µs/msg | "
          "publisher / subscriber CPU µs/msg |")
    print("|---|---:|---|---:|---:|")
    for name, label in AMQP_ROWS:
        r = data.get("scenarios", {}).get(name)
        if not r:
            continue
        each = ", ".join(f"{v:,}" for v in r.get("runs_msgs_per_s", []))
        print(f"| {label} | {r['msgs_per_s']:,} | {each} | {r['broker_cpu_us_per_msg']} | "
              f"{r.get('publisher_cpu_us_per_msg', '—')} / "
              f"{r.get('subscriber_cpu_us_per_msg', '—')} |")
    target = data.get("target", {})
    print(f"\nAMQP → AMQP unsettled / MQTT QoS 1: "
          f"{target.get('amqp_unsettled_over_mqtt_qos1')} (target ≥ {target.get('required')}).")


def main(path: str) -> None:
    with open(path) as f:
        data = json.load(f)
    if "amqp_unsettled_over_mqtt_qos1" in data.get("target", {}):
        amqp_table(data)
        return
    machine = data.get("machine", {})
    print(f"Measured {machine.get('date_utc', '?')} on {machine.get('nproc', '?')} cores "
          f"({machine.get('cpu_model', '?')}), Python {machine.get('python', '?')}, "
          f"Twisted {machine.get('twisted', '?')}, "
          f"Mosquitto {machine.get('mosquitto_version', '?')} "
          "(persistence off), both brokers in the same run, alternating, a fresh broker "
          f"per run, {data.get('config', {}).get('repeat', '?')} runs each; undelivered %: "
          f"sent minus received {data.get('config', {}).get('drain_s', '?')} s after the "
          "last publish, over sent.\n")
    print("| scenario | mqttamqp median (min–max) | Mosquitto median (min–max) | ratio | "
          "undelivered % mqttamqp / Mosquitto | goal |")
    print("|---|---:|---:|---:|---:|---|")
    for scenario, metric, label, target in ROWS:
        sc = data.get("scenarios", {}).get(scenario, {})
        m = sc.get("metrics", {}).get(metric)
        if not m:
            continue
        ratio = m.get("ratio_mqttamqp_over_mosquitto")
        if scenario == "10":  # one broker: the ratio is AMQP over MQTT, in its own row
            ratio = m.get("mqttamqp") if metric == "ratio_amqp_over_mqtt" else None
        und = sc.get("metrics", {}).get("undelivered_pct")
        undelivered = (f"{_fmt(und.get('mqttamqp'))} / "
                       f"{'n/a' if scenario == '10' else _fmt(und.get('mosquitto'))}"
                       if und else "n/a")
        print(f"| {label} | {_cell(m, 'mqttamqp')} | {_cell(m, 'mosquitto')} | "
              f"{_fmt(ratio)} | {undelivered} | {target} |")
    acc = data.get("scenarios", {}).get("5", {}).get("sys_accounting")
    if acc:
        print("\n$SYS accounting during fan-in (received − sent − dropped − queued, "
              "worst sample of all runs):")
        for broker, a in acc.items():
            print(f"- {broker}: worst {a.get('worst_mismatch')} "
                  f"({_fmt(a.get('worst_mismatch_pct_of_received'))} % of received), "
                  f"at rest after each run {a.get('final_mismatch')}, "
                  f"samples per run {a.get('samples_per_run')}, "
                  f"queued published: {a.get('queued_published')}")


def _cell(m: dict, broker: str) -> str:
    """The median, and the spread of the runs when there was more than one."""
    value = m.get(broker)
    lo, hi = m.get("min", {}).get(broker), m.get("max", {}).get(broker)
    if value is None or lo is None or hi is None or m.get("n", {}).get(broker, 0) < 2:
        return _fmt(value)
    return f"{_fmt(value)} ({_fmt(lo)}–{_fmt(hi)})"

if __name__ == "__main__":
    main(sys.argv[1])
