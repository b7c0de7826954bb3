"""The broker's authenticator alone: N anonymous CONNECTs from 127.0.0.1 through
``StoreAuthenticator.authenticate`` (no users, a store in a temporary directory, a
``Clock`` as its reactor so that its turn's look at the store holds), each with a
``Credentials`` and a peer string of its own.

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no \\
        --callgrind-out-file=OUT python bench/auth_inproc.py TREE N

``TREE``: the checkout whose ``mqttamqp`` is measured (first on ``sys.path``).  Under
callgrind, collection is on for exactly the calls: (Collected at 3N - at N) / 2N is
the instructions a call.  Never use the figures in a test.
"""

from __future__ import annotations

import os
import sys
import tempfile


def main() -> None:
    tree, n = sys.argv[1], int(sys.argv[2])
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [tree, here]
    import mqttamqp
    assert mqttamqp.__file__ is not None and mqttamqp.__file__.startswith(tree)
    from amqp_cost import callgrind_toggle
    from twisted.internet.task import Clock

    from mqttamqp.core.auth import Credentials
    try:
        from mqttamqp.security.storeauth import StoreAuthenticator
    except ImportError:   # (before session 24: in userstore.py)
        from mqttamqp.security.userstore import StoreAuthenticator  # type: ignore
    from mqttamqp.security.userstore import UserStore

    with tempfile.TemporaryDirectory() as tmp:
        auth = StoreAuthenticator(UserStore(tmp), reactor=Clock())
        creds = [Credentials(f"c{i}", None, None, "mqtt", f"127.0.0.1:{10000 + i % 50000}")
                 for i in range(n)]
        toggle = callgrind_toggle()
        toggle()
        for c in creds:
            if auth.authenticate(c) is not True:
                raise SystemExit("refused")
        toggle()


if __name__ == "__main__":
    main()
