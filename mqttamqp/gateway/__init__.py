"""Gateway mode (issue #29 §1, seed 000's MQTT front end): ``twistd mqttamqp
--upstream amqp://core`` serves MQTT and keeps no session state; for each client it
speaks the MQTT-over-AMQP contract (``shared/AMQP-CONTRACT.md``, docs/gateway.md) to
the core, whose Will and Subscription services keep every session, so a client may
come back through any gateway.

The parts, one concern each:

* ``target``: what ``--upstream`` names (amqp:// or amqps://, TLS checked with
  service-identity);
* ``engine``: one AMQP 1.0 client connection, proton's engine under Twisted;
* ``pool``: the few connections all clients share, reconnected with back-off;
* ``channel``: one client's proton session and the contract's links and messages;
* ``frontend``: the MQTT connection (the sans-IO codec and connection rules of
  ``mqtt/``), CONNECT to CONNACK through the channel, the packets both ways;
* ``outbound``: the packet ids of a client's deliveries;
* ``websocket``: the broker's MQTT-over-WebSocket front over ``frontend``;
* ``figures``: what its console and metrics show (``mqttamqp.gatewayweb`` wires them);
* ``service``: the process in gateway mode.

What it must not do: import the store, ZODB or the core's ``Broker`` (the import
contract ``gateway-keeps-no-state``), or keep anything of a session beyond one
connection.
"""
