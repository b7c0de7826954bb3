"""The 0.9.1 connection in process: a fake transport, a ``Clock`` and an in-memory
broker; the header sniff hands sockets to the right protocol."""

from __future__ import annotations

from typing import Any

from core_broker import make_broker
from fakes import timers_left
from pamqp import commands, frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import StringTransport

from mqttamqp.amqp091.connection import AMQP091Factory
from mqttamqp.amqp091.frames import FrameReader, method_frame
from mqttamqp.amqp091.handshake import Settings, State
from mqttamqp.amqp091.sniff import HeaderSniffer, SharedPortFactory
from mqttamqp.core.stats import BrokerStats

C = commands.Connection


def frames_of(transport: StringTransport) -> list[Any]:
    data = transport.value()
    transport.clear()
    return [f for _, f in FrameReader(1 << 20).feed(data)]


def open_connection(heartbeat: int = 0) -> tuple[Any, StringTransport, Any]:
    broker, clock, _ = make_broker()
    factory = AMQP091Factory(broker, clock, Settings(heartbeat=10))
    conn = factory.buildProtocol(None)
    transport = StringTransport()
    conn.makeConnection(transport)
    [start] = frames_of(transport)
    assert start.name == "Connection.Start"
    conn.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN",
                                                 response="\x00guest\x00guest")))
    [tune] = frames_of(transport)
    assert tune.name == "Connection.Tune" and tune.heartbeat == 10
    conn.dataReceived(method_frame(0, C.TuneOk(2047, 131072, heartbeat))
                      + method_frame(0, C.Open("/")))
    [ok] = frames_of(transport)
    assert ok.name == "Connection.OpenOk"
    return conn, transport, clock


def test_handshake_opens_and_registers() -> None:
    """start-ok, tune-ok and open make the connection open and listed by the broker."""
    conn, _, _ = open_connection()
    assert conn.state is State.OPEN
    assert conn.broker.connections[conn.key] is conn
    assert conn.info().protocol == "amqp0-9-1"


def test_heartbeat_deadline() -> None:
    """A silent client is dropped after two heartbeat intervals, not before; the
    broker sends heartbeats meanwhile and leaves no timer behind."""
    conn, transport, clock = open_connection(heartbeat=4)
    clock.advance(7.9)
    assert not transport.disconnecting
    assert b"\x08\x00\x00\x00\x00\x00\x00\xce" in transport.value()
    clock.advance(2.1)
    assert transport.disconnecting
    conn.connectionLost(None)
    assert not [t for t in timers_left(clock) if "AMQP091" in repr(t)]


def test_a_channel_over_channel_max_closes_with_504() -> None:
    """channel.open of a number over channel_max is a 504 connection error."""
    conn, transport, _ = open_connection()
    conn.dataReceived(method_frame(5000, commands.Channel.Open()))
    [close] = frames_of(transport)
    assert close.name == "Connection.Close" and close.reply_code == 504


def test_a_method_on_an_unopened_channel_is_504() -> None:
    """A method on a channel that is not open is a 504 connection error."""
    conn, transport, _ = open_connection()
    conn.dataReceived(method_frame(3, commands.Basic.Qos(prefetch_count=1)))
    [close] = frames_of(transport)
    assert close.reply_code == 504


def test_client_close_is_answered() -> None:
    """connection.close from the client gets close-ok and the socket is closed."""
    conn, transport, _ = open_connection()
    conn.dataReceived(method_frame(0, C.Close(200, "bye", 0, 0)))
    [ok] = frames_of(transport)
    assert ok.name == "Connection.CloseOk" and transport.disconnecting


class Recorder(Protocol):
    def __init__(self) -> None:
        self.received = b""

    def dataReceived(self, data: bytes) -> None:
        self.received += data


def sniffed(header: bytes) -> tuple[Recorder, Recorder, StringTransport]:
    _, clock, _ = make_broker()
    amqp10, amqp091 = Recorder(), Recorder()
    port = SharedPortFactory(Factory.forProtocol(lambda: amqp10),
                             Factory.forProtocol(lambda: amqp091), clock, 10.0)
    sniffer = port.buildProtocol(None)
    transport = StringTransport()
    transport.protocol = sniffer
    sniffer.makeConnection(transport)
    for i in range(0, len(header), 3):
        transport.protocol.dataReceived(header[i:i + 3])
    return amqp10, amqp091, transport


def test_sniff_hands_amqp10_every_byte() -> None:
    """An AMQP 1.0 header goes to the 1.0 protocol with the header itself."""
    amqp10, amqp091, transport = sniffed(b"AMQP\x03\x01\x00\x00more")
    assert amqp10.received == b"AMQP\x03\x01\x00\x00more" and not amqp091.received
    assert transport.protocol is amqp10


def test_sniff_hands_091_what_follows_the_header() -> None:
    """A 0.9.1 header goes to the 0.9.1 protocol, which gets the bytes after it."""
    amqp10, amqp091, transport = sniffed(b"AMQP\x00\x00\x09\x01xy")
    assert not amqp10.received
    assert amqp091.received == b"xy" and transport.protocol is amqp091


def test_sniff_refuses_other_headers_with_the_091_header() -> None:
    """Another header gets the 0.9.1 header back and the socket is closed."""
    _, _, transport = sniffed(b"HELLO WORLD")
    assert transport.value() == b"AMQP\x00\x00\x09\x01" and transport.disconnecting


def test_sniff_keeps_a_socket_pending_only_until_its_header_time_out_or_close() -> None:
    """The shared port's ``connections`` (what --ha aborts at a leadership loss) holds a
    socket from its accept until its header is read, its time-out fires or it
    closes, and then no longer (nothing left behind)."""
    _, clock, _ = make_broker()
    port = SharedPortFactory(Factory.forProtocol(Recorder),
                             Factory.forProtocol(Recorder), clock, 10.0)
    sockets = [port.buildProtocol(None) for _ in range(4)]
    for sniffer in sockets:
        transport = StringTransport()
        transport.protocol = sniffer
        sniffer.makeConnection(transport)
    assert port.connections == set(sockets)
    sockets[0].dataReceived(b"AMQP\x00\x00\x09\x01")   # switched to 0.9.1
    sockets[1].dataReceived(b"HELLO WORLD")              # refused
    sockets[2].connectionLost(None)                      # closed before its header
    assert port.connections == {sockets[3]}
    clock.advance(10.0)                                  # timed out
    sockets[3].connectionLost(None)
    assert port.connections == set()


def test_sockets_waiting_for_their_header_are_bounded() -> None:
    """With ``bound`` sockets waiting for their header, a new one is refused at its
    accept (``buildProtocol`` gives a protocol that aborts it, not None: an ssl:
    listener wraps what it gives in TLS), counted and logged once; once one of them
    has sent its header, a new socket is taken again."""
    from loglines import LogLines

    _, clock, _ = make_broker()
    stats = BrokerStats()
    port = SharedPortFactory(Factory.forProtocol(Recorder), Factory.forProtocol(Recorder),
                             clock, 10.0, bound=2, stats=stats)
    waiting = []
    for _ in range(2):
        sniffer = port.buildProtocol(None)
        assert sniffer is not None
        sniffer.makeConnection(StringTransport())
        waiting.append(sniffer)
    with LogLines("waiting for their protocol header") as lines:
        for _ in range(2):
            refused, below = port.buildProtocol(None), StringTransport()
            assert not isinstance(refused, HeaderSniffer)
            refused.makeConnection(below)
            assert below.disconnected
    assert stats.connections_refused == 2 and len(lines) == 1
    assert stats.limits["max_connections"] == 2
    assert port.connections == set(waiting)
    waiting[0].dataReceived(b"AMQP\x00\x00\x09\x01")
    assert isinstance(port.buildProtocol(None), HeaderSniffer)


def test_a_socket_refused_on_an_ssl_amqp_listener_is_aborted_below_tls() -> None:
    """An ssl: AMQP listener wraps the shared port's factory in TLS: a socket over
    the bound is aborted too (a None from ``buildProtocol`` made TLS raise at the
    accept and left the socket open, without a time-out)."""
    from twisted.internet import ssl
    from twisted.protocols.tls import TLSMemoryBIOFactory

    _, clock, _ = make_broker()
    port = SharedPortFactory(Factory.forProtocol(Recorder), Factory.forProtocol(Recorder),
                             clock, 10.0, bound=1, stats=BrokerStats())
    tls = TLSMemoryBIOFactory(ssl.CertificateOptions(), False, port)
    tls.buildProtocol(None).makeConnection(StringTransport())
    below = StringTransport()
    tls.buildProtocol(None).makeConnection(below)
    assert below.disconnected and len(port.connections) == 1


def test_the_console_lists_a_091_connection(tmp_path: Any) -> None:
    """An open 0.9.1 connection is among the console's clients, protocol amqp0-9-1,
    with its label and the protocol filter, and its consumers as links."""
    from console_support import Client, make_console

    console, service, clock = make_console(tmp_path)
    factory = AMQP091Factory(service.broker, clock)
    conn = factory.buildProtocol(None)
    conn.makeConnection(StringTransport())
    conn.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN",
                                                 response="\x00guest\x00guest")))
    conn.dataReceived(method_frame(0, C.TuneOk(2047, 131072, 0))
                      + method_frame(0, C.Open("/")))
    conn.dataReceived(method_frame(1, commands.Channel.Open())
                      + method_frame(1, commands.Queue.Declare(queue="jobs"))
                      + method_frame(1, commands.Basic.Qos(prefetch_count=5))
                      + method_frame(1, commands.Basic.Consume(queue="jobs",
                                                               consumer_tag="w1")))
    client = Client(console)
    client.login()
    items = client.get("/api/clients", protocol="amqp0-9-1").json()["items"]
    assert [(i["key"], i["protocol"]) for i in items] == [(conn.key, "amqp0-9-1")]
    assert "AMQP 0.9.1" in client.get("/clients").text
    [link] = conn.info().links
    assert (link.name, link.address, link.credit, link.session) == ("w1", "jobs", 5, 1)


def test_a_bad_frame_closes_with_501_and_one_log_line() -> None:
    """A frame without its end octet closes the connection with 501; a second such
    connection within the minute logs no second line."""
    from twisted.logger import globalLogPublisher

    lines: list[str] = []

    def watch(event: dict[str, Any]) -> None:
        if "closed: 501" in str(event.get("log_format", "")) or (
                event.get("code") == 501):
            lines.append(str(event.get("log_format")))

    globalLogPublisher.addObserver(watch)
    try:
        conn, transport, _ = open_connection()
        factory = conn.factory
        data = bytearray(method_frame(1, commands.Channel.Open()))
        data[-1] = 0
        conn.dataReceived(bytes(data))
        [close] = frames_of(transport)
        assert (close.name, close.reply_code) == ("Connection.Close", 501)
        second = factory.buildProtocol(None)
        second.makeConnection(StringTransport())
        second.dataReceived(bytes(data))
    finally:
        globalLogPublisher.removeObserver(watch)
    assert len(lines) == 1


def test_the_unacked_bound_is_counted() -> None:
    """A channel reaching --amqp091-max-unacked counts the limit once."""
    broker, clock, _ = make_broker()
    factory = AMQP091Factory(broker, clock, Settings(max_unacked=2))
    conn = factory.buildProtocol(None)
    conn.makeConnection(StringTransport())
    conn.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN",
                                                 response="\x00guest\x00guest"))
                      + method_frame(0, C.TuneOk(2047, 131072, 0))
                      + method_frame(0, C.Open("/")) + method_frame(1, commands.Channel.Open()))
    channel = conn.channels[1]
    from mqttamqp.core.message import Message

    class Member:
        queue = "q"
        tag = "t"
        getter = False

    for _ in range(3):
        channel.deliver(Member(), Message("$queue/q", b"x", 1), 7, False)
    assert broker.stats.limits.get("amqp091_unacked") == 1


def test_confirms_go_in_order_with_multiple() -> None:
    """Publisher confirms: nothing before the first is done, then one basic.ack with
    multiple for every one done in a row; a failed one is a basic.nack."""
    conn, transport, clock = open_connection()
    conn.dataReceived(method_frame(1, commands.Channel.Open())
                      + method_frame(1, commands.Confirm.Select()))
    frames_of(transport)
    channel = conn.channels[1]
    for seq in (1, 2, 3, 4, 5, 6):
        channel.confirms[seq] = None
    channel._confirmed(None, 2, True)
    clock.advance(0)
    assert frames_of(transport) == []
    channel._confirmed(None, 1, True)
    clock.advance(0)
    [ack] = frames_of(transport)
    assert (ack.name, ack.delivery_tag, ack.multiple) == ("Basic.Ack", 2, True)
    channel._confirmed(None, 4, True)
    channel._confirmed(None, 3, False)
    clock.advance(0)
    nack, ack = frames_of(transport)
    assert (nack.name, nack.delivery_tag) == ("Basic.Nack", 3)
    assert (ack.name, ack.delivery_tag) == ("Basic.Ack", 4)
    channel._confirmed(None, 5, True)
    channel._confirmed(None, 6, True)
    assert frames_of(transport) == []     # (the rest of the commit's Deferreds first)
    clock.advance(0)
    [ack] = frames_of(transport)
    assert (ack.name, ack.delivery_tag, ack.multiple) == ("Basic.Ack", 6, True)


def test_confirms_done_together_are_one_ack_before_a_later_nack() -> None:
    """Confirms waiting for the turn's end go out before a nack that follows them."""
    conn, transport, clock = open_connection()
    conn.dataReceived(method_frame(1, commands.Channel.Open())
                      + method_frame(1, commands.Confirm.Select()))
    frames_of(transport)
    channel = conn.channels[1]
    for seq in (1, 2, 3):
        channel.confirms[seq] = None
    channel._confirmed(None, 1, True)
    channel._confirmed(None, 2, True)
    channel._confirmed(None, 3, False)
    ack, nack = frames_of(transport)
    assert (ack.name, ack.delivery_tag, ack.multiple) == ("Basic.Ack", 2, True)
    assert (nack.name, nack.delivery_tag) == ("Basic.Nack", 3)
    clock.advance(0)
    assert frames_of(transport) == []


def test_a_long_reply_text_is_cut_to_a_short_string() -> None:
    """A channel error quoting a long non-ASCII value still goes out (255 bytes)."""
    conn, transport, _ = open_connection()
    conn.dataReceived(method_frame(1, commands.Channel.Open()))
    frames_of(transport)
    props = commands.Basic.Properties(user_id="é" * 120)
    from pamqp import frame as pframe
    from pamqp.header import ContentHeader

    conn.dataReceived(method_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
                      + pframe.marshal(ContentHeader(0, 0, props), 1))
    [close] = frames_of(transport)
    assert (close.name, close.reply_code) == ("Channel.Close", 406)
    assert len(close.reply_text.encode("utf-8")) <= 255


def test_reading_resumes_once_every_reason_to_pause_is_gone() -> None:
    """The storage alarm and subscribers' flow control each hold the socket; it is
    read again only when both have let go."""
    conn, transport, _ = open_connection()
    conn.hold_reading("alarm")
    conn.hold_reading("flow")
    assert transport.producerState == "paused"
    conn.release_reading("flow")
    assert transport.producerState == "paused"
    conn.release_reading("alarm")
    assert transport.producerState == "producing"


def test_a_consumer_gets_as_many_deliveries_as_its_prefetch() -> None:
    """basic.qos prefetch 40 lets a durable queue have 40 deliveries outstanding with
    the consumer (not the broker's --queue-prefetch, 16), and no more."""
    pub, _, clock = open_connection()
    cons = pub.factory.buildProtocol(None)
    ct = StringTransport()
    cons.makeConnection(ct)
    frames_of(ct)
    cons.dataReceived(method_frame(0, C.StartOk(mechanism="PLAIN",
                                                 response="\x00guest\x00guest")))
    cons.dataReceived(method_frame(0, C.TuneOk(2047, 131072, 0))
                      + method_frame(0, C.Open("/")))
    pub.dataReceived(method_frame(1, commands.Channel.Open())
                     + method_frame(1, commands.Queue.Declare(queue="q", durable=True)))
    cons.dataReceived(method_frame(1, commands.Channel.Open())
                      + method_frame(1, commands.Basic.Qos(prefetch_count=40))
                      + method_frame(1, commands.Basic.Consume(queue="q", consumer_tag="c")))
    clock.advance(0)
    frames_of(ct)
    one = (method_frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
           + frame.marshal(ContentHeader(0, 1, commands.Basic.Properties(delivery_mode=2)), 1)
           + frame.marshal(ContentBody(b"x"), 1))
    pub.dataReceived(one * 60)
    clock.advance(0)
    delivered = [f for f in frames_of(ct) if f.name == "Basic.Deliver"]
    assert len(delivered) == 40
    cons.dataReceived(method_frame(1, commands.Basic.Ack(40, multiple=True)))
    clock.advance(0)
    assert len([f for f in frames_of(ct) if f.name == "Basic.Deliver"]) == 20
