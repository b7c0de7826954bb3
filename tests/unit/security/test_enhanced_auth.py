"""MQTT 5 enhanced authentication: SCRAM-SHA-256 (server side against the RFC 7677
example, client side written here) and the AUTH exchange on a connection
(StringTransport, Clock)."""

from __future__ import annotations

import base64

from mqtt_memory import Client5, Harness, client5, closed_with, connected
from scram import METHOD, ScramClient

from mqttamqp.mqtt.packets import Auth, Connack, Connect, Packet, Properties, Publish
from mqttamqp.security.enhanced_auth import (
    CONTINUE,
    FAILURE,
    SUCCESS,
    EnhancedAuthenticator,
    ScramCredentials,
    ScramSha256,
    scram_credentials,
)

USERS = {"alice": scram_credentials("wonderland", b"saltsaltsalt", 4096)}


def harness() -> Harness:
    h = Harness()
    h.factory.enhanced_auth = EnhancedAuthenticator([ScramSha256(USERS.get)])
    return h


def scram_connect(c: Client5, scram: ScramClient, client_id: str = "dev") -> list[Packet]:
    c.send(Connect("MQTT", 5, client_id, True, 0, properties=Properties(
        authentication_method=METHOD, authentication_data=scram.first())))
    got = c.received()
    assert len(got) == 1 and isinstance(got[0], Auth) and got[0].reason_code == 0x18, got
    props = got[0].properties
    assert props is not None and props.authentication_method == METHOD
    assert props.authentication_data is not None
    c.send(Auth(0x18, Properties(authentication_method=METHOD,
                                 authentication_data=scram.final(props.authentication_data))))
    return c.received()


def test_scram_server_matches_rfc7677_example() -> None:
    """The server side reproduces RFC 7677's example exchange exactly."""
    creds = scram_credentials("pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="), 4096)
    method = ScramSha256({"user": creds}.get, nonce=lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    exchange = method.start()
    first = exchange.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first.outcome == CONTINUE
    assert first.data == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                          b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = exchange.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                          b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final.outcome == SUCCESS and final.username == "user"
    assert final.data == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_refuses_garbage_and_unknown_users() -> None:
    """Bad messages and unknown users fail (never raise); an unknown user still
    gets a challenge."""
    method = ScramSha256(USERS.get)
    assert method.start().step(b"\xff").outcome == FAILURE
    assert method.start().step(b"x,,n=a,r=b").outcome == FAILURE
    exchange = method.start()
    ghost = ScramClient("ghost", "x")
    challenge = exchange.step(ghost.first())
    assert challenge.outcome == CONTINUE and challenge.data is not None
    assert exchange.step(ghost.final(challenge.data)).outcome == FAILURE


def test_mqtt_scram_exchange_connects() -> None:
    """CONNECT with SCRAM-SHA-256, AUTH both ways, then CONNACK 0 carrying the
    server's signature, which the client verifies; the connection is alice's."""
    h = harness()
    c = client5(h)
    scram = ScramClient("alice", "wonderland")
    [ack] = scram_connect(c, scram)
    assert isinstance(ack, Connack) and ack.return_code == 0
    assert ack.properties is not None and ack.properties.authentication_method == METHOD
    assert ack.properties.authentication_data == scram.expected_verifier.encode()
    assert c.proto.username == "alice"
    c.send(Publish("t", b"x"))
    assert c.open


def test_mqtt_scram_wrong_password_gets_0x86() -> None:
    """A wrong password ends the exchange with CONNACK 0x86 and a close."""
    h = harness()
    c = client5(h)
    [ack] = scram_connect(c, ScramClient("alice", "wrong"))
    assert isinstance(ack, Connack) and ack.return_code == 0x86
    assert not c.open


def test_unknown_method_gets_0x8c() -> None:
    """A method the broker does not offer: CONNACK 0x8C."""
    h = harness()
    c = client5(h)
    assert c.connect5(authentication_method="SCRAM-SHA-1").return_code == 0x8C


def test_other_packets_during_the_exchange_are_refused() -> None:
    """Only AUTH may follow a CONNECT with a method until the exchange ends."""
    h = harness()
    c = client5(h)
    c.send(Connect("MQTT", 5, "d", True, 0, properties=Properties(
        authentication_method=METHOD, authentication_data=ScramClient("alice", "w").first())))
    c.received()
    c.send(Publish("t", b"x"))
    got = c.received()
    assert isinstance(got[-1], Connack) and got[-1].return_code == 0x82
    assert not c.open


def test_silent_exchange_times_out() -> None:
    """A client that stops answering during the exchange is closed at the connect
    timeout."""
    h = harness()
    c = client5(h)
    c.send(Connect("MQTT", 5, "d", True, 0, properties=Properties(
        authentication_method=METHOD, authentication_data=ScramClient("alice", "w").first())))
    c.received()
    h.clock.advance(h.broker.limits.connect_timeout + 0.1)
    assert not c.open


def test_reauthentication() -> None:
    """Connected, AUTH 0x19 starts a new exchange with the same method; success is
    AUTH 0x00 with the server's signature."""
    h = harness()
    c = client5(h)
    scram_connect(c, ScramClient("alice", "wonderland"))
    again = ScramClient("alice", "wonderland", nonce="second")
    c.send(Auth(0x19, Properties(authentication_method=METHOD,
                                 authentication_data=again.first())))
    [challenge] = c.received()
    assert isinstance(challenge, Auth) and challenge.properties is not None
    assert challenge.properties.authentication_data is not None
    c.send(Auth(0x18, Properties(authentication_method=METHOD, authentication_data=again.final(
        challenge.properties.authentication_data))))
    [done] = c.received()
    assert isinstance(done, Auth) and done.reason_code == 0
    assert done.properties is not None
    assert done.properties.authentication_data == again.expected_verifier.encode()


def test_auth_without_exchange_is_protocol_error() -> None:
    """An AUTH on a connection that did not authenticate with a method: 0x82."""
    h = harness()
    c = connected(h)
    c.send(Auth(0x18, Properties(authentication_method=METHOD)))
    closed_with(c, 0x82)


def test_credentials_hold_no_password() -> None:
    """What the store would keep is derived keys, not the password."""
    creds: ScramCredentials = USERS["alice"]
    assert b"wonderland" not in creds.stored_key + creds.server_key + creds.salt


def test_scram_checks_bans_on_the_name_it_proved() -> None:
    """A banned user who proves their name with SCRAM gets CONNACK 0x8A (banned)."""
    h = harness()
    h.broker.commands.ban("user", "alice", None, "test", "admin")
    [ack] = scram_connect(client5(h), ScramClient("alice", "wonderland"))
    assert isinstance(ack, Connack) and ack.return_code == 0x8A


def test_scram_failures_are_counted_like_password_failures() -> None:
    """A failed SCRAM proof gets CONNACK 0x86 and counts as one authentication failure."""
    h = harness()
    before = h.broker.stats.auth_failures
    [ack] = scram_connect(client5(h), ScramClient("alice", "wrong"))
    assert isinstance(ack, Connack) and ack.return_code == 0x86
    assert h.broker.stats.auth_failures == before + 1
