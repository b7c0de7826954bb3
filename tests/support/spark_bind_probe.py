"""Run as a child process by ``test_pipeline_bind``: the report's real command line
(``cli.main``) twice in one process, once as given and once with ``--spark-ui``,
recording for each run what Spark was told and where it listens.

A child process because the test run's own Spark session would be reused (and then
stopped) by ``make_session``, and because ``SPARK_LOCAL_IP`` must not be inherited
from the test process. ``report.build_report`` is wrapped so that the record is
taken while the job's session is up: its SparkConf, its UI address, and every
listening TCP socket of the driver's JVM and of this Python process, read from
``/proc``. One JSON object is printed on stdout at the end.

Usage: ``python spark_bind_probe.py ARCHIVE OUT [extra cli arguments]``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from typing import Any


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} prints each 32-bit word in host (little-endian) order.
    fixed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(fixed)
    mapped = getattr(address, "ipv4_mapped", None)   # Java's dual-stack sockets
    return str(mapped or address)


def listening(pid: int) -> list[str]:
    """``address:port`` of every listening TCP socket the process holds."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:   # 0A: LISTEN
                    host, port = local.split(":")
                    found.append(f"{_address(host)}:{int(port, 16)}")
    return sorted(found)


def main(argv: list[str]) -> int:
    from mqttamqp.pipeline import cli, report

    archive, out, extra = argv[1], argv[2], argv[3:]
    records: list[dict[str, Any]] = []
    real = report.build_report

    def spy(spark: Any, opts: Any, on_stage: Any) -> Any:
        sc = spark.sparkContext
        records.append({"conf": dict(sc.getConf().getAll()), "ui": sc.uiWebUrl,
                        "jvm": listening(sc._gateway.proc.pid),
                        "python": listening(os.getpid())})
        return real(spark, opts, on_stage)

    report.build_report = spy   # main imports it from the module when it runs
    codes = [cli.main(["--archive", archive, "--out", os.path.join(out, "default"),
                       *extra]),
             cli.main(["--archive", archive, "--out", os.path.join(out, "ui"),
                       "--spark-ui", *extra])]
    print(json.dumps({"codes": codes, "records": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
