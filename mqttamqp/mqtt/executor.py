"""The one place an MQTT connection carries out what its decisions ask for.

``decisions`` returns ``actions`` (``Send``, ``Ack``, ``Close``, ``Refuse``,
``Arm``, ``Goodbye``; a ``Message`` is routed by the step that asked for it);
the connection's own events hand it theirs too (the first CONNECT deadline is an
``Arm``; a deadline that passes, a packet before CONNECT and one the codec cannot
read are each a ``Close``, the last with MQTT 5's refusing CONNACK as its frame).
What does not come through here: the core's deliveries (PUBLISH, PUBREL:
``protocol``'s ``ClientLink`` methods), the accepting CONNACK (``handshake``
writes it), a close the broker asks for (takeover, the console: ``closing``), the
keepalive check re-arming itself (and armed at CONNACK: ``_arm_keepalive``, called
by ``handshake``), and a commit that failed under an acknowledgement
(``_ack_failed`` closes directly).
``ActionExecutor`` is the part of ``protocol.MQTTProtocol`` that does them:
``_carry_out`` for any action, ``_acknowledge`` for an ``Ack`` with what the
broker's step returned beside it (the Deferred to wait for, the packet id, what
follows the write).  Acknowledgements leave in the order their packets came,
each once what it promises is durable (``connection.AckQueue`` keeps the order;
a commit failure closes without acknowledging; a QoS 1 PUBACK waits on its
batch's ``core.commits.CommitRound``, the others on a Deferred); a refused CONNECT
(``_refuse``) and a client's DISCONNECT (``_goodbye``) end here; a protocol
error goes to ``closing.Disconnects._violation``, the one disconnect.

What stays in ``flows`` and ``handshake``: the calls on the broker's port whose
results feed the next decision (routing, subscribing, authenticating, opening
the session), as thin steps.  What this module must not do: decide anything
(reason codes, which acknowledgement) or read packets; the bytes it writes go
through ``protocol``'s ``_write``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from mqttamqp.core.commits import CommitRound
from mqttamqp.core.recorder import CAUSE_CLEAN, CAUSE_STORAGE
from mqttamqp.mqtt.actions import Ack, Action, Arm, Close, Goodbye, Refuse, Send, pack_ack
from mqttamqp.mqtt.closing import Disconnects
from mqttamqp.mqtt.codec import encode
from mqttamqp.mqtt.connection import (
    MAX_PENDING_ACKS,
    NO_ACKS,
    AckQueue,
    ConnectionState,
    Keepalive,
)
from mqttamqp.mqtt.decisions import problem
from mqttamqp.mqtt.packets import Connack
from mqttamqp.mqtt.v5 import CONNACK_REASONS
from mqttamqp.native import NO_SLOTS, mypyc_attr

__all__ = ["ActionExecutor", "Durable"]

# What an acknowledgement waits for: a commit, the batch's early-acknowledgement
# round (``core.commits.CommitRound``: MQTT QoS 1), or nothing.
Durable = Deferred[None] | CommitRound | None


@mypyc_attr(allow_interpreted_subclasses=True)
class ActionExecutor(Disconnects):
    """Carries out the actions of ``decisions``, for ``protocol.MQTTProtocol`` (a
    base class of it)."""

    __slots__ = NO_SLOTS   # (the connection has no __dict__: protocol.MQTTProtocol)

    def _carry_out(self, action: Action, packet_id: int = 0) -> None:
        """Do ``action`` (an ``Ack`` here is sent at once, in order)."""
        if type(action) is Send:
            self._write(action.frame)
        elif type(action) is Ack:
            self._acknowledge(action, packet_id, None)
        elif type(action) is Close:
            if action.frame is not None:
                self._write(action.frame)
            self._violation(action.reason, code=action.code, limit=action.limit)
        elif type(action) is Refuse:
            self._refuse(action.code, action.reason, action.logged)
        elif type(action) is Arm:
            self._arm(action)
        elif type(action) is Goodbye:
            self._goodbye(action)
        else:   # (a closed set: a new kind of action is a bug here first)
            raise TypeError(f"not an MQTT connection action: {action!r}")

    # -- acknowledgements, in order ---------------------------------------------------

    def _acknowledge(self, ack: Ack, packet_id: int, durable: Durable,
                     then: Callable[[], None] | None = None) -> None:
        """Send ``ack`` for ``packet_id`` once ``durable`` fired and every earlier
        acknowledgement went out, then call ``then`` (the QoS 2 gate's ``open``
        when ``ack.opens``, SUBACK's retained messages) or give the receive-maximum
        quota back if it says so (a releasing acknowledgement has no ``then``)."""
        frame = ack.frame
        if frame is None:   # (``actions.ack_frame`` inlined: the hottest path)
            frame = pack_ack(ack.kind, 2, packet_id)
        if durable is None:
            if not self._acks.count:   # (nothing waiting: ``AckQueue.empty``)
                self._write(frame)
                if ack.release:
                    v5 = self._v5
                    assert v5 is not None
                    v5.quota_release(packet_id)
                if then is not None:
                    then()
                return
        elif type(durable) is CommitRound and then is None and not ack.release:
            # (one entry, one callback and one flush for the QoS 1 PUBACKs of a read)
            acks = self._acks
            if acks is NO_ACKS:
                acks = self._acks = AckQueue()
            waiting = acks.add_waiting(frame, durable)
            if acks.count > MAX_PENDING_ACKS:   # (``over_bound``)
                self._pause_reading("storage")
            if waiting is not None:
                durable.when_answered(self._ack_outcome, waiting)
            return
        if ack.release:
            self._ack_releasing(durable, frame, packet_id)
        else:
            self._ack(durable, frame, then, ack.opens)

    def _ack_releasing(self, durable: Durable, frame: bytes,
                       packet_id: int) -> None:
        """``_ack``, giving the quota of ``packet_id`` back once written.  (Its own
        method: a closure in ``_acknowledge`` would make its cells on every call.  A
        ``partial``, not a lambda: mypyc failed on a lambda in a method of a class that
        was not native.)"""
        v5 = self._v5
        assert v5 is not None
        release = v5.quota_release
        self._ack(durable, frame, partial(release, packet_id))

    def _ack(self, d: Durable, frame: bytes,
             after: Callable[[], None] | None = None, essential: bool = False) -> None:
        """Send ``frame`` once ``d`` fired and every earlier acknowledgement went out,
        then call ``after``; an ``essential`` one is called even if the connection
        closed meanwhile (though not if ``d`` failed)."""
        acks = self._acks
        if d is None and acks.empty:
            self._write(frame)
            if after is not None:
                after()
            return
        if acks is NO_ACKS:
            acks = self._acks = AckQueue()
        entry = acks.add(frame, after, d is None, essential)
        if acks.over_bound:
            # The client sends faster than commits finish: stop reading until they
            # catch up, rather than queue work for the writer without bound.
            self._pause_reading("storage")
        if d is None:
            self._flush_acks()
        elif type(d) is CommitRound:
            d.when_answered(self._ack_outcome, entry)
        else:
            assert isinstance(d, Deferred)
            d.addCallbacks(self._ack_ready, self._ack_failed,
                           callbackArgs=(entry,), errbackArgs=(entry,))

    def _ack_ready(self, _: object, entry: list[Any]) -> None:
        AckQueue.ready(entry)
        self._flush_acks()

    def _ack_outcome(self, failure: Failure | None, entry: list[Any]) -> None:
        """A ``CommitRound``'s answer for ``entry``: durable (None), or the failure."""
        if failure is None:
            AckQueue.ready(entry)
            self._flush_acks()
        else:
            self._ack_failed(failure, entry)

    def _flush_acks(self) -> None:
        acks = self._acks
        for frame, after, essential in acks.take_flagged():
            if self.closed:
                if essential and after is not None:
                    after()
                continue
            self._write(frame)
            if after is not None:
                after()
        if acks.under_resume_mark:
            self._resume_reading("storage")

    def _ack_failed(self, failure: Failure, entry: list[Any]) -> None:
        # One line for this connection, no traceback: the store logs the failure
        # itself (once when commits start failing, once when they recover).
        if self.state is not ConnectionState.CLOSED:
            self._violation(f"storage failure ({failure.getErrorMessage()}); nothing was "
                            "acknowledged, closing so the client retries", CAUSE_STORAGE)
        # Closed now: the entry's frame is never written, and its ``after`` (a QoS 2
        # gate, cancelled by the failure) does nothing; the entries behind it still
        # run theirs.
        AckQueue.ready(entry)
        self._flush_acks()

    # -- deadlines --------------------------------------------------------------------

    @property
    def _keepalive(self) -> Keepalive | None:
        """The keepalive rule while its check is armed: the shared one for the
        connection's ``keepalive`` (not a slot of its own)."""
        if self._keepalive_timer is None:
            return None
        return Keepalive.of(self.keepalive)

    def _arm_connect_deadline(self, delay: float) -> None:
        """The CONNECT deadline of a socket whose CONNECT did not come in the turn
        that accepted it (``deadlines.SoonDeadlines``)."""
        self._carry_out(Arm("connect", delay))

    def _arm(self, arm: Arm) -> None:
        """Start the deadline ``arm`` names: "connect" or "keepalive"; any other
        name is a bug (ValueError, nothing armed)."""
        deadline = arm.deadline
        if deadline == "connect":
            self._factory.connect_deadlines.add(self, arm.seconds)
            return
        if deadline != "keepalive":
            raise ValueError(f"not a deadline of an MQTT connection: {deadline!r}")
        self._arm_keepalive(int(arm.seconds))

    def _arm_keepalive(self, seconds: int) -> None:
        """The keepalive deadline of ``seconds`` (> 0; ``_arm``'s "keepalive")."""
        rule = Keepalive.of(seconds)
        # (the shared int: above 256 each is 32 bytes; ``_keepalive`` is made from it)
        self.keepalive = rule.seconds
        self.factory.keepalives.add(self, rule.limit)

    # -- the ends: a refused CONNECT, a client's DISCONNECT -----------------------------

    def _refuse(self, code: int, reason: str, logged: bool = False) -> None:
        """Answer CONNECT with a refusal (``code``: a 3.1.1 return code, or an MQTT
        5 reason code; a 3.1.1 code is translated for an MQTT 5 client); ``logged``:
        the caller logged (and counted) it already, rate-limited."""
        if not logged:
            self.meter.refused()
            self.log.warn("refused CONNECT from {peer} (client id {c!r}): {r} (CONNACK "
                          "{code})", peer=self.peer, c=self.client_id, r=reason,
                          code=int(code))
        if self.session is not None:
            # A refused CONNECT leaves no will behind and publishes none.
            self.broker.end_session(self._link, self.session, True, "CONNECT refused")
            self.session = None
        if self._v5 is not None:
            self._write(encode(Connack(False, CONNACK_REASONS.get(code, code),
                                       problem(self._v5, reason)), 5))
        else:
            self._write(encode(Connack(False, code)))
        self.advance("close")
        self._cancel_timers()
        self._lose()

    def _goodbye(self, goodbye: Goodbye) -> None:
        """The client said DISCONNECT: a clean close; its session ends (with its
        will when MQTT 5's 0x04 asked for it)."""
        with_will = goodbye.with_will
        self._cause = CAUSE_CLEAN      # (and so ``_clean_close``)
        self.advance("close")
        self.broker.registry.unregister_client(self.client_id, self._link, CAUSE_CLEAN)
        self._cancel_timers()
        if self.session is not None:
            why = ("client sent DISCONNECT with will" if with_will
                   else "client sent DISCONNECT")
            self.broker.end_session(self._link, self.session, not with_will, why,
                                    expiry=goodbye.expiry)
            self.session = None
        self._lose()
