"""Compile a checkout's hot modules with mypyc, in place (issue 31; bench/README.md,
"mypyc on the hot path").  A measuring tool: the package's own build is setup.py's
(``MQTTAMQP_COMPILE=1``), and this runs it in place for the in-process tools:

    python bench/mypyc_build.py TREE            build TREE's hot modules in place
    python bench/mypyc_build.py TREE --clean    remove what a build left

Run it with the interpreter that will import the result (it needs mypy, a C compiler
and the Python headers: Debian's ``python3-dev gcc``; mypy is a test dependency).  It
runs ``TREE/setup.py build_ext --inplace`` with ``MQTTAMQP_COMPILE=1``: ``TREE/build/``,
one ``.so`` next to each compiled ``.py`` (which then wins the import) and the shared
library ``TREE/mqttamqp_hot__mypyc*.so``; ``--clean`` removes them all, and TREE is
pure Python again.  About 2 minutes on two cores; the in-process tools then measure
TREE as usual (``deliver_inproc.py TREE ...``; check ``mqttamqp.x.__file__``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys


def clean(tree: str) -> None:
    shutil.rmtree(os.path.join(tree, "build"), ignore_errors=True)
    for path in (glob.glob(os.path.join(tree, "*__mypyc*.so"))
                 + glob.glob(os.path.join(tree, "mqttamqp", "**", "*.so"), recursive=True)):
        os.remove(path)


def build(tree: str) -> None:
    env = dict(os.environ, MQTTAMQP_COMPILE="1")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                   cwd=tree, env=env, check=True)


def main() -> None:
    tree = os.path.abspath(sys.argv[1])
    clean(tree)
    if "--clean" not in sys.argv[2:]:
        build(tree)


if __name__ == "__main__":
    main()
