"""Python bytecodes per MQTT CONNECT, by function, self and inclusive: what
``connect_inproc.py`` runs, counted with ``sys.settrace`` opcode events (a call
stack kept, so a function's inclusive count is what ran while it was on it).

    python bench/connect_opcodes.py TREE N [TOP] [--json FILE]

``TREE`` and ``N`` as ``connect_inproc.py`` (which this runs, its collection
window being the connects only).  Prints bytecodes and Python calls per connect,
then the ``TOP`` functions (default 60) by inclusive count: inclusive, self, calls
per connect.  A dataclass's generated ``__init__`` is named by its caller.  The
counts are exact and do not move with the machine's load; instructions are
callgrind's (``connect_inproc.py --callgrind``): on Debian's Python 3.11 a connect
ran ~58 instructions a bytecode (2026-11-30).  Never use the figures in a test.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections import Counter
from typing import Any


def main() -> None:
    args = sys.argv[1:]
    dump = None
    if "--json" in args:
        i = args.index("--json")
        dump = args[i + 1]
        del args[i:i + 2]
    tree, n = args[0], args[1]
    top = int(args[2]) if len(args) > 2 else 60
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [tree, os.path.join(here, "..", "tests", "support"), here]
    import amqp_cost

    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    stack: list[str] = []

    def key(code: Any) -> str:
        path = code.co_filename.rsplit("mqttamqp/", 1)[-1].rsplit("site-packages/", 1)[-1]
        return f"{path}:{code.co_firstlineno} {code.co_qualname}"

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            k = key(frame.f_code)
            if frame.f_code.co_filename == "<string>":
                k = "dataclass init from " + stack[-1]
            stack.append(k)
            calls[k] += 1
            frame.f_trace_opcodes = True
            return trace
        if event == "opcode":
            own[stack[-1]] += 1
            for k in set(stack):
                inclusive[k] += 1
        elif event == "return":
            stack.pop()
        return trace

    on = [False]

    def toggle() -> None:
        if on[0]:
            sys.settrace(None)
        else:
            stack[:] = ["<connects>"]
            sys.settrace(trace)
        on[0] = not on[0]

    amqp_cost.callgrind_toggle = lambda: toggle
    sys.argv = ["connect_inproc.py", tree, n, "--callgrind"]
    runpy.run_path(os.path.join(here, "connect_inproc.py"), run_name="__main__")
    count = int(n)
    print(f"bytecodes per connect {sum(own.values()) / count:.1f}, "
          f"Python calls {sum(calls.values()) / count:.1f}")
    for k, v in inclusive.most_common(top):
        print(f"{v / count:8.1f} {own[k] / count:7.1f} {calls[k] / count:5.2f}  {k}")
    if dump:
        with open(dump, "w") as f:
            json.dump({"n": count, "self": own, "incl": inclusive, "calls": calls}, f)


if __name__ == "__main__":
    main()
