"""Packaging: a non-editable install carries the twistd plugin and the console's files."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, timeout=240, cwd=out)
    (built,) = out.glob("mqttamqp-*.whl")
    return built


def test_wheel_contents(wheel: Path) -> None:
    """The wheel has the plugin (no twisted/__init__.py), templates, static files and py.typed."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twisted/plugins/mqttamqp_plugin.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert not any(n.endswith("dropin.cache") for n in names)
    assert "mqttamqp/console_templates/base.html" in names
    assert "mqttamqp/console_static/console.css" in names
    assert "mqttamqp/py.typed" in names
    assert "webui/site.py" in names


def test_non_editable_install_is_what_twistd_runs(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel into a venv, twistd lists mqttamqp from the venv's copy."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    twistd = [str(py), "-c", "from twisted.scripts.twistd import run; run()"]
    help_out = subprocess.run([*twistd, "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=env)
    assert "mqttamqp" in help_out.stdout
    probe = ("import mqttamqp, twisted.plugins.mqttamqp_plugin as p, webui.rendering as r;"
             "print(mqttamqp.__file__); print(p.__file__)")
    where = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env, check=True).stdout.split()
    site = str(venv)
    assert all(path.startswith(site) for path in where), where
    templates = Path(where[0]).parent / "console_templates" / "base.html"
    assert templates.is_file()
