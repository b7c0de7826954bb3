"""Ten takeovers in a row under QoS 1 and QoS 2 load (issue 28, figures): 0
acknowledged messages lost, 0 QoS 2 duplicates, and per takeover the time from
``kill -9`` of the leader to the first client's CONNACK on the new leader and to the
last of N persistent sessions resumed (reconnected with its session present and
receiving again).

A throw-away PostgreSQL cluster (``tests/support/pgcluster.py``) on 127.0.0.1 and two
``twistd mqttamqp --ha`` processes, A and B, each with a fixed MQTT port.  Every
client is a paho client with a persistent session, given both ports, that tries the
other one when its connection goes or a connect fails: a QoS 1 publisher and a QoS 2
publisher (paced, at most ``--window`` unacknowledged each), their persistent
subscribers, and ``--sessions`` persistent clients subscribed at QoS 1 to a tick
published every 100 ms.  Each round waits for traffic on the leader, kills it with
SIGKILL, waits for the standby's takeover line and for every session to resume,
then restarts the killed broker, which comes back as the new standby.  At the end the
publishers stop, every publish is waited for to be acknowledged (PUBACK / PUBCOMP,
from one leader or the other), and the subscribers' payloads are compared with what
was acknowledged.  Printed as JSON (``--out`` writes it too).

Loopback only; every wait is bounded (``--timeout``); only the processes started here
are signalled, by their PID.

    python bench/ha_chain.py [--takeovers 10] [--sessions 20] [--rate 100]
"""

import argparse
import datetime
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

import paho.mqtt  # noqa: E402
import paho.mqtt.client as mqtt  # noqa: E402
from brokerproc import BrokerProcess  # noqa: E402
from pahokeep import KeepPubrel  # noqa: E402
from pgcluster import PostgresCluster  # noqa: E402


def log(msg):
    sys.stderr.write("[ha_chain {}] {}\n".format(time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """A persistent-session paho client given both ports: after a lost connection or
    a failed connect it tries the other port (paho reconnects every ``delay`` s)."""

    def __init__(self, ports, client_id, delay=0.2, as_is=False):
        self.ports = ports
        self.index = 0
        self.rotate = False
        self.cv = threading.Condition()
        self.connects = []      # (monotonic time, port, session present)
        self.received = []      # (monotonic time, payload)
        self.details = []       # (packet id, DUP flag, port) of each message
        self.acked = 0
        self.subacks = 0
        self.c = (mqtt.Client if as_is else KeepPubrel)(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             clean_session=False)
        self.c.reconnect_delay_set(min_delay=delay, max_delay=delay)
        self.c.max_queued_messages_set(0)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda *a: self._failed()
        self.c.on_connect_fail = lambda *a: self._failed()
        self.c.on_pre_connect = lambda *a: self._next()
        self.c.on_message = self._on_message
        self.c.on_publish = self._on_publish
        self.c.on_subscribe = self._on_subscribe
        self.c.connect("127.0.0.1", ports[0])
        self.c.loop_start()

    def _failed(self):
        self.rotate = True

    def _next(self):
        if self.rotate:   # (paho 2 refuses its port setter while reconnecting)
            self.rotate = False
            self.index = (self.index + 1) % len(self.ports)
            self.c._port = self.ports[self.index]

    def _on_connect(self, client, userdata, flags, rc, props):
        with self.cv:
            self.connects.append((time.monotonic(), self.ports[self.index],
                                  bool(flags.session_present)))
            self.cv.notify_all()

    def _on_message(self, client, userdata, msg):
        with self.cv:
            self.received.append((time.monotonic(), msg.payload))
            self.details.append((msg.mid, msg.dup, self.ports[self.index]))
            self.cv.notify_all()

    def _on_subscribe(self, *args):
        with self.cv:
            self.subacks += 1
            self.cv.notify_all()

    def _on_publish(self, *args):
        with self.cv:
            self.acked += 1
            self.cv.notify_all()

    def wait(self, what, timeout):
        with self.cv:
            return self.cv.wait_for(what, timeout)

    def resumed_after(self, since, port):
        """(CONNACK time, session present, first message time) of the first connect to
        ``port`` after ``since``; None while it has not happened."""
        with self.cv:
            connect = next((c for c in self.connects if c[0] > since and c[1] == port), None)
            if connect is None:
                return None
            first = next((t for t, _ in self.received if t >= connect[0]), None)
            return connect[0], connect[2], first

    def stop(self):
        self.c.disconnect()
        self.c.loop_stop()


class Publisher(threading.Thread):
    """Publishes ``topic/N`` payloads at ``qos`` and ``rate`` a second, at most
    ``window`` unacknowledged, until ``stop``; keeps every MQTTMessageInfo."""

    def __init__(self, client, topic, qos, rate, window, timeout):
        super().__init__(daemon=True)
        self.client, self.topic, self.qos = client, topic, qos
        self.rate, self.window, self.timeout = rate, window, timeout
        self.infos = []
        self.halt = threading.Event()

    def run(self):
        c = self.client
        n = 0
        while not self.halt.is_set():
            if not c.wait(lambda: n - c.acked < self.window or self.halt.is_set(),
                          self.timeout):
                log("publisher %s: no acknowledgement in %ss" % (self.topic, self.timeout))
                return
            self.infos.append(c.c.publish(self.topic, b"%08d" % n, self.qos))
            n += 1
            self.halt.wait(1.0 / self.rate)


def duplicates(sub, kills):
    """For each payload received twice: the round of each reception (the takeovers
    before it), its packet id, its DUP flag and the port it came from."""
    seen = {}
    for (t, payload), detail in zip(sub.received, sub.details):
        seen.setdefault(payload, []).append(
            {"after_takeovers": sum(1 for k in kills if k < t), "packet_id": detail[0],
             "dup": detail[1], "port": detail[2]})
    return [{"payload": p.decode(), "receptions": r} for p, r in seen.items() if len(r) > 1]


def start_broker(slot, data, uri, port, timeout, leader):
    proc = BrokerProcess(
        os.path.join(data, "data%d" % slot), "--storage", uri, "--ha", "--ha-poll", "0.2",
        "--ha-watch", "1", "--no-archive", "--will-grace", "0",
        listeners=("--mqtt", "--metrics"),
        descriptions={"--mqtt": "tcp:%d:interface=127.0.0.1" % port})
    proc.start(timeout=timeout, expect=("--metrics",))
    proc.wait_for_line(r"took over as leader" if leader else r"standby: waiting", timeout)
    return proc


def run(args, cluster, tmp):
    uri = cluster.create_database()
    ports = [free_port(), free_port()]
    procs = [start_broker(0, tmp, uri, ports[0], args.timeout, True),
             start_broker(1, tmp, uri, ports[1], args.timeout, False)]
    leader = 0
    tag = uuid.uuid4().hex[:6]
    clients = []
    rounds = []
    try:
        sub1 = Client(ports, "chain-s1-" + tag)
        sub2 = Client(ports, "chain-s2-" + tag)
        sessions = [Client(ports, "chain-k%03d-%s" % (i, tag)) for i in range(args.sessions)]
        pub1 = Client(ports, "chain-p1-" + tag)
        pub2 = Client(ports, "chain-p2-" + tag, as_is=args.paho_as_is)
        ticker = Client(ports, "chain-t-" + tag)
        clients = [sub1, sub2, *sessions, pub1, pub2, ticker]
        for c in clients:
            if not c.wait(lambda c=c: c.connects, args.timeout):
                raise RuntimeError("a client did not connect")
        sub1.c.subscribe("chain/q1/#", 1)
        sub2.c.subscribe("chain/q2/#", 2)
        for c in sessions:
            c.c.subscribe("chain/tick", 1)
        for c in (sub1, sub2, *sessions):
            if not c.wait(lambda c=c: c.subacks, args.timeout):
                raise RuntimeError("a subscription was not acknowledged")
        p1 = Publisher(pub1, "chain/q1/x", 1, args.rate, args.window, args.timeout)
        p2 = Publisher(pub2, "chain/q2/x", 2, args.rate, args.window, args.timeout)
        tick = Publisher(ticker, "chain/tick", 1, 10, 5, args.timeout)
        for p in (p1, p2, tick):
            p.start()
        for r in range(args.takeovers):
            # traffic on this leader first: both subscribers received more
            seen1, seen2 = len(sub1.received), len(sub2.received)
            if not (sub1.wait(lambda: len(sub1.received) >= seen1 + args.rate, args.timeout)
                    and sub2.wait(lambda: len(sub2.received) >= seen2 + args.rate,
                                  args.timeout)):
                raise RuntimeError("round %d: no traffic before the kill" % r)
            standby = 1 - leader
            new_port = ports[standby]
            killed = time.monotonic()
            procs[leader].kill()
            line = procs[standby].wait_for_line(r"took over as leader", args.timeout)
            took_over = time.monotonic() - killed
            m = re.search(r"listeners open in ([\d.]+)s", line)
            deadline = killed + args.timeout
            resumed = []
            for c in sessions:
                while True:
                    got = c.resumed_after(killed, new_port)
                    if got is not None and got[2] is not None:
                        resumed.append(got)
                        break
                    left = deadline - time.monotonic()
                    if left <= 0 or not c.wait(
                            lambda c=c: (c.resumed_after(killed, new_port) or (0, 0, None))[2]
                            is not None, left):
                        raise RuntimeError("round %d: a session did not resume" % r)
            first_connack = min(
                (t for c in clients for t, port, _ in list(c.connects)
                 if t > killed and port == new_port), default=None)
            rounds.append({
                "round": r + 1, "killed_at": killed, "killed": "AB"[leader], "new_leader": "AB"[standby],
                "kill_to_takeover_line_seconds": round(took_over, 3),
                "standby_load_and_listen_seconds": float(m.group(1)) if m else None,
                "kill_to_first_connack_seconds":
                    round(first_connack - killed, 3) if first_connack else None,
                "kill_to_all_sessions_resumed_seconds":
                    round(max(t for _, _, t in resumed) - killed, 3),
                "sessions_resumed_with_session_present": sum(1 for _, p, _ in resumed if p),
            })
            log("round %d: %s" % (r + 1, rounds[-1]))
            # the killed broker comes back as the new standby
            procs[leader] = start_broker(leader, tmp, uri, ports[leader], args.timeout, False)
            leader = standby
        for p in (p1, p2, tick):
            p.halt.set()
            p.join(args.timeout)
        # (paho keeps a QoS 1/2 publish made while disconnected and sends it on the
        # next connect, but its wait_for_publish raises for it: read the flag)
        unacked = 0
        for p in (p1, p2):
            for info in p.infos:
                p.client.wait(lambda info=info: info._published, args.timeout)
                unacked += not info._published
        # markers after every acknowledgement: the last thing each subscriber gets
        for c, topic, qos in ((pub1, "chain/q1/x", 1), (pub2, "chain/q2/x", 2)):
            end = c.c.publish(topic, b"end", qos)
            c.wait(lambda end=end: end._published, args.timeout)
        for s in (sub1, sub2):
            if not s.wait(lambda s=s: any(p == b"end" for _, p in s.received), args.timeout):
                raise RuntimeError("a subscriber did not receive its end marker")
        got1 = [p for _, p in sub1.received if p != b"end"]
        got2 = [p for _, p in sub2.received if p != b"end"]
        acked1 = {b"%08d" % i for i, info in enumerate(p1.infos) if info._published}
        acked2 = {b"%08d" % i for i, info in enumerate(p2.infos) if info._published}
        totals = {
            "takeovers": len(rounds), "sessions": args.sessions,
            "qos2_publisher": "paho-mqtt %s%s" % (
                paho.mqtt.__version__, " as is" if args.paho_as_is else " with KeepPubrel"),
            "rate_per_qos": args.rate, "window": args.window,
            "qos1_published": len(p1.infos), "qos1_acknowledged": len(acked1),
            "qos1_received": len(got1), "qos1_lost": len(acked1 - set(got1)),
            "qos1_duplicates": len(got1) - len(set(got1)),
            "qos2_published": len(p2.infos), "qos2_acknowledged": len(acked2),
            "qos2_received": len(got2), "qos2_lost": len(acked2 - set(got2)),
            "qos2_duplicates": len(got2) - len(set(got2)),
            "never_acknowledged": unacked,
        }
        kills = [r["killed_at"] for r in rounds]
        for r in rounds:
            del r["killed_at"]
        totals["qos2_duplicate_details"] = duplicates(sub2, kills)[:20]
        totals["qos1_duplicate_details"] = duplicates(sub1, kills)[:20]
        return rounds, totals
    finally:
        for c in clients:
            try:
                c.stop()
            except Exception:
                pass
        for proc in procs:
            proc.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--takeovers", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--rate", type=int, default=100, help="messages/s per QoS level")
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--paho-as-is", action="store_true",
                    help="the QoS 2 publisher as paho-mqtt is, without "
                    "tests/support/pahokeep.py's KeepPubrel (its QoS 2 duplicates)")
    ap.add_argument("--out")
    args = ap.parse_args()
    cluster = PostgresCluster().start()
    try:
        with tempfile.TemporaryDirectory(prefix="ha-chain-") as tmp:
            rounds, totals = run(args, cluster, tmp)
    finally:
        cluster.stop()
    doc = {"bench": "ha_chain", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "totals": totals, "rounds": rounds}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
