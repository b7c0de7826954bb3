"""A session's in-flight window: what goes out, and what an acknowledgement does.

``InflightWindow`` is the part of ``session.Session`` that moves entries from the
queue into the window while the link can take them (``pump``; a new entry when
nothing waits goes in directly, ``Session.deliver``), and out of it as
the subscriber answers: PUBACK, PUBREC (the durable RELEASED state before PUBREL),
PUBCOMP, an FE's AMQP_PUBREL, AMQP Released/Modified (redelivered) and Rejected
(dropped, counted).  Each answer returns the store operations it implies; the
caller commits them.  A mixin (its slots are part of
every ``Session``), so that every call on the hot path stays one method call.

What it must not do: talk to storage or sockets (the link sends).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, MutableSet

from mqttamqp.core.message import Message
from mqttamqp.core.persistence import DeleteQueued, Op, QueuedState
from mqttamqp.core.sessions.entries import (
    NATIVE_CALLS,
    NO_IDS,
    NO_INFLIGHT,
    NO_OPS,
    NO_QUEUE,
    ClientLink,
    DeliveryReceipt,
    NativeLink,
    OutEntry,
)
from mqttamqp.native import mypyc_attr

__all__ = ["InflightWindow", "ack_problem"]

_SENT = QueuedState.SENT


def ack_problem(kind: str, packet_id: int, qos: int, released: bool) -> str | None:
    """Why an MQTT acknowledgement ``kind`` (PUBACK, PUBREC or PUBCOMP) does not fit
    a message in flight as ``packet_id`` at ``qos`` (``released``: its PUBREC came, so
    PUBREL is or will be out) — a protocol violation — or None.  The one rule of the
    broker's sessions and of a gateway's connections (``gateway.deliveries``)."""
    if kind == "PUBACK":
        if qos == 1:
            return None
        stage = "after PUBREL" if released else "before PUBREC"
        return f"PUBACK for packet id {packet_id}, a QoS 2 message in flight ({stage})"
    if qos != 2:
        return f"{kind} for packet id {packet_id}, a QoS 1 message in flight"
    if kind == "PUBCOMP" and not released:
        return f"PUBCOMP for packet id {packet_id} before PUBREC"
    return None


@mypyc_attr(allow_interpreted_subclasses=True)
class InflightWindow:
    # The window's state (``Session.__init__`` sets it).
    __slots__ = ("_next_pid", "_next_seq", "_pids", "delivered", "dropped", "inflight", "queue",
                 "queue_prefetch", "queue_waiting", "queued_bytes", "stalled", "window")

    queue: deque[OutEntry]
    queued_bytes: int
    inflight: dict[int, OutEntry]
    window: int
    # Deliveries a queue may have outstanding with it (0: --queue-prefetch): an AMQP
    # 0.9.1 consumer's basic.qos prefetch (``amqp091.consumers``).
    queue_prefetch: int
    # A durable queue's delivery was refused (it would have waited over the bound),
    # or a queue passed this session over while entries waited here: what feeds
    # its queue groups again once the window frees with nothing queued here
    # (``feed_queues``); None otherwise, the only cost then a test per
    # acknowledgement.
    queue_waiting: Callable[[], None] | None
    dropped: int
    delivered: int
    _pids: MutableSet[int]
    _next_seq: int   # (the next entry's sequence number)
    _next_pid: int   # (where the search for a free packet id starts)
    # What it reads of the session's own.
    client_id: str
    link: ClientLink | None
    # The two flags last, side by side: in the compiled build (setup.py) a native
    # class stores a ``bool`` as one byte, and fields in the order declared here, then
    # ``Session``'s, after its 4-byte bitmap (its ``float``, ``last_seen``): together
    # the three fill one 8-byte word, where apart each took a word of its own, and the
    # session is pymalloc's 240-byte class, as in pure Python (tests/unit/core/
    # test_session.py).  (Pure Python's layout is ``__slots__``'s, not this.)
    persistent: bool
    stalled: bool   # (see ``Session.over_high_water``)

    def _allocate_pid(self) -> int:
        """A free packet id, the next after the last one handed out."""
        if len(self._pids) >= 65535:
            raise RuntimeError("no free packet id")
        pid = self._next_pid
        while pid in self._pids:
            pid = pid % 65535 + 1
        self._next_pid = pid % 65535 + 1
        if self._pids is NO_IDS:
            self._pids = set()
        self._pids.add(pid)
        return pid

    def pump(self) -> None:
        """Send queued entries while the window and the link allow, in order."""
        link = self.link
        if link is None:
            return
        queue = self.queue
        inflight = self.inflight
        window = self.window
        # (``send_publish`` of a ``NativeLink`` called natively in the compiled build)
        native: NativeLink | None = link if NATIVE_CALLS and isinstance(link, NativeLink) else None
        # (``congested`` by name: a queue link's is a property, credit included)
        while queue and len(inflight) < window and not link.congested:
            entry = queue[0]
            if entry.held or entry.gated:
                break
            queue.popleft()
            self.queued_bytes -= len(entry.message.payload)
            if inflight is NO_INFLIGHT:
                inflight = self.inflight = {}
            inflight[entry.packet_id] = entry
            if entry.state == QueuedState.RELEASED:
                link.send_pubrel(entry.packet_id)
            else:
                entry.state = QueuedState.SENT
                ids = entry.subscription_ids
                if native is not None:
                    native.send_publish(entry.message, entry.qos, entry.packet_id, entry.dup,
                                        entry.retain, ids)
                elif ids:   # (MQTT 5 only: other links need not know the parameter)
                    link.send_publish(entry.message, entry.qos, entry.packet_id, entry.dup,
                                      entry.retain, ids)
                else:
                    link.send_publish(entry.message, entry.qos, entry.packet_id, entry.dup,
                                      entry.retain)
                entry.dup = True  # any later send of it is a redelivery

    def _would_wait(self, gated: bool) -> bool:
        """Would a new entry wait in the queue rather than go out at once?  Only
        what waits is bound by --max-queued-messages/-bytes: an entry that goes
        straight into the window (nothing queued, room in flight, the link online
        and uncongested, not gated) is never refused by them, whatever its size,
        QoS or expiry.  A persistent session's QoS 2 entry is held only for its
        own commit, then sent (``release_held``): not waiting either."""
        link = self.link
        return bool(self.queue or link is None or link.congested
                    or len(self.inflight) >= self.window or gated)

    def send_credited(self, message: Message, receipt: DeliveryReceipt) -> OutEntry | None:
        """A durable queue's QoS 1 delivery (with its ``receipt``) sent at once, the
        queue's short path past ``Session.deliver``'s queue and ``pump``: only when
        the caller found the link online and uncongested with nothing queued here
        a moment ago (``Dispatch._credit``) and the window has room; the entry in
        flight is returned.  None: not the simple case, nothing done (the caller
        takes ``Session.deliver``, which applies the bounds)."""
        link = self.link
        inflight = self.inflight
        # (--max-queued-messages/-bytes bound what waits in the session's queue; this
        # goes straight into the window, past an empty queue: nothing waits)
        if (link is None or self.queue or len(inflight) >= self.window
                or len(self._pids) >= 65535 or ((props := message.props) is not None
                                                and props.expiry_interval is not None)):
            return None
        seq = self._next_seq
        self._next_seq = seq + 1
        packet_id = self._allocate_pid()
        entry = OutEntry(seq, message, 1, False, packet_id, _SENT, True)
        entry.receipt = receipt
        if inflight is NO_INFLIGHT:
            inflight = self.inflight = {}
        inflight[packet_id] = entry
        link.send_publish(message, 1, packet_id, False, False)
        return entry

    def ack_problem(self, kind: str, packet_id: int) -> str | None:
        """Why an MQTT acknowledgement (``kind``: PUBACK, PUBREC or PUBCOMP) does not
        fit the QoS flow of the in-flight ``packet_id`` — a protocol violation — or
        None.  An id that is not in flight is not one (a late duplicate: ignored)."""
        entry = self.inflight.get(packet_id)
        if entry is None or (entry.qos == 1 and kind == "PUBACK"):
            return None   # (the common case, without the call)
        return ack_problem(kind, packet_id, entry.qos, entry.state == QueuedState.RELEASED)

    def acknowledge(self, packet_id: int) -> list[Op]:
        """PUBACK from the client (or Accepted on an AMQP delivery of QoS 1)."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 1:
            return NO_OPS
        return self._finish(entry)

    def received(self, packet_id: int) -> list[Op]:
        """PUBREC: the client has the QoS 2 message; answer PUBREL and remember it.

        Once PUBREL is out the PUBLISH must never be sent again, so for a persistent
        session PUBREL waits until the RELEASED state is durable: the entry is held
        and ``pubrel_durable`` sends it after the commit.
        """
        entry = self.inflight.get(packet_id)
        link = self.link
        if entry is None or entry.qos != 2:
            if link is not None:  # unknown id: let the client finish its flow
                link.send_pubrel(packet_id)
            return NO_OPS
        if entry.state == QueuedState.RELEASED:
            if link is not None and not entry.held:  # a repeated PUBREC
                link.send_pubrel(packet_id)
            return NO_OPS
        entry.state = QueuedState.RELEASED
        if not self._keeps(entry):
            # (a durable queue's delivery is the queue's to keep, not the session's)
            if link is not None:
                link.send_pubrel(packet_id)
            return NO_OPS
        entry.held = True
        return [entry.put_op(self.client_id)]

    def pubrel_durable(self, packet_id: int) -> None:
        """The RELEASED state of ``packet_id`` is committed: its PUBREL may go."""
        entry = self.inflight.get(packet_id)
        if entry is not None:
            if entry.held:
                entry.held = False
                if self.link is not None:
                    self.link.send_pubrel(packet_id)
            return
        for queued in self.queue:  # moved back to the queue by a reconnect
            if queued.packet_id == packet_id:
                queued.held = False
                break
        self.pump()

    def completed(self, packet_id: int) -> list[Op]:
        """PUBCOMP: the QoS 2 exchange is over."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 2:
            return NO_OPS
        return self._finish(entry)

    def mark_released(self, packet_id: int) -> list[Op]:
        """AMQP_PUBREL on ``$mqtt.<id>.pubrel``: the PUBREC state change of ``received``
        without sending the release; the caller sends it after the commit."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.qos != 2 or entry.state == QueuedState.RELEASED:
            return NO_OPS
        entry.state = QueuedState.RELEASED
        if self._keeps(entry):
            return [entry.put_op(self.client_id)]
        return NO_OPS

    def redeliver(self, packet_id: int, increment: bool) -> None:
        """AMQP Released/Modified: put the entry back at the head, to be sent again.
        Not once released (AMQP_PUBREL accepted: the client has it, exactly once):
        it stays in flight until the PUBREL's settle completes it."""
        entry = self.inflight.get(packet_id)
        if entry is None or entry.state == QueuedState.RELEASED:
            return
        del self.inflight[packet_id]
        entry.state = QueuedState.QUEUED
        entry.dup = entry.dup or increment
        if increment:
            entry.failures += 1
        if self.queue is NO_QUEUE:
            self.queue = deque()
        self.queue.appendleft(entry)
        self.queued_bytes += len(entry.message.payload)
        self.pump()

    def accepted_quietly(self, entry: OutEntry) -> None:
        """The in-flight ``entry`` (a durable queue's QoS 1 delivery: nothing of it is
        stored here) is acknowledged, as ``acknowledge`` does it, but neither its
        receipt is told nor the window pumped (nor ``feed_queues`` called): the
        caller settles the receipt and does both once for a batch of them
        (``Settlement.accept_many``)."""
        del self.inflight[entry.packet_id]
        self._pids.discard(entry.packet_id)
        self.delivered += 1
        self.stalled = False
        done = entry.on_done
        if done is not None:
            entry.on_done = None
            done()

    def feed_queues(self) -> None:
        """The window freed, after a durable queue's delivery was refused or passed
        over: with nothing queued here, its groups are pumped again (the message
        waits in its queue; with no other event, a quiet queue, it would wait for
        ever).  ``_finish`` calls it, a batch of ``accepted_quietly`` at its end
        (``Settlement.accept_many``; a delivery of the batch that falls back to
        ``Settlement.settle`` goes through ``_finish``, so in the middle), and
        the queues when they take a delivery back (``Parking._window_freed``)."""
        feed = self.queue_waiting
        if feed is not None and not self.queue:
            self.queue_waiting = None
            feed()

    def _finish(self, entry: OutEntry) -> list[Op]:
        # (accepted_quietly's lines, not a call to it: this is every QoS 1 PUBACK's
        # and QoS 2 PUBCOMP's path, and a call costs more than the lines it saves)
        del self.inflight[entry.packet_id]
        self._pids.discard(entry.packet_id)
        self.delivered += 1
        self.stalled = False
        done = entry.on_done
        if done is not None:
            entry.on_done = None
            done()
        ops = NO_OPS
        receipt = entry.receipt
        if receipt is not None:
            receipt.acknowledged()
        elif self.persistent:   # (``_keeps``: stored with this session)
            ops = [DeleteQueued(self.client_id, entry.seq)]
        if self.queue:   # (``pump`` moves nothing out of an empty queue)
            self.pump()
        if self.queue_waiting is not None:
            self.feed_queues()
        return ops

    def drop(self, packet_id: int) -> list[Op]:
        """Remove an in-flight entry without delivery (AMQP Rejected); counted."""
        entry = self.inflight.get(packet_id)
        if entry is None:
            return NO_OPS
        self.dropped += 1
        self.delivered -= 1
        return self._finish(entry)

    def _keeps(self, entry: OutEntry) -> bool:
        """Is ``entry`` stored with this session?  Only a persistent session's, and
        never a durable queue's delivery (the queue keeps that one)."""
        return self.persistent and entry.receipt is None
