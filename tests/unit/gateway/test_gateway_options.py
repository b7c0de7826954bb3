"""Gateway mode refuses the broker's options it has no use for with one line naming
them (on the command line or in --config), and accepts its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqttamqp.options import Options
from mqttamqp.optiontable import FLAGS, GATEWAY_IGNORES, PARAMETERS

UP = ("--upstream", "amqp://core.test:5672")


def refused(*argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        Options().parseOptions(list(argv))
    return str(caught.value).splitlines()[0]


def test_every_ignored_name_is_an_option() -> None:
    """The list names options that exist (a renamed option would slip through)."""
    names = {p[0] for p in PARAMETERS} | {f[0] for f in FLAGS} | {
        "amqp", "amqp-queues", "archive-include", "archive-exclude", "webhook", "bridge"}
    assert set(GATEWAY_IGNORES) <= names


def test_broker_options_are_named_in_one_line() -> None:
    """--storage, --amqp, --ha-poll and a flag with --upstream: one error naming each."""
    line = refused(*UP, "--storage", "memory://", "--amqp", "tcp:5673", "--ha-poll", "2",
                   "--tls-cert-as-user", "--mqtt", "tcp:1884")
    assert line.startswith("twistd mqttamqp: gateway mode (--upstream)")
    for name in ("--storage", "--amqp", "--ha-poll", "--tls-cert-as-user"):
        assert name in line, name
    assert "--mqtt" not in line and "--upstream-" not in line


def test_config_file_tables_are_named(tmp_path: Path) -> None:
    """A [[bridge]] table and --queues in the --config file are refused alike."""
    queues = tmp_path / "queues.toml"
    queues.write_text("", encoding="utf-8")
    config = tmp_path / "gw.toml"
    config.write_text(f"queues = '{queues}'\n[[bridge]]\nname = 'hq'\naddress = "
                      "'mqtt://127.0.0.1:1884'\ntopics = ['a/# out 1']\n",
                      encoding="utf-8")
    line = refused(*UP, "--config", str(config))
    assert "[[bridge]]" in line and "--queues" in line


def test_a_gateway_of_its_own_options_starts() -> None:
    """Listeners set to none, the gateway's own options and the limits it applies
    (packet size, connections, in flight) are accepted; the defaults count as unset."""
    options = Options()
    options.parseOptions([*UP, "--amqp", "none", "--web", "tcp:0", "--metrics", "tcp:0",
                          "--upstream-connections", "3", "--max-packet-size", "4096",
                          "--max-connections", "10", "--max-inflight", "5",
                          "--allow-anonymous"])
    assert options["amqp"] == [] and options["upstream-connections"] == 3
