"""A throw-away PostgreSQL cluster on 127.0.0.1 for the tests that need one.

Debian's ``postgresql`` package (15 on Debian 12): ``initdb``, ``pg_ctl`` and
``createdb`` from ``/usr/lib/postgresql/N/bin``.  PostgreSQL refuses to run as root,
so as root every command runs as the ``postgres`` user (``runuser``), in a directory
that user owns; the socket is in that directory too and the server listens on
127.0.0.1 only, on a free port, with ``trust`` authentication (nothing else can reach
it).  ``stop()`` stops exactly the server this started (``pg_ctl stop`` on its data
directory) and removes the directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import uuid

from ports import free_port


def pg_bin() -> str | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


class PostgresCluster:
    """One server; ``create_database()`` gives each test a database of its own."""

    def __init__(self) -> None:
        bindir = pg_bin()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bindir
        self.root = tempfile.mkdtemp(prefix="mqttamqp-pg-", dir="/tmp")
        os.chmod(self.root, 0o755)
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *args: str, timeout: float = 60) -> None:
        subprocess.run([*self.as_user, *args], check=True, timeout=timeout,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def start(self) -> PostgresCluster:
        self._run(os.path.join(self.bin, "initdb"), "-D", self.data, "-A", "trust",
                  "-U", "postgres", "--no-sync", "-E", "UTF8")
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-k {self.root} -c fsync=on -c max_connections=200")
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l",
                  os.path.join(self.data, "server.log"), "-o", options, "-w", "-t", "60",
                  "start")
        self.started = True
        return self

    def create_database(self) -> str:
        """A new, empty database; returns its ``postgresql://`` URI."""
        name = "t_" + uuid.uuid4().hex[:12]
        self._run(os.path.join(self.bin, "createdb"), "-h", "127.0.0.1", "-p",
                  str(self.port), "-U", "postgres", name)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def psql(self, database: str, sql: str) -> str:
        """Run ``sql`` in ``database`` (as the superuser); returns its output."""
        out = subprocess.run(
            [os.path.join(self.bin, "psql"), "-h", "127.0.0.1", "-p", str(self.port),
             "-U", "postgres", "-d", database, "-At", "-c", sql],
            check=True, timeout=30, capture_output=True, text=True)
        return out.stdout

    def stop(self) -> None:
        try:
            if self.started:
                self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate",
                          "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
