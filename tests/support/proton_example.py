"""Run one of python-qpid-proton's example scripts unchanged against a broker on a
port of the test's own: ``python proton_example.py PORT SCRIPT [ARG...]``.

Most examples take ``-a host:port/address``; a few (helloworld.py,
helloworld_blocking.py, server_tx.py, queue_browser.py, tx_recv_interactive.py)
connect to ``localhost:5672`` with no option to change it.  Integration tests
listen on port 0, never on a fixed port, so this launcher answers the name
lookup of ``localhost:5672`` (and only that) with ``127.0.0.1:PORT`` and then
runs the script as ``__main__``, its own code untouched.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
from typing import Any

_real_getaddrinfo = socket.getaddrinfo


def main() -> None:
    port = int(sys.argv[1])
    script = sys.argv[2]

    def getaddrinfo(host: Any, service: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("localhost", b"localhost") and str(service) in ("5672", "amqp"):
            host, service = "127.0.0.1", port
        return _real_getaddrinfo(host, service, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo   # type: ignore[assignment]
    sys.argv = [script, *sys.argv[3:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
