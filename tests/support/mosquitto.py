"""Mosquitto's command-line clients against a real broker: a running ``mosquitto_sub -d``
whose lines are read by a thread (``Sub``) and ``mosquitto_pub`` run to completion."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading

from brokerproc import BrokerProcess

TIMEOUT = 5.0


FORMAT = "MSG|%t|%q|%r|%p"


class Sub:
    """A running ``mosquitto_sub``; its output lines are read by a thread."""

    def __init__(self, port: int, version: str, *args: str, wait_secs: int = 10) -> None:
        # stdbuf: line-buffered stdout, so each debug line arrives when it is printed.
        cmd = ["stdbuf", "-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", str(port),
               "-V", version, "-d", "-F", FORMAT, "-W", str(wait_secs), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.publish_headers: list[str] = []  # "(d0, q1, r0, m1, 'topic', ... (2 bytes))"
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put("")  # EOF

    def _line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("mosquitto_sub said nothing in time:\n"
                                 + "".join(self.output)) from None
        if line == "":
            raise AssertionError("mosquitto_sub exited:\n" + "".join(self.output))
        return line

    def wait_subscribed(self, timeout: float = TIMEOUT) -> None:
        while not self._line(timeout).startswith("Subscribed (mid:"):
            pass

    def message(self, timeout: float = TIMEOUT) -> tuple[str, int, bool, str]:
        """The next message as (topic, qos, retain, payload).  The client hands QoS 2
        messages over at PUBREL, so the wire order is in ``publish_headers``."""
        while True:
            line = self._line(timeout)
            if " received PUBLISH (" in line:
                self.publish_headers.append(line.split(" received PUBLISH ", 1)[1])
            if line.startswith("MSG|"):
                _, topic, qos, retain, payload = line.split("|", 4)
                return topic, int(qos), retain == "1", payload

    def finish(self, timeout: float = 15.0) -> int:
        """Wait for the process to exit on its own (``-C`` reached)."""
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)


def pub(broker: BrokerProcess, version: str, topic: str, *args: str,
        message: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``mosquitto_pub -d`` to completion (bounded)."""
    cmd = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.mqtt_port), "-V", version,
           "-d", "-t", topic, *args]
    cmd += ["-n"] if message is None else ["-m", message]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done
