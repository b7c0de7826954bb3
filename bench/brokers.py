"""Start/stop the brokers under test and read their /proc figures.

Each broker is started in its own session (new process group) with a raised
RLIMIT_NOFILE soft limit, and stopped by signalling exactly that process group
(SIGTERM, then SIGKILL after a bounded wait).  Nothing else is ever signalled.
"""

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.dirname(HERE)  # /work/main
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

_LIVE = set()  # brokers started and not yet stopped (for emergency cleanup)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def raise_nofile():
    """Soft RLIMIT_NOFILE = hard, for this process (and what it starts after).
    The hard limit itself can be raised only with CAP_SYS_RESOURCE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def proc_cpu_s(pid):
    """utime+stime of the process (all threads), seconds."""
    with open("/proc/%d/stat" % pid) as f:
        data = f.read()
    fields = data[data.rindex(")") + 2:].split()
    # fields[0] is field 3 (state); utime = field 14, stime = field 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


#: What ``proc_threads`` reads of a thread (its counters are summed by ``threads_per_unit``)
THREAD_COUNTERS = ("user_s", "sys_s", "voluntary", "involuntary")


def proc_threads(pid):
    """Each thread of the process, by ``(tid, start)`` (a thread id the kernel reuses
    is a new key: ``start`` is the thread's start time in clock ticks):
    ``{"name"`` (its ``comm``), ``"user_s"``, ``"sys_s"`` (CPU seconds, in clock
    ticks), ``"voluntary"``, ``"involuntary"`` (context switches)``}``, from
    ``/proc/PID/task``. A thread that ends meanwhile is left out; a process that is
    gone has none."""
    out = {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                stat = f.read()
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                status = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        switches = dict(re.findall(r"^(\w*voluntary_ctxt_switches):\s+(\d+)", status, re.M))
        # (fields[0] is stat's field 3: utime 14, stime 15, starttime 22)
        out[(int(tid), int(fields[19]))] = {
            "name": stat[stat.index("(") + 1:stat.rindex(")")],
            "user_s": int(fields[11]) / CLK_TCK, "sys_s": int(fields[12]) / CLK_TCK,
            "voluntary": int(switches["voluntary_ctxt_switches"]),
            "involuntary": int(switches["nonvoluntary_ctxt_switches"])}
    return out


def threads_per_unit(pid, before, after, n, process_cpu_s=None, group=None):
    """The main thread's (the reactor's, for mqttamqp) and the other threads' user
    and system CPU (µs) and context switches per unit (message, connection) between
    two ``proc_threads`` of process ``pid`` (a thread started meanwhile counts from
    0); ``group(key, row)``, if given, names the part each thread is summed into
    instead. With ``process_cpu_s`` (the process's CPU over the same interval, all
    threads) also ``unattributed_cpu_us``: what the threads that ended meanwhile took,
    and the clock ticks' rounding. Resolution: one clock tick (10 ms) over ``n``."""
    res = {}
    for key, row in after.items():
        b = before.get(key)
        name = group(key, row) if group else ("main" if key[0] == pid else "other_threads")
        part = res.setdefault(name,
                              {"user_us": 0.0, "sys_us": 0.0, "voluntary_switches": 0.0,
                               "involuntary_switches": 0.0})
        delta = {c: row[c] - (b[c] if b else 0) for c in THREAD_COUNTERS}
        part["user_us"] += delta["user_s"] * 1e6 / n
        part["sys_us"] += delta["sys_s"] * 1e6 / n
        part["voluntary_switches"] += delta["voluntary"] / n
        part["involuntary_switches"] += delta["involuntary"] / n
    out = {name: {k: round(v, 4 if k.endswith("switches") else 2) for k, v in part.items()}
           for name, part in res.items()}
    if process_cpu_s is not None:
        threads = sum(p["user_us"] + p["sys_us"] for p in res.values())
        out["unattributed_cpu_us"] = round(process_cpu_s * 1e6 / n - threads, 2)
    return out


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "VmSize", "Threads", "RssAnon"):
                v = v.strip()
                out[k] = int(v.split()[0]) if v.endswith("kB") else int(v)
    return out


def proc_nofile(pid):
    try:
        with open("/proc/%d/limits" % pid) as f:
            for line in f:
                if line.startswith("Max open files"):
                    parts = line.split()
                    return {"soft": parts[3], "hard": parts[4]}
    except OSError:
        pass
    return None


def proc_open_fds(pid):
    """Descriptors the process has open now."""
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0


def mosquitto_bin():
    for c in ("/usr/sbin/mosquitto", shutil.which("mosquitto")):
        if c and os.path.exists(c):
            return c
    return None


def mosquitto_version():
    b = mosquitto_bin()
    if not b:
        return None
    try:
        r = subprocess.run([b, "-h"], capture_output=True, text=True, timeout=10)
        m = re.search(r"mosquitto version (\S+)", r.stdout + r.stderr)
        return m.group(1) if m else (r.stdout + r.stderr).splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        return None


def twistd_bin():
    c = os.path.join(os.path.dirname(sys.executable), "twistd")
    if os.path.exists(c):
        return c
    return shutil.which("twistd")


def mqttamqp_help(timeout=60):
    """Return (ok, help_text, env_extra) for `twistd mqttamqp --help`.

    Tries the environment as is first; if the plugin is not found, retries with
    PYTHONPATH=/work/main (twistd discovers twisted/plugins/ on sys.path)."""
    tw = twistd_bin()
    if not tw:
        return False, "twistd not found", {}
    last = ""
    for extra in ({}, {"PYTHONPATH": MAIN}):
        env = dict(os.environ)
        env.update(extra)
        try:
            r = subprocess.run([tw, "mqttamqp", "--help"], capture_output=True, text=True,
                               timeout=timeout, cwd=MAIN, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            last = repr(e)
            continue
        text = r.stdout + r.stderr
        if r.returncode == 0 and "--mqtt" in text:
            return True, text, extra
        last = text[-2000:]
    return False, last, {}


def twistd_python():
    """The interpreter ``twistd_bin()`` runs (its ``#!`` line), else this one."""
    tw = twistd_bin()
    try:
        with open(tw or "", "rb") as f:
            first = f.readline().decode(errors="replace")
    except OSError:
        return sys.executable
    words = first[2:].split() if first.startswith("#!") else []
    if words and os.path.isabs(words[0]) and os.path.basename(words[0]) != "env":
        return words[0]
    return sys.executable   # (``#!/usr/bin/env python3``: the PATH's, as here)


def mqttamqp_build(env_extra=None, timeout=60):
    """Which build of mqttamqp a broker started from here runs ("compiled" or "pure
    Python", as its start-up line says; ``mqttamqp.native.build``), or None. Asked
    of ``twistd``'s interpreter with this environment (and ``env_extra``), from ``/``
    so that no checkout in the current directory is imported instead."""
    env = dict(os.environ)
    env.update(env_extra or {})
    try:
        r = subprocess.run([twistd_python(), "-c",
                            "from mqttamqp.native import build; print(build())"],
                           capture_output=True, text=True, timeout=timeout, cwd="/", env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def help_options(text):
    return sorted(set(re.findall(r"(--[a-z][a-z0-9-]*)", text)))


def stop_group(proc, timeout):
    """Stop the process group ``proc`` leads (we started it with start_new_session):
    SIGTERM, then SIGKILL after ``timeout``; with the leader already gone, SIGKILL
    whatever it left in its group."""
    if proc is None:
        return
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(5)
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Broker:
    """kind: 'mosquitto' or 'mqttamqp'.  label: name used in results."""

    def __init__(self, kind, label=None, max_inflight=100, max_queued=1_000_000,
                 mqttamqp_help_text=None, mqttamqp_env=None, extra_args=(), want_inflight=False,
                 sys_interval=None, mosquitto_persistence=False):
        self.kind = kind
        # Mosquitto's `persistence true` keeps its store in memory and writes it at
        # autosave and exit (no per-message write, no fsync)
        self.mosquitto_persistence = mosquitto_persistence
        self.label = label or kind
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.help_text = mqttamqp_help_text or ""
        self.env_extra = mqttamqp_env or {}
        self.extra_args = list(extra_args)
        self.want_inflight = want_inflight
        self.sys_interval = sys_interval  # seconds between $SYS updates; None: the default
        self.proc = None
        self.port = None
        self.tmp = None
        self.log = None
        self.cmd = None
        self.options_passed = []

    # -- lifecycle
    def start(self, ready_timeout=60.0):
        self.tmp = tempfile.mkdtemp(prefix="mqttbench-%s-" % self.kind)
        self.port = free_port()
        self.log = os.path.join(self.tmp, "broker.log")
        env = dict(os.environ)
        cwd = self.tmp
        if self.kind == "mosquitto":
            conf = os.path.join(self.tmp, "mosquitto.conf")
            lines = [
                "listener %d 127.0.0.1" % self.port,
                "allow_anonymous true",
                "persistence %s" % ("true" if self.mosquitto_persistence else "false"),
                "max_inflight_messages %d" % self.max_inflight,
                "max_queued_messages %d" % self.max_queued,
                "max_connections -1",
                "connection_messages false",
                "log_dest stderr",
                "log_type error",
                "log_type warning",
            ]
            if self.mosquitto_persistence:
                lines.append("persistence_location %s/" % self.tmp)
            if self.sys_interval is not None:
                lines.append("sys_interval %d" % self.sys_interval)
            with open(conf, "w") as f:
                f.write("\n".join(lines) + "\n")
            self.options_passed = lines
            self.cmd = [mosquitto_bin(), "-c", conf]
        elif self.kind == "mqttamqp":
            opts = help_options(self.help_text)
            data = os.path.join(self.tmp, "data")
            os.mkdir(data)
            args = ["--mqtt", "tcp:%d:interface=127.0.0.1" % self.port]
            if "--data" in opts:
                args += ["--data", data]
            if self.want_inflight and "--max-inflight" in opts:
                args += ["--max-inflight", str(self.max_inflight)]
            # parity with the Mosquitto config: same queue limit, no byte cap to speak of
            if "--max-queued-messages" in opts:
                # MQTT packet ids bound a session's queue (65535 in all, less the
                # in-flight window): the largest queue mqttamqp accepts.
                args += ["--max-queued-messages", str(min(self.max_queued, 64000))]
            if "--max-queued-bytes" in opts:
                args += ["--max-queued-bytes", str(1 << 30)]
            if "--max-connections" in opts:
                # Mosquitto runs with max_connections -1; mqttamqp's default (10,000)
                # would refuse half of the 20,000 idle connections
                args += ["--max-connections", str(1 << 20)]
            # Mosquitto runs a single MQTT listener; switch off the other listeners
            # (their default ports could also clash with other processes on the box)
            for opt in ("--amqp", "--web", "--mqtt-ws", "--metrics"):
                if opt in opts:
                    args += [opt, "none"]
            if self.sys_interval is not None and "--sys-interval" in opts:
                args += ["--sys-interval", str(self.sys_interval)]
            args += self.extra_args
            self.options_passed = args
            self.cmd = [twistd_bin(), "-n", "--pidfile=", "--logfile=" + self.log, "mqttamqp"] + args
            env.update(self.env_extra)
            cwd = MAIN
        else:
            raise ValueError(self.kind)
        logf = open(self.log + ".stdio", "wb")
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                     cwd=cwd, env=env, start_new_session=True,
                                     preexec_fn=raise_nofile)
        logf.close()
        _LIVE.add(self)
        self.wait_ready(ready_timeout)
        return self

    def wait_ready(self, timeout):
        """Bounded loop: TCP connect, then MQTT CONNECT -> CONNACK."""
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %s during start-up; log tail:\n%s"
                                   % (self.label, self.proc.returncode, self.log_tail()))
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=2.0)
                try:
                    s.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x00\x00\x04prob")
                    d = s.recv(4)
                    if len(d) >= 2 and d[0] == 0x20:
                        s.sendall(b"\xe0\x00")
                        return
                    last = "unexpected reply %r" % d
                finally:
                    s.close()
            except OSError as e:
                last = repr(e)
            time.sleep(0.05)
        raise RuntimeError("%s not ready after %.0fs (%s); log tail:\n%s"
                           % (self.label, timeout, last, self.log_tail()))

    def stop(self, timeout=10.0):
        p = self.proc
        if p is None:
            return
        try:
            stop_group(p, timeout)
        finally:
            self.exit_code = p.returncode
            _LIVE.discard(self)
            self.proc = None

    def cleanup(self):
        if self.tmp and os.path.isdir(self.tmp):
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- measurements
    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cpu_s(self):
        return proc_cpu_s(self.pid)

    def status(self):
        return proc_status(self.pid)

    def settle(self, max_s=10.0, window=0.5, idle_frac=0.05):
        """Wait (bounded) until the broker uses < idle_frac of a CPU over a window."""
        end = time.monotonic() + max_s
        c0 = self.cpu_s()
        while time.monotonic() < end:
            time.sleep(window)
            c1 = self.cpu_s()
            if c1 - c0 < idle_frac * window:
                return True
            c0 = c1
        return False

    def log_tail(self, n=3000):
        out = ""
        for path in (self.log, (self.log or "") + ".stdio"):
            try:
                with open(path, "rb") as f:
                    f.seek(0, 2)
                    size = f.tell()
                    f.seek(max(0, size - n))
                    txt = f.read().decode("utf-8", "replace")
                    if txt.strip():
                        out += "[%s]\n%s\n" % (os.path.basename(path), txt)
            except (OSError, TypeError):
                pass
        return out[-n:]


def stop_all():
    for b in list(_LIVE):
        try:
            b.stop(timeout=5)
        except Exception:
            pass
        b.cleanup()
