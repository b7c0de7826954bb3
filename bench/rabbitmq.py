"""RabbitMQ (Debian's package, MQTT plugin) as a benchmark peer, loopback only.

Everything the node needs lives in one temporary directory: its config, Mnesia
data, logs, enabled-plugins file and the Erlang cookie (HOME).  Every listener is
bound to 127.0.0.1 on a free port, none of them RabbitMQ's defaults: AMQP
(``listeners.tcp``), MQTT (``mqtt.listeners.tcp``), Erlang distribution
(``inet_dist_use_interface`` and ``RABBITMQ_DIST_PORT``) and the port mapper,
which the harness starts itself (``epmd -address 127.0.0.1 -port P``, in the
foreground) so that no daemon outlives the run.  The node and epmd each get a
new process group and are stopped by signalling exactly those groups.

The node is started with ``/usr/lib/rabbitmq/bin/rabbitmq-server`` (not the
``/usr/sbin`` wrapper, which would switch users and drop the environment).
"""

import os
import shutil
import subprocess
import tempfile
import time

import brokers

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def available():
    return os.path.exists(SERVER) and shutil.which("epmd") is not None


def version():
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def group_cpu_s(pgid):
    """utime+stime of every live process in process group ``pgid``, seconds."""
    total = 0.0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:            # field 5: pgrp
            total += (int(fields[11]) + int(fields[12])) / brokers.CLK_TCK
    return total


class RabbitMQ(brokers.Broker):
    """Same surface as ``brokers.Broker`` (port, pid, cpu_s, stop, log_tail)."""

    def __init__(self, prefetch=100, label="rabbitmq", plugins=("rabbitmq_mqtt",)):
        super().__init__("rabbitmq", label=label)
        self.prefetch = prefetch
        self.plugins = tuple(plugins)
        self.epmd = None
        self.amqp_port = None      # AMQP 0.9.1 (and 1.0, with rabbitmq_amqp1_0)

    @property
    def amqp_url(self):
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    def start(self, ready_timeout=90.0):
        self.tmp = tempfile.mkdtemp(prefix="mqttbench-rabbitmq-")
        self.port = brokers.free_port()
        amqp_port, dist_port, epmd_port = (brokers.free_port() for _ in range(3))
        self.amqp_port = amqp_port
        logs = os.path.join(self.tmp, "log")
        os.mkdir(logs)
        self.log = os.path.join(logs, "node.log")
        conf = os.path.join(self.tmp, "rabbitmq.conf")
        lines = [
            f"listeners.tcp.1 = 127.0.0.1:{amqp_port}",
            f"mqtt.listeners.tcp.1 = 127.0.0.1:{self.port}",
            "mqtt.allow_anonymous = true",
            # consumer prefetch of MQTT subscriptions (default 10): the same window
            # as mqttamqp's --max-inflight / --queue-prefetch in this bench
            f"mqtt.prefetch = {self.prefetch}",
            f"log.file = {self.log}",
            "log.console = false",
            "disk_free_limit.absolute = 50MB",
            "loopback_users = none",
        ]
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        plugins = os.path.join(self.tmp, "enabled_plugins")
        with open(plugins, "w") as f:
            f.write("[" + ",".join(self.plugins) + "].\n")
        env = dict(os.environ)
        env.update({
            "HOME": self.tmp,
            "RABBITMQ_NODENAME": f"qbench{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_CONFIG_FILE": conf,
            "RABBITMQ_ADVANCED_CONFIG_FILE": os.path.join(self.tmp, "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": os.path.join(self.tmp, "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
            "RABBITMQ_MNESIA_BASE": os.path.join(self.tmp, "mnesia"),
            "RABBITMQ_LOG_BASE": logs,
            "RABBITMQ_PID_FILE": os.path.join(self.tmp, "node.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
        })
        self.options_passed = lines
        with open(os.path.join(self.tmp, "epmd.stdio"), "wb") as logf:
            self.epmd = subprocess.Popen(
                ["epmd", "-address", "127.0.0.1", "-port", str(epmd_port)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, env=env,
                start_new_session=True)
        self.cmd = [SERVER]
        with open(self.log + ".stdio", "wb") as logf:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=logf, cwd=self.tmp, env=env,
                                         start_new_session=True)
        brokers._LIVE.add(self)
        try:
            self.wait_ready(ready_timeout)
        except BaseException:            # Ctrl-C during the start too: no node left behind
            self.stop()
            raise
        return self

    def cpu_s(self):
        return group_cpu_s(self.proc.pid)

    def stop(self, timeout=20.0):
        try:
            brokers.stop_group(self.proc, timeout)
            if self.proc is not None:
                self.exit_code = self.proc.returncode
        finally:
            self.proc = None
            brokers.stop_group(self.epmd, 5.0)
            self.epmd = None
            brokers._LIVE.discard(self)


def serve(seconds):
    """Run a node with the MQTT and AMQP 1.0 plugins for ``seconds`` (bounded), printing
    the environment that points tests/integration/amqp091/ at it, e.g.
    ``python bench/rabbitmq.py serve 1800`` then, in another shell,
    ``env $(cat /tmp/rabbit.env) .venv/bin/python -m pytest tests/integration/amqp091``."""
    b = RabbitMQ(plugins=("rabbitmq_mqtt", "rabbitmq_amqp1_0"))
    b.start()
    try:
        print(f"MQTTAMQP_TEST_AMQP091_URL={b.amqp_url}")
        print(f"MQTTAMQP_TEST_AMQP091_MQTT_PORT={b.port}")
        print(f"MQTTAMQP_TEST_AMQP091_AMQP10_PORT={b.amqp_port}")
        print(f"MQTTAMQP_TEST_AMQP091_LOG={b.log}", flush=True)
        b.proc.wait(timeout=seconds)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    finally:
        b.stop()
        b.cleanup()


if __name__ == "__main__":   # smoke test: start, report, stop; or "serve SECONDS"
    import sys
    if sys.argv[1:2] == ["serve"]:
        serve(float(sys.argv[2]) if len(sys.argv) > 2 else 1800.0)
        sys.exit(0)
    b = RabbitMQ()
    t0 = time.monotonic()
    b.start()
    print("ready on", b.port, "after %.1fs" % (time.monotonic() - t0), "cpu", b.cpu_s())
    b.stop()
    b.cleanup()
