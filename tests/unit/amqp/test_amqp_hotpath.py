"""The per-message path of AMQP links at its edges (``links``, ``net.rawproton``):
what the short cuts of the common case must still do in the uncommon one.

* a transfer is read out of the engine in one call into a 64 KiB buffer: a larger
  message still arrives whole, one over ``--max-packet-size`` is still refused;
* an Accepted QoS 1 delivery goes straight to the session's acknowledgement: QoS 2
  deliveries (Accepted completes them) and the other outcomes still take the
  settlement rules of ``Broker.settle``.

In memory (``amqp_memory.Net``), black box: over the wire and ``broker.sessions``.
"""

from __future__ import annotations

import pytest
from amqp_memory import ACCEPTED, MODIFIED, REJECTED, RELEASED, Net, outcome, publish_message
from amqp_messages import drain


def test_a_message_larger_than_the_copy_buffer_arrives_whole() -> None:
    """A transfer larger than the 64 KiB copy buffer arrives whole at AMQP and MQTT
    receivers."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("big/t", credit=10)
    mqtt = net.mqtt("big-watch")
    mqtt.subscribe(("big/t", 1))
    snd = app.sender("big/t")
    payload = bytes(range(256)) * 700          # 179,200 bytes: three buffers' worth
    assert outcome(app.send(snd, publish_message(None, payload, qos=1))) == (ACCEPTED, None)
    assert rcv.bodies() == [payload]
    assert [p.payload for p in mqtt.publishes()] == [payload]


def test_a_message_over_the_packet_size_is_refused_in_one_piece_or_many() -> None:
    """A message over the packet size limit closes its link with message-size-exceeded; one
    under it is accepted."""
    net = Net(max_packet_size=100_000)
    app = net.amqp()
    snd = app.sender("big/u")
    app.send(snd, publish_message(None, b"x" * 150_000, qos=1))
    assert snd.remote_condition is not None
    assert snd.remote_condition.name == "amqp:link:message-size-exceeded"
    small = app.sender("big/v")
    assert outcome(app.send(small, publish_message(None, b"y" * 90_000, qos=1))) == (
        ACCEPTED, None)


def test_zero_length_body_is_read_as_empty() -> None:
    """An empty transfer (no bytes at all) is a message that does not decode."""
    net = Net()
    app = net.amqp()
    snd = app.sender("zero/t")
    dlv = snd.delivery("z1")
    snd.advance()
    net.pump()
    assert dlv.remote_state != 0 and dlv.remote_state != ACCEPTED


def test_accepted_finishes_qos1_and_qos2_deliveries_and_frees_the_window() -> None:
    """Accepted on a QoS 1 delivery acknowledges it; on a QoS 2 one it completes it.
    Either way nothing stays in flight and the queue behind moves on."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("acc/t", credit=100)
    snd = app.sender("acc/t")
    for i in range(40):
        app.send(snd, publish_message(None, b"%d" % i, qos=1 + i % 2))
    bodies: list[bytes] = []
    for _ in range(5):                         # the in-flight window is 32: two rounds
        got = rcv.new()
        bodies += [bytes(m.body) for m, _ in got]
        for _, dlv in got:
            dlv.update(ACCEPTED)
            dlv.settle()
        net.pump()
    assert bodies == [b"%d" % i for i in range(40)]
    for session in net.broker.sessions.values():
        assert not session.inflight
        assert not session.queue


@pytest.mark.parametrize("qos", [1, 2])
def test_released_and_modified_still_redeliver(qos: int) -> None:
    """Released and modified-failed outcomes still redeliver (modified-failed counting a
    delivery), and accepted ends it."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("rel/t", credit=10)
    snd = app.sender("rel/t")
    app.send(snd, publish_message(None, b"m", qos=qos))
    (_, first), = rcv.new()
    app.settle(first, RELEASED)
    (msg, second), = rcv.new()
    assert msg.delivery_count == 0
    app.settle(second, MODIFIED, failed=True)
    (msg, third), = rcv.new()
    assert msg.delivery_count == 1
    app.settle(third, ACCEPTED)
    assert rcv.new() == []
    for session in net.broker.sessions.values():
        assert not session.inflight



def test_one_socket_read_is_answered_in_one_write() -> None:
    """The engine takes 8 KiB at a time; a read of many transfers still gets all its
    dispositions in one write (one wake-up of the peer), not one per 8 KiB."""
    net = Net()
    app = net.amqp()
    snd = app.sender("w/t")
    assert snd.credit >= 100
    dlvs = []
    for i in range(100):
        dlv = snd.delivery(b"w%d" % i)
        snd.send(publish_message(None, b"p" * 100, qos=1).encode())
        snd.advance()
        dlvs.append(dlv)
    data = b""
    for _ in range(100):                       # (the engine hands out 8 KiB at a time)
        more = drain(app.transport)
        if not more:
            break
        data += more
    assert len(data) > 2 * 8192
    writes: list[bytes] = []
    real_write = app.wire.write

    def counting(chunk: bytes) -> None:
        writes.append(chunk)
        real_write(chunk)

    app.wire.write = counting  # type: ignore[method-assign]
    app.server.dataReceived(data)
    assert len(writes) == 1
    net.pump()
    assert all(d.remote_state == ACCEPTED for d in dlvs)


def test_a_full_socket_buffer_congests_a_receivers_session_until_it_drains() -> None:
    """``congested`` (kept as an attribute) follows the socket's producer calls and
    the link's end: the core sends nothing while it is set."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("cg/t", credit=10)
    session, = net.broker.link_subscribers.values()
    link = session.link
    assert link is not None and not link.congested
    app.server.pauseProducing()
    assert link.congested
    snd = app.sender("cg/t")
    app.send(snd, publish_message(None, b"held", qos=1))
    assert rcv.bodies() == []
    assert len(session.queue) == 1
    app.server.resumeProducing()
    assert not link.congested
    net.pump()
    assert rcv.bodies() == [b"held"]
    rcv.link.close()
    net.pump()
    assert link.congested


def test_a_null_address_sender_switching_topics_routes_each_message_to_its_own() -> None:
    """A sender's repeated sections are remembered with their topic: a message to
    another ``to`` (or back) is routed there, and a bad topic is refused each time."""
    net = Net()
    app = net.amqp()
    got = {t: app.receiver(t, credit=20) for t in ("sw/a", "sw/b")}
    snd = app.sender(None)
    plan = ["sw/a", "sw/a", "sw/b", "sw/b", "sw/a", "sw/+", "sw/+", "sw/b"]
    answers = [outcome(app.send(snd, publish_message(t, b"%d" % i, qos=1)))
               for i, t in enumerate(plan)]
    assert [state for state, _ in answers] == [ACCEPTED] * 5 + [REJECTED] * 2 + [ACCEPTED]
    assert got["sw/a"].bodies() == [b"0", b"1", b"4"]
    assert got["sw/b"].bodies() == [b"2", b"3", b"7"]


def test_one_pump_of_the_engine_goes_out_in_one_write() -> None:
    """The engine hands out 8 KiB of output at a time; what one pump made (here the
    in-flight window of 1 KiB messages, once the receiver grants credit) is still
    one write."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("ow/t", credit=0)
    snd = app.sender("ow/t")
    for i in range(40):
        app.send(snd, publish_message(None, b"%04d" % i + b"x" * 1000, qos=1))
    writes: list[bytes] = []
    real_write = app.wire.write

    def counting(chunk: bytes) -> None:
        writes.append(chunk)
        real_write(chunk)

    rcv.link.flow(100)
    data = drain(app.transport)
    app.wire.write = counting  # type: ignore[method-assign]
    app.server.dataReceived(data)
    assert len(writes) == 1 and len(writes[0]) > 3 * 8192
    net.pump()
    assert len(rcv.bodies()) == 32   # the in-flight window; the rest when answered


def test_an_outcome_after_amqp_close_does_not_acknowledge_the_next_sessions_message() -> None:
    """Review finding: an FE that closed its session (AMQP_CLOSE) and subscribed again
    gets packet ids from 1 again; accepting a delivery of the old session acknowledged
    the new session's message with the same id, which then left the in-flight window
    unaccepted (lost if the FE released it)."""
    from amqp_messages import control

    net = Net()
    fe = net.fe("c1", publish_now=True)
    fe.list()
    assert outcome(fe.subscribe({"st/#": 1})) == (ACCEPTED, None)
    publisher = net.mqtt("pub")
    publisher.publish("st/a", b"old", qos=1)
    ((_old, old_delivery),) = fe.publish.new()
    assert outcome(fe.send(control("close", "c1"))) == (ACCEPTED, None)
    assert outcome(fe.subscribe({"st/#": 1})) == (ACCEPTED, None)
    publisher.publish("st/a", b"new", qos=1)
    ((new, _new_delivery),) = fe.publish.new()
    assert bytes(new.body) == b"new"
    session = net.broker.sessions["c1"]
    assert len(session.inflight) == 1
    fe.peer.settle(old_delivery, ACCEPTED)      # the old session's delivery
    assert len(session.inflight) == 1            # the new message still awaits its outcome


def test_an_oversized_message_is_logged_once_a_minute(log_lines: list[str]) -> None:
    """Each transfer over the packet size detaches its link; the refusals log one line
    a minute for the cause, and the next line after a minute counts those held back."""
    net = Net(max_packet_size=1_000)

    def refused(address: str) -> None:
        app = net.amqp()   # (a new connection each: a minute idle would close one)
        snd = app.sender(address)
        app.send(snd, publish_message(None, b"x" * 2_000, qos=1))
        assert snd.remote_condition is not None
        assert snd.remote_condition.name == "amqp:link:message-size-exceeded"

    def lines() -> list[str]:
        return [line for line in log_lines if "--max-packet-size" in line]

    refused("big/a")
    first = lines()
    assert len(first) == 1, first
    assert "big/a" in first[0] and "larger than 1000 bytes" in first[0]
    refused("big/b")
    refused("big/c")
    assert len(lines()) == 1, lines()
    net.clock.advance(61)
    refused("big/d")
    assert len(lines()) == 2, lines()
    assert "big/d" in lines()[1] and "2 more since the last such line" in lines()[1]


def test_a_packet_id_tag_is_its_decimal_digits_in_every_block() -> None:
    """The ready-made delivery tag of a packet id holds its decimal digits, at the
    edges of the blocks they are made in and at the last id."""
    from mqttamqp.net.rawproton import ffi, packet_id_tag

    for pid in (0, 1, 9, 10, 1023, 1024, 1025, 4095, 4096, 65534, 65535):
        tag = packet_id_tag(pid)
        assert ffi.unpack(tag.start, tag.size) == b"%d" % pid


def test_packet_id_tags_are_made_a_block_at_a_time_as_ids_are_first_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An AMQP listener makes no delivery-tag block at its start; the first QoS 1
    delivery makes the one block its packet id is in, and no other."""
    import mqttamqp.amqp.links as links
    import mqttamqp.net.rawproton as rawproton

    blocks: list[object] = [None] * len(rawproton.tag_blocks)
    monkeypatch.setattr(rawproton, "tag_blocks", blocks)
    monkeypatch.setattr(links, "tag_blocks", blocks)
    monkeypatch.setattr(rawproton, "_tag_chars", [None] * len(blocks))
    net = Net()
    app = net.amqp()
    rcv = app.receiver("lazy/t", credit=10)
    snd = app.sender("lazy/t")
    assert blocks == [None] * len(blocks)
    assert outcome(app.send(snd, publish_message(None, b"m", qos=1))) == (ACCEPTED, None)
    assert [dlv.tag for _, dlv in rcv.new()] == ["1"]
    assert [i for i, block in enumerate(blocks) if block is not None] == [0]


def test_a_qos1_delivery_is_tagged_with_its_packet_id() -> None:
    """An unsettled QoS 1 delivery carries its packet id as its delivery tag, and a
    QoS 0 one (pre-settled) its own tag."""
    net = Net()
    app = net.amqp()
    rcv = app.receiver("tag/t", credit=10)
    snd = app.sender("tag/t")
    for qos in (1, 1, 0):
        assert outcome(app.send(snd, publish_message(None, b"m", qos=qos))) == (ACCEPTED, None)
    got = rcv.new()
    assert [dlv.tag for _, dlv in got[:2]] == ["1", "2"]
    assert got[2][1].settled


def test_every_pre_settled_delivery_carries_the_one_ready_settled_tag() -> None:
    """QoS 0 deliveries, settled when sent, all carry the tag "s" (made once,
    ``rawproton.SETTLED_TAG``), and their bodies are each their own."""
    from mqttamqp.net.rawproton import SETTLED_TAG, ffi

    assert ffi.unpack(SETTLED_TAG.start, SETTLED_TAG.size) == b"s"
    net = Net()
    app = net.amqp()
    rcv = app.receiver("tag/s", credit=10)
    snd = app.sender("tag/s")
    for body in (b"a", b"b", b"c"):
        assert outcome(app.send(snd, publish_message(None, body, qos=0))) == (ACCEPTED, None)
    got = rcv.new()
    assert [(dlv.tag, dlv.settled) for _, dlv in got] == [("s", True)] * 3
    assert [bytes(m.body) for m, _ in got] == [b"a", b"b", b"c"]


def test_the_broker_and_gateway_engines_share_one_set_of_end_of_pump_chores() -> None:
    """The broker's pump and gateway mode's client engine run the same timer, output
    and freeing steps (``enginechores``), not copies of them."""
    from mqttamqp.amqp.enginechores import EngineChores
    from mqttamqp.amqp.pump import EnginePump
    from mqttamqp.gateway.engine import UpstreamConnection

    for chore in ("_tick", "_write_output", "_free_closed"):
        shared = getattr(EngineChores, chore)
        assert getattr(EnginePump, chore) is shared
        assert getattr(UpstreamConnection, chore) is shared


def test_many_ended_sessions_still_held_are_said_once_a_connection(monkeypatch) -> None:
    """Past ``HELD_SESSIONS_LOGGED`` ended sessions held at once (something keeps
    objects of their links), one warning says so, once a connection; each session
    is kept, never given back early (that would free its links under their
    holders), and the one nothing else holds is given back."""
    from twisted.logger import Logger

    from mqttamqp.amqp import enginechores

    counts = {i: 2 for i in range(enginechores.HELD_SESSIONS_LOGGED + 1)}
    counts[0] = 1     # (ours alone)

    def incref(impl: int) -> None:
        counts[impl] += 1

    def decref(impl: int) -> int:
        counts[impl] -= 1
        return counts[impl]

    monkeypatch.setattr(enginechores, "incref", incref)
    monkeypatch.setattr(enginechores, "decref", decref)
    events: list[dict[str, object]] = []

    class Engine(enginechores.EngineChores):
        log = Logger(observer=events.append)

    engine = Engine()
    engine._held_sessions = list(counts)
    engine._release_sessions()
    engine._release_sessions()
    assert counts[0] == 0 and engine._held_sessions == list(range(1, len(counts)))
    assert all(counts[i] == 2 for i in engine._held_sessions)
    warned = [e for e in events if e["log_level"].name == "warn"]
    assert len(warned) == 1 and warned[0]["n"] == enginechores.HELD_SESSIONS_LOGGED
