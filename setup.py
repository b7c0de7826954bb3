"""The package's build: pyproject.toml has its metadata; this file only adds, when
asked, the broker's hot modules compiled to C by mypyc (``MQTTAMQP_COMPILE``).

``MQTTAMQP_COMPILE`` unset or ``0``: pure Python.  ``1``: the modules in ``COMPILED``
are built as C extensions beside their ``.py`` files, one group in mypyc's ``separate``
mode with its shared library ``mqttamqp_hot__mypyc``, and any failure stops the build.
``auto`` (README's start command): the same, but if the build environment cannot
compile them (no mypy, a type error mypyc reports, a compiler that fails) the package
is built pure Python, with one line saying why (pip shows a build's output with
``-v`` only; the broker's start-up line names the build it runs).  The compiled
build needs mypy (which carries mypyc), the package's dependencies (mypyc
type-checks against them) and setuptools 77 or later (a new venv has an older one) in
the build environment, a C compiler and the Python headers (Debian: ``python3-dev
gcc``), so it is done without build isolation, as README says:

    .venv/bin/pip install . mypy 'setuptools>=77'
    MQTTAMQP_COMPILE=auto .venv/bin/pip install --no-build-isolation --no-deps --force-reinstall .

``bench/mypyc_build.py TREE`` builds the same modules in place in a checkout, and
``.ci/test`` runs the test suite against them (docs/performance.md, "The compiled
build").  Why these modules, what did not compile and why: bench/README.md, "mypyc on
the hot path".
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The delivery and connect paths (profiles of bench/deliver_inproc.py q1p/q1/fanin/
# fan311 and bench/connect_inproc.py).  Not here: core/queues/membership.py
# (queues.manager.QueueManager, not compiled, subclasses it).
COMPILED = """
mqtt/codec.py mqtt/reading.py mqtt/flows.py mqtt/protocol.py mqtt/outbound.py
mqtt/packets.py mqtt/decoders.py mqtt/executor.py mqtt/connection.py mqtt/link.py
mqtt/closing.py mqtt/decisions.py mqtt/deadlines.py mqtt/bodies.py mqtt/handshake.py
mqtt/inspect.py mqtt/fields.py mqtt/opened.py
core/routing/published.py core/persistence.py
core/routing/router.py core/routing/subscriptions.py core/routing/publishing.py
core/routing/settlement.py core/routing/topicstats.py core/sessions/session.py
core/sessions/window.py core/sessions/entries.py core/sessions/extras.py
core/commits.py core/topics.py core/message.py core/ratelog.py core/stats.py
core/auth.py core/clients/gate.py core/clients/live.py core/clients/registry.py
security/bans.py security/admission.py security/storeauth.py
archive/archive.py archive/eventbuffer.py adapter/meter.py
amqp/links.py amqp/incoming.py amqp/publisher.py amqp/subscribers.py amqp/queuelinks.py
amqp/transactions.py amqp/codec/publish.py amqp/codec/encode.py
amqp/pump.py amqp/enginechores.py net/rawproton.py net/dispatch.py net/sending.py
net/accepting.py
""".split()


MODE = os.environ.get("MQTTAMQP_COMPILE", "0")
HOW = ("pip install . mypy 'setuptools>=77', then MQTTAMQP_COMPILE=1 pip install "
       "--no-build-isolation --no-deps --force-reinstall .  (README.md, 'The compiled build')")


def pure(why: str) -> list[object]:
    """``auto``'s fallback: one line on standard error, and no extension."""
    sys.stderr.write(f"mqttamqp: building pure Python, not compiled: {why}\n")
    return []


def ext_modules() -> list[object]:
    if MODE not in ("0", "1", "auto"):
        raise SystemExit(f"MQTTAMQP_COMPILE={MODE!r}: give 0 (pure Python, the default), "
                         "1 (compiled, or fail) or auto (compiled where it can be)")
    if MODE == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        if MODE == "auto":
            return pure("mypy (mypyc) is not in the build environment")
        raise SystemExit(f"MQTTAMQP_COMPILE=1 needs mypy (mypyc) in the build environment: {HOW}"
                         ) from None
    files = [os.path.join("mqttamqp", name) for name in COMPILED]
    try:
        # (its own mypy cache: a checkout's .mypy_cache, written by another
        # environment's mypy, made mypyc miss installed packages)
        return list(mypycify([f"--cache-dir={os.path.join('build', 'mypyc-cache')}", *files],
                             opt_level="3", debug_level="1",
                             separate=[(files, "mqttamqp_hot")]))
    except (Exception, SystemExit) as failure:   # mypyc exits on a type error
        if MODE == "auto":
            return pure(f"mypyc failed ({type(failure).__name__}; its messages are above, "
                        "which pip shows with -v)")
        raise


class BuildExt(build_ext):
    """``auto``: a compiler failure leaves the package pure Python.  All or none: the
    compiled modules import the shared library, so what was built is removed."""

    def run(self) -> None:
        if MODE != "auto":
            super().run()
            return
        inplace = self.inplace   # (setuptools clears it during the run, and on a failure
        try:                     # does not set it back)
            super().run()
        except Exception as failure:   # CompileError, LinkError, a missing compiler
            built = self.get_outputs() + (self._inplace_outputs() if inplace else [])
            for path in built:
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []
            pure(f"the C compiler failed ({type(failure).__name__}; its messages are "
                 "above, which pip shows with -v)")

    def _inplace_outputs(self) -> list[str]:
        build_py = self.get_finalized_command("build_py")
        return [os.path.join(build_py.get_package_dir(".".join(ext.name.split(".")[:-1])),
                             os.path.basename(self.get_ext_filename(ext.name)))
                for ext in self.extensions]


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
