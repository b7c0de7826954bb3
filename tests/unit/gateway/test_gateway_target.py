"""``--upstream`` parsing: schemes, default ports, credentials, the TLS parameters,
and a clear error for everything else."""

from __future__ import annotations

import pytest

from mqttamqp.gateway.target import Upstream, parse_upstream


def test_amqp_with_default_port() -> None:
    """amqp://host is port 5672 without TLS."""
    assert parse_upstream("amqp://core.example") == Upstream("core.example", 5672, False)


def test_amqps_with_credentials_and_tls_parameters() -> None:
    """amqps:// is 5671 with TLS; user, password (percent-decoded), server-name, ca."""
    u = parse_upstream("amqps://gw%40a:p%3Ass@10.0.0.5:6000?server-name=core&ca=/etc/ca.pem")
    assert u == Upstream("10.0.0.5", 6000, True, "gw@a", "p:ss", "core", "/etc/ca.pem")


def test_display_never_shows_the_password() -> None:
    """The log form names scheme, user, host and port only."""
    assert parse_upstream("amqp://u:secret@h:1").display == "amqp://u@h:1"


@pytest.mark.parametrize(("url", "why"), [
    ("mqtt://h", "amqp://HOST"),
    ("amqp://", "names no host"),
    ("amqp://h/vhost", "a path"),
    ("amqp://h:99999", "not a URL"),
    ("amqps://h?verify=no", "unknown parameter"),
    ("amqp://h?ca=x", "amqps:// only"),
    ("amqps://h?ca=", "with a value"),
])
def test_bad_urls_are_refused_with_a_reason(url: str, why: str) -> None:
    """Each malformed --upstream raises ValueError saying what is wrong."""
    with pytest.raises(ValueError, match=why):
        parse_upstream(url)


def test_option_is_checked_when_parsed() -> None:
    """twistd mqttamqp --upstream with a bad URL stops at option parsing."""
    from mqttamqp.options import Options

    with pytest.raises(SystemExit, match="--upstream must be amqp://HOST"):
        Options().parseOptions(["--upstream", "http://core"])
