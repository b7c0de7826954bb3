"""Render bench/run.py or bench/amqp_bench.py JSON as the Markdown tables in
README's Performance section.

    python bench/table.py results.json
"""

from __future__ import annotations

import json
import sys

# (scenario, metric, label, issue target as text or "")
ROWS = [
    ("1", "msgs_per_s", "1. QoS 0, 1→1, 64 B — msg/s", "ratio ≥ 0.25"),
    ("2", "msgs_per_s", "2. QoS 1, 1→1, persistent subscriber, window 100 — msg/s", "ratio ≥ 0.20"),
    ("3", "msgs_per_s", "3. QoS 2, 1→1, window 100 — msg/s", ""),
    ("4", "deliveries_per_s", "4. Fan-out QoS 0, 1→100 — deliveries/s", "ratio ≥ 0.25"),
    ("5", "msgs_per_s", "5. Fan-in QoS 0, 100→1 — msg/s", ""),
    ("6", "connect_all_s", "6. 5,000 idle connections — seconds to connect all", ""),
    ("6", "rss_per_conn_bytes", "6. 5,000 idle connections — bytes of broker memory each",
     "≤ 20 KB"),
    ("7", "p50_ms", "7. Latency QoS 1 at 1,000 msg/s — p50 ms", ""),
    ("7", "p99_ms", "7. Latency QoS 1 at 1,000 msg/s — p99 ms", "≤ 2 ms"),
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
          "(persistence off), both brokers in the same run, alternating.\n")
    print("| scenario | mqttamqp | Mosquitto | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for scenario, metric, label, target in ROWS:
        m = data.get("scenarios", {}).get(scenario, {}).get("metrics", {}).get(metric)
        if not m:
            continue
        ratio = m.get("ratio_mqttamqp_over_mosquitto")
        print(f"| {label} | {_fmt(m.get('mqttamqp'))} | {_fmt(m.get('mosquitto'))} | "
              f"{_fmt(ratio)} | {target} |")


if __name__ == "__main__":
    main(sys.argv[1])
