"""The store contract (``core.persistence``) in a fresh interpreter: importing and using
it loads no Twisted."""

from __future__ import annotations


def test_the_store_contract_runs_no_twisted() -> None:
    """core/persistence.py (the store contract) imports nothing of Twisted at run time."""
    import subprocess
    import sys

    code = ("import sys, mqttamqp.core.persistence; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'twisted'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"
