"""The network tricks of the protocol adapters, in one place: what goes past the
public API of Twisted, autobahn or proton for speed or memory, and why.

Modules (each says in its docstring why its trick pays):

* ``sending``: ``send`` writes to a plain TCP socket at once when nothing is
  buffered (one epoll round and one reactor turn less per hop), with
  ``register_push_producer`` and ``plain_tcp``; the transport classes they know in
  ``KINDS`` (compiled in the compiled build).
* ``tcp``: lean TCP transports. ``lean_port`` swaps a listening port's class
  (``port.__class__ = LeanPort``) so that a new connection is read in the turn
  that accepts it, and gives it a ``LeanServer`` transport without per-connection
  strings; ``others_waiting`` asks the reactor's poller whether another socket has
  input.
* ``accepting``: ``LeanPort``'s accept loop and ``LeanServer``'s ``__init__`` body as
  plain functions (compiled in the compiled build: ``tcp``'s classes subclass
  Twisted's and stay interpreted).
* ``accept``: a listener's accept failures (no descriptor, no memory) as a counter
  and one log line a spell (it replaces the port's private ``_logger``).
* ``fdtable``: the process's descriptor table grown once at start for
  ``--max-connections``, so that no ``accept`` waits for the kernel to grow it
  (an RCU grace period, in a process with threads).
* ``tls``: ``ssl:`` endpoints with TLS 1.2+ and client certificates (it replaces
  the endpoint's private ``_sslContextFactory``).
* ``websocket``: a WebSocket seen as a byte stream (``StreamOverWebSocket``), for a
  protocol written for TCP.
* ``dispatch``: ``lean_dispatch``, the epoll reactor's events handled without
  Twisted's per-event logging context (eight Python calls an event: at a paced
  1,000 msg/s each message is two events), and a plain read event of a TCP server
  transport handed to its protocol without ``_doReadOrWrite`` and ``doRead`` (four
  calls more), and a main loop that runs the timers only when one is due (six calls
  a turn); only over the bodies it was written from (their names' fingerprints),
  else Twisted's is kept, with one log line.
* ``rawproton``: proton-c's functions called by name (``cproton``) on the AMQP
  per-message path, looked up once.

Twisted's private names (``tcp``, ``accept``, ``tls``, ``dispatch``) and proton's internal
``cproton`` module (``rawproton``) are not promised to stay: pyproject.toml bounds both
from above at the newest release tested (Twisted 26.10, python-qpid-proton 0.40,
what CI installs), and ``tests/unit/net/test_net_pins.py`` checks every private name on the
installed versions, so that an upgrade fails a test, not production.  The same
test checks the autobahn internals ``mqtt.websocket`` overrides (autobahn is not
bounded: its private names are the MQTT WebSocket server's, not this package's).  To widen a
pin: install the new version, run that test and ``tests/unit/net/test_netio.py``.

What it must not do: import the broker's core or a protocol adapter
(``.importlinter``); it knows sockets, not MQTT or AMQP.
"""
