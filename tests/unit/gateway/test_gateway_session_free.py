"""Gateway mode's upstream engine when the core ends a session whose links are still
attached (found by the h-amqp10c review): the session is freed (``_free_closed``)
while link wrappers of it may outlive the session's, and proton frees those links
with the session though a wrapper still holds them: "double free or corruption"
when the wrapper goes.  Not fixed yet (h-fix1's report: what was tried; holding the
session's wrapper in each link's attributes stops the crash but keeps ~7.5 KB per
such session until the connection ends); this pins it, in a subprocess so that the
crash fails the test instead of ending pytest.

The script: a proton server engine in memory stands for the core; each round the
gateway begins a session with three links, the server detaches one, then (every
other round with the other two still attached) ends the session.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = r'''
import gc
from proton import Collector, Connection, Event, Transport
from twisted.internet.task import Clock
from mqttamqp.gateway.engine import UpstreamConnection
from mqttamqp.gateway.target import Upstream

class Owner:
    def upstream_open(self, conn): pass
    def upstream_lost(self, conn, reason): pass

class Wire:
    def __init__(self): self.buf = []
    def write(self, data): self.buf.append(data)
    def loseConnection(self): pass
    def abortConnection(self): pass

class Channel:
    def on_link_closed(self, link, reason): pass
    def on_session_closed(self): pass
    def on_link_open(self, link): pass
    def on_flow(self, impl): pass
    def lost(self, reason): pass

uc = UpstreamConnection(Owner(), Clock(), Upstream("h", 1, False), "gw", 0, 65536)
uc.transport = Wire()
uc.connectionMade()
srv = Connection(); st = Transport(Transport.SERVER); st.bind(srv)
col = Collector(); srv.collect(col)

def pump():
    for _ in range(6):
        uc._pump()
        if uc.transport.buf:
            data = b"".join(uc.transport.buf); uc.transport.buf = []; st.push(data)
        n = st.pending()
        if n > 0:
            data = st.peek(n); st.pop(n); uc.dataReceived(bytes(data))
    uc._pump()

def server_events():
    opened = []
    while True:
        e = col.peek()
        if e is None:
            break
        if e.type == Event.CONNECTION_REMOTE_OPEN: srv.open()
        if e.type == Event.SESSION_REMOTE_OPEN: e.session.open()
        if e.type == Event.LINK_REMOTE_OPEN: e.link.open(); opened.append(e.link)
        col.pop()
    return opened

pump(); server_events(); pump()
assert uc.open
for round in range(300):
    channel = Channel()
    session = uc.begin(channel)
    links = []
    for i in range(3):
        link = session.sender(f"l{round}-{i}"); link.target.address = "t"; link.open()
        uc.register(link, channel); links.append(link)
    pump(); theirs = server_events(); pump()
    theirs[0].close(); pump(); server_events()
    if round % 2:
        for other in theirs[1:]:
            other.close()
    theirs[0].session.close(); pump(); server_events(); pump()
    del session, theirs, links   # (the session's wrapper goes, and all but the last
    gc.collect()                 # link's, which lives on into the next round)
print("ok", len(uc.sessions), len(uc.links))
'''


@pytest.mark.xfail(reason="not fixed: proton frees a freed session's links with it though "
                          "a wrapper still holds them (h-fix1 report)", strict=False)
def test_a_session_ended_with_links_attached_is_freed_without_a_crash() -> None:
    """The core ends a session while two of its links are attached, its wrapper is
    dropped before theirs: the process survives 300 such rounds."""
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok")
