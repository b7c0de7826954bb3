"""The package's build: pyproject.toml has its metadata; this file only adds, when
asked, the broker's hot modules compiled to C by mypyc (``MQTTAMQP_COMPILE=1``).

Without it (the default) the package is pure Python.  With it, the modules in
``COMPILED`` are built as C extensions beside their ``.py`` files, one group in
mypyc's ``separate`` mode with its shared library ``mqttamqp_hot__mypyc``; the build
needs mypy (which carries mypyc), the package's dependencies (mypyc type-checks
against them) and setuptools 77 or later (a new venv has an older one) in the build
environment, a C compiler and the Python headers (Debian: ``python3-dev gcc``), so it
is done without build isolation, as README's "A faster build" says:

    .venv/bin/pip install . mypy 'setuptools>=77'
    MQTTAMQP_COMPILE=1 .venv/bin/pip install --no-build-isolation --no-deps --force-reinstall .

``bench/mypyc_build.py TREE`` builds the same modules in place in a checkout, and
``.ci/compiled`` runs the unit tests against them (docs/performance.md, "The compiled
build").  Why these modules, what did not compile and why: bench/README.md, "mypyc on
the hot path".
"""

from __future__ import annotations

import os

from setuptools import setup

# The delivery and connect paths (profiles of bench/deliver_inproc.py q1p/q1/fanin/
# fan311 and bench/connect_inproc.py).  Not here: core/queues/membership.py
# (queues.manager.QueueManager, not compiled, subclasses it).
COMPILED = """
mqtt/codec.py mqtt/reading.py mqtt/flows.py mqtt/protocol.py mqtt/outbound.py
mqtt/packets.py mqtt/decoders.py mqtt/executor.py mqtt/connection.py mqtt/link.py
mqtt/closing.py mqtt/decisions.py mqtt/deadlines.py mqtt/bodies.py mqtt/handshake.py
mqtt/inspect.py
core/routing/router.py core/routing/publishing.py core/routing/settlement.py
core/routing/topicstats.py core/sessions/session.py core/sessions/window.py
core/sessions/entries.py core/sessions/extras.py core/commits.py core/topics.py
core/message.py core/ratelog.py core/stats.py core/auth.py core/clients/gate.py
core/clients/live.py core/clients/registry.py security/bans.py archive/archive.py
archive/eventbuffer.py
""".split()


def ext_modules() -> list[object]:
    if os.environ.get("MQTTAMQP_COMPILE", "") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit("MQTTAMQP_COMPILE=1 needs mypy (mypyc) in the build environment: "
                         "pip install . mypy 'setuptools>=77', then MQTTAMQP_COMPILE=1 "
                         "pip install --no-build-isolation --no-deps --force-reinstall .  "
                         "(README.md, 'A faster build')") from None
    files = [os.path.join("mqttamqp", name) for name in COMPILED]
    # (its own mypy cache: a checkout's .mypy_cache, written by another environment's
    # mypy, made mypyc miss installed packages)
    return list(mypycify([f"--cache-dir={os.path.join('build', 'mypyc-cache')}", *files],
                         opt_level="3", debug_level="1",
                         separate=[(files, "mqttamqp_hot")]))


setup(ext_modules=ext_modules())
