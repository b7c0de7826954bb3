"""Packaging: a non-editable install carries the twistd plugin and the console's files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
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
    assert "mqttamqp/console/templates/base.html" in names
    assert "mqttamqp/console/static/console.css" in names
    assert "mqttamqp/py.typed" in names
    assert "mqttamqp/console/site.py" in names
    assert "mqttamqp/console/apps/clients.py" in names


def test_non_editable_install_is_what_twistd_runs(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel into a venv, twistd lists mqttamqp from the venv's copy.

    The venv sees the packages of the interpreter running the tests (Twisted, ZODB,
    ...) through a .pth file, after its own: ``--system-site-packages`` would give it
    the *base* interpreter's instead when the suite itself runs in a venv (README's
    ``.venv``), where Twisted is not installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site_packages = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, timeout=60, capture_output=True, text=True).stdout.strip()
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (Path(site_packages) / "zz_outer_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in ours))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    twistd = [str(py), "-c", "from twisted.scripts.twistd import run; run()"]
    help_out = subprocess.run([*twistd, "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, env=env)
    assert "mqttamqp" in help_out.stdout
    probe = ("import mqttamqp, twisted.plugins.mqttamqp_plugin as p,"
             " mqttamqp.console.rendering as r;"
             "print(mqttamqp.__file__); print(p.__file__); print(r.templates_dir())")
    where = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env, check=True).stdout.split()
    site = str(venv)
    assert all(path.startswith(site) for path in where), where
    templates = Path(where[2]) / "base.html"
    assert templates.is_file()


def readme_command(section: str) -> str:
    """The sh block under README's ``## section`` heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^```sh\n(.*?)^```$", body, re.M | re.S)
    assert match is not None, section
    return match.group(1).strip()


def test_readme_commands_use_a_venv_and_ci_runs_the_test_command() -> None:
    """README's two commands work where Debian's python3 refuses pip (PEP 668): both
    go through .venv, nothing runs pip on the system Python, twistd writes no pid
    file into the current directory; README's test command is the named script
    .ci/test (.ci/setup, then pytest in .venv), and .ci/run calls that same script
    before the linters."""
    run = readme_command("Run it")
    assert "python3 -m venv .venv" in run and ".venv/bin/pip install ." in run
    assert ".venv/bin/twistd -n --pidfile= mqttamqp" in run
    assert "python3 -m pip" not in run and "break-system-packages" not in run
    test = readme_command("Test it")
    assert test == "bash .ci/test"
    script = (ROOT / ".ci" / "test").read_text()
    assert "bash .ci/setup" in script and ".venv/bin/python -m pytest" in script
    setup = (ROOT / ".ci" / "setup").read_text()
    assert "python3 -m venv .venv" in setup and "python3 -m pip" not in setup
    ci = [line.split("#", 1)[0].strip()
          for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test in ci, "\n".join(ci)
    ruff = next(i for i, line in enumerate(ci) if line.startswith(".venv/bin/python -m ruff"))
    assert ci.index(test) < ruff
    assert "README.md" not in "\n".join(ci)
