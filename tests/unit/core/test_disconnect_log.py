"""Every client disconnect is logged once, with its cause (issue 13: connects were
logged, disconnects were not).  In memory (``amqp_memory.Net``)."""

from __future__ import annotations

from amqp_memory import Net
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure


def _about(log_lines: list[str], who: str) -> list[str]:
    return [line for line in log_lines if f"client {who} " in line and "disconnected" in line]


def test_each_disconnect_is_logged_once_with_its_cause(log_lines: list[str]) -> None:
    """Each disconnect (clean, lost, taken over, AMQP close) is logged once with its cause."""
    net = Net()
    net.mqtt("polite").disconnect()
    rude = net.mqtt("rude")
    rude.proto.connectionLost(Failure(ConnectionLost("reset by peer")))
    net.mqtt("twin", clean=False)
    net.mqtt("twin", clean=False)                     # takes the first one over
    app = net.amqp("app-1")
    app.close()
    [polite] = _about(log_lines, "polite")
    assert polite.endswith("disconnected: clean")
    [lost] = _about(log_lines, "rude")
    assert "disconnected: lost (connection lost: " in lost and "reset by peer" in lost
    [taken] = _about(log_lines, "twin")
    assert "disconnected: taken over" in taken
    [amqp] = _about(log_lines, "app-1")
    assert amqp.startswith("amqp client app-1 (") and "disconnected: clean" in amqp


def test_keepalive_expiry_is_one_line(log_lines: list[str]) -> None:
    """A client silent past 1.5 x its keepalive: one 'disconnected: keepalive'
    line, not also a 'protocol error' warning."""
    from twisted.internet.testing import StringTransport

    from mqttamqp.mqtt.codec import encode
    from mqttamqp.mqtt.packets import Connect

    net = Net()
    client = net.mqtt_factory.buildProtocol(None)
    client.makeConnection(StringTransport())
    client.dataReceived(encode(Connect("MQTT", 4, "sleepy", True, 2, None)))
    net.pump()
    net.clock.advance(3.5)
    [line] = _about(log_lines, "sleepy")
    assert "disconnected: keepalive" in line
    assert not [x for x in log_lines if "protocol error" in x and "sleepy" in x]


def test_amqp_idle_time_out_and_link_limit_are_one_line_each(log_lines: list[str]) -> None:
    """AMQP: an idle time-out is the disconnect's line only ('keepalive'); too many
    links is the limit's warnings only (the first refusal's, then the close at the
    margin's), recorded with cause 'limit', not 'console' (found in review: two lines
    each, and the wrong cause)."""
    net = Net(idle_timeout=4.0, amqp_max_links=2)
    idle = net.amqp("idle-peer")
    idle.silent = True
    net.advance(4.5, step=0.5)
    assert idle.wire.disconnecting
    idle.silent = False
    net.pump()                                   # the socket closes (connectionLost)
    assert idle.lost
    about_idle = [line for line in log_lines if "idle-peer" in line and "connection from"
                  not in line]
    assert len(about_idle) == 1 and "disconnected: keepalive" in about_idle[0]
    greedy = net.amqp("greedy")
    # (a link over the limit is refused, the connection stays; one that keeps its
    # refused links attached is closed at the margin, 18 links here)
    for i in range(19):
        greedy.receiver(f"g/{i}", credit=0)
    assert greedy.lost
    about_greedy = [line for line in log_lines if "greedy" in line and "connection from"
                    not in line]
    assert len(about_greedy) == 2, about_greedy
    assert "attach is refused" in about_greedy[0]
    assert "more than 18 links" in about_greedy[1] and "closing it" in about_greedy[1]
    assert greedy.server._end_cause() == "limit"
