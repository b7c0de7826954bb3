"""Compile the broker's hot modules with mypyc, in place (issue 31's mypyc spike;
bench/README.md, "mypyc on the hot path").  A measuring tool, not the package's build:

    python bench/mypyc_build.py TREE            build TREE's hot modules in place
    python bench/mypyc_build.py TREE --clean    remove what a build left

Run it with the interpreter that will import the result (Debian's Python needs
``python3-dev`` for ``/usr/include/python3.11``; mypy, hence mypyc, is a test
dependency).  It writes ``TREE/build/``, one ``.so`` next to each compiled ``.py``
(which then wins the import) and the shared library ``TREE/mqttamqp_hot__mypyc*.so``:
``--clean`` removes them all, and TREE is pure Python again.  The modules are
compiled as one group in mypyc's ``separate`` mode: in its whole-program mode a
method of a non-native class refuses an instance of a subclass mypyc did not compile
(``MQTTProtocol``'s mixins; mypyc ignores ``allow_interpreted_subclasses`` there).
About 4 minutes on two cores (20 MB of C); the in-process tools then measure TREE as
usual (``deliver_inproc.py TREE ...``; check ``mqttamqp.x.__file__``).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys

# The delivery and connect paths (profiles of deliver_inproc.py q1p/q1/fanin/fan311 and
# connect_inproc.py).  Not here: mqtt/handshake.py and mqtt/inspect.py (property
# setters in a class that cannot be native), core/queues/membership.py
# (queues.manager.QueueManager, not compiled, subclasses it).
HOT = """
mqtt/codec.py mqtt/reading.py mqtt/flows.py mqtt/protocol.py mqtt/outbound.py
mqtt/packets.py mqtt/decoders.py mqtt/executor.py mqtt/connection.py mqtt/link.py
mqtt/closing.py mqtt/decisions.py mqtt/deadlines.py mqtt/bodies.py
core/routing/router.py core/routing/publishing.py core/routing/settlement.py
core/routing/topicstats.py core/sessions/session.py core/sessions/window.py
core/sessions/entries.py core/sessions/extras.py core/commits.py core/topics.py
core/message.py core/ratelog.py core/stats.py core/auth.py core/clients/gate.py
core/clients/live.py core/clients/registry.py security/bans.py archive/archive.py
archive/eventbuffer.py
""".split()


def clean(tree: str) -> None:
    shutil.rmtree(os.path.join(tree, "build"), ignore_errors=True)
    for path in (glob.glob(os.path.join(tree, "*__mypyc*.so"))
                 + glob.glob(os.path.join(tree, "mqttamqp", "**", "*.so"), recursive=True)):
        os.remove(path)


def build(tree: str) -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    os.chdir(tree)
    files = [os.path.join("mqttamqp", name) for name in HOT]
    setup(name="mqttamqp_hot", script_args=["build_ext", "--inplace"],
          ext_modules=mypycify(files, opt_level="3", debug_level="1",
                               separate=[(files, "mqttamqp_hot")]))


def main() -> None:
    tree = os.path.abspath(sys.argv[1])
    clean(tree)
    if "--clean" not in sys.argv[2:]:
        build(tree)


if __name__ == "__main__":
    main()
