"""``--print-config`` through the real ``twistd`` command line."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from brokerproc import TWISTD, assert_refused_before_start

pytestmark = pytest.mark.timeout(60)



def test_print_config_through_twistd(tmp_path: Path) -> None:
    """The real twistd prints the file with the command line applied and exits 0;
    a bad file stops it with status 1 and the one line."""
    config = tmp_path / "mqttamqp.toml"
    config.write_text("max-inflight = 7\n[[webhook]]\nurl = 'http://127.0.0.1:9/'\n",
                      encoding="utf-8")
    path = str(config)
    env = dict(os.environ)   # keeps PYTHONPATH: the code under test, not an install
    out = subprocess.run([TWISTD, "mqttamqp", "--config", path, "--max-packet-size", "999",
                          "--print-config"], capture_output=True, text=True, timeout=60,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    printed = tomllib.loads(out.stdout)
    assert printed["max-inflight"] == 7 and printed["max-packet-size"] == 999
    assert printed["webhook"][0]["url"] == "http://127.0.0.1:9/"
    (tmp_path / "bad.toml").write_text("max-inflight = 7\nmax-infligt = 3\n", encoding="utf-8")
    bad = str(tmp_path / "bad.toml")
    out = subprocess.run([TWISTD, "-n", "--pidfile=", "mqttamqp", "--config", bad,
                          "--data", str(tmp_path / "data")],
                         capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert_refused_before_start(
        out, f"--config {bad}, line 2: max-infligt: unknown key (not an option of "
             "twistd mqttamqp --help)", tmp_path)
