"""The broker's AMQP 1.0 listener when a client ends a session whose links are still
attached, one of them with a transfer waiting for its durable commit (the gateway's
double free, ``tests/unit/gateway/test_gateway_session_free.py``, seen from the
other end): proton frees the links with the session and leaves them looking bound;
the delivery held across the commit holds its link until the commit is done.

In a subprocess so that a crash fails the test instead of ending pytest: one client
connection (``amqp_memory.Net``, a proton client engine, ``ManualStore`` commits) runs
150 rounds of a session with a sender to a durable queue and a receiver, a transfer
sent, the session ended with both links attached, then the commit.
"""

from __future__ import annotations

from c_heap import run_script

_SCRIPT = r'''
import gc
from amqp_memory import Net
from fakes import ManualStore
from proton import Message

from c_heap import c_heap_in_use

store = ManualStore()
net = Net(store=store)
app = net.amqp()
rounds, marks, waited, held = 150, {}, 0, []
for round in range(rounds):
    if round in (50, rounds - 1):
        marks[round] = c_heap_in_use()
    ssn = app.conn.session(); ssn.open()
    snd = ssn.sender(f"s{round}"); snd.target.address = "$queue/ended"; snd.open()
    rcv = ssn.receiver(f"r{round}"); rcv.source.address = "t/ended"; rcv.open(); rcv.flow(5)
    net.pump()
    dlv = snd.delivery(b"t%d" % round)
    snd.send(Message(body="m", durable=True).encode()); snd.advance()
    net.pump()
    waited += len(store.pending)
    ssn.close()              # (both links still attached)
    net.pump()
    held.append(len(app.server._held_sessions))   # (the engine's own hold)
    store.commit_all()       # (the delivery held across it is let go after the end)
    net.pump()
    del snd, rcv, dlv        # (the client's own end: its links' wrappers first)
    gc.collect()
    ssn.free(); del ssn
    net.pump()
assert not app.lost
app.conn.session().open()   # (input, so the broker pumps: a session held is let go
net.pump()                  # at the end of the first pump after its last holder went)
left = len(app.server._held_sessions)
print("ok", waited, min(held), max(held), left, (marks[rounds - 1] - marks[50]) / (rounds - 51))
'''


def test_a_client_ending_sessions_with_links_attached_neither_crashes_nor_grows() -> None:
    """150 sessions ended with a sender (its transfer waiting for the commit) and a
    receiver attached: the process survives, the connection stays, the engine holds
    the one freed session each round (none at the end) and the C heap grows by no more than a queued
    message a round."""
    word, waited, least, most, left, growth = run_script(_SCRIPT)
    assert word == "ok"
    assert int(waited) == 150          # every round's transfer waited for its commit
    # (each round's ended session is held by the engine, its links still looking
    # bound, until a pump after its transfer's commit; never more than that one)
    assert (int(least), int(most)) == (1, 1)
    assert int(left) == 0              # (given back once nothing else held it)
    # (the queue keeps each round's message; a session kept would be ~5 KB)
    assert float(growth) < 1000, f"the C heap grew {growth} B a round"
