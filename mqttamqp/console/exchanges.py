"""The console's Exchanges page: AMQP 0.9.1's exchanges and bindings as plain dicts
for the page and ``/api/exchanges`` alike (name, type, flags, arguments, bindings
in and out), and the operator's commands on them (delete a declared exchange,
remove one binding), each audited and answered once durable.

It reads only the façade's frozen views (``Broker.exchanges.views()``) and acts only
through the model's commands (``delete_exchange``, ``unbind_queue``,
``unbind_exchange``); a refusal of the model (``ChannelError``: the standard
exchanges cannot be deleted) becomes an ``ActionError`` with its text.  Names,
keys and arguments are raw here, as clients sent them: the templates escape them
and the API is ``json.dumps``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred

from mqttamqp.console.actions import ActionError, ActionResult
from mqttamqp.core.broker import Broker
from mqttamqp.core.exchanges.errors import ChannelError
from mqttamqp.core.exchanges.views import BindingView, DeclaredQueueView, ExchangeView

__all__ = ["arguments_json", "binding_json", "exchange_list", "exchange_detail",
           "declared_queue_json", "ExchangeActions", "DEFAULT_EXCHANGE"]

DEFAULT_EXCHANGE = "(AMQP default)"   # how the nameless exchange is shown


def _shown(value: object) -> Any:
    """An argument's value as JSON holds it (bytes as text, nested tables kept)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, tuple | list):
        if all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
            return {k: _shown(v) for k, v in value}
        return [_shown(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _shown(v) for k, v in value.items()}
    return str(value)


def arguments_json(arguments: Sequence[tuple[str, object]]) -> dict[str, Any]:
    """Declared arguments (unknown ``x-`` ones too) as a JSON object."""
    return {name: _shown(value) for name, value in arguments}


def binding_json(b: BindingView) -> dict[str, Any]:
    return {"source": b.source, "destination": b.destination,
            "destination_kind": b.destination_kind, "routing_key": b.routing_key,
            "arguments": arguments_json(b.arguments)}


def _exchange_json(e: ExchangeView, outgoing: list[dict[str, Any]],
                   incoming: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": e.name, "type": e.kind, "durable": e.durable,
            "auto_delete": e.auto_delete, "internal": e.internal,
            "arguments": arguments_json(e.arguments),
            "standard": e.name.startswith("amq."),
            "bindings_out": outgoing, "bindings_in": incoming}


def declared_queue_json(q: DeclaredQueueView) -> dict[str, Any]:
    """What a 0.9.1 ``queue.declare`` said of a queue (the Queues pages show it)."""
    return {"durable": q.durable, "exclusive": q.exclusive, "auto_delete": q.auto_delete,
            "transient": q.transient, "arguments": arguments_json(q.arguments),
            "consumers": q.consumers, "owner": q.owner}


def exchange_list(broker: Broker) -> dict[str, Any]:
    """Every exchange (the default one first) with its bindings either way."""
    exchanges, bindings, declared = broker.exchanges.views()
    out: dict[str, list[dict[str, Any]]] = {}
    into: dict[str, list[dict[str, Any]]] = {}
    for b in bindings:
        row = binding_json(b)
        out.setdefault(b.source, []).append(row)
        if b.destination_kind == "exchange":
            into.setdefault(b.destination, []).append(row)
    items = [_exchange_json(e, out.get(e.name, []), into.get(e.name, [])) for e in exchanges]
    # The default exchange: every queue is bound to it by its name (as RabbitMQ shows),
    # those MQTT or AMQP 1.0 made too.
    default = {"name": "", "type": "direct", "durable": True, "auto_delete": False,
               "internal": False, "arguments": {}, "standard": True,
               "bindings_out": [], "bindings_in": [],
               "implicit_bindings": broker.exchanges.default_reach()}
    return {"items": [default, *items], "totals": {
        "exchanges": len(items) + 1, "bindings": len(bindings),
        "declared_queues": len(declared)}}


def exchange_detail(broker: Broker, name: str) -> dict[str, Any] | None:
    for row in exchange_list(broker)["items"]:
        if row["name"] == name:
            return dict(row)
    return None


async def _durable(d: Deferred[None] | None) -> None:
    if d is not None:
        await d


class ExchangeActions:
    """Delete an exchange and remove a binding, audited with the console user
    (``audit`` is ``ConsoleActions.audit``)."""

    def __init__(self, broker: Broker, audit: Callable[..., None]) -> None:
        self.broker = broker
        self.audit = audit

    async def delete(self, user: str, name: str) -> ActionResult:
        if not name:
            raise ActionError(400, "the default exchange cannot be deleted")
        found = exchange_detail(self.broker, name)
        if found is None:
            raise ActionError(404, f"no exchange {name!r}")
        try:
            d = self.broker.exchanges.delete_exchange(name)
        except ChannelError as exc:
            raise ActionError(403, exc.text) from None
        await _durable(d)
        removed = len(found["bindings_out"]) + len(found["bindings_in"])
        self.audit(user, "exchange-delete", f"deleted with {removed} binding(s)",
                   exchange=name)
        return ActionResult(f"Deleted exchange {name} and its {removed} binding(s).",
                            {"deleted": True, "bindings": removed})

    async def unbind(self, user: str, source: str, destination: str, kind: str,
                     routing_key: str, arguments: str) -> ActionResult:
        """Remove the binding ``source`` → ``destination`` (a ``queue`` or an
        ``exchange``) with ``routing_key`` and ``arguments`` (the JSON object the
        page shows)."""
        if kind not in ("queue", "exchange"):
            raise ActionError(400, "destination_kind must be queue or exchange")
        binding = self._binding(source, destination, kind, routing_key, arguments)
        try:
            if kind == "queue":
                d = self.broker.exchanges.unbind_queue(destination, source, routing_key,
                                                       dict(binding.arguments))
            else:
                d = self.broker.exchanges.unbind_exchange(destination, source, routing_key,
                                                          dict(binding.arguments))
        except ChannelError as exc:
            raise ActionError(404 if exc.code == 404 else 403, exc.text) from None
        await _durable(d)
        self.audit(user, "exchange-unbind", "unbound", exchange=source,
                   destination=f"{kind}:{destination}", routing_key=routing_key)
        return ActionResult(f"Removed the binding {source} → {destination} "
                            f"({routing_key or 'no key'}).", {"unbound": True})

    def _binding(self, source: str, destination: str, kind: str, routing_key: str,
                 arguments: str) -> BindingView:
        """The binding as the model holds it (its arguments as the model froze them:
        the page sends them back as it showed them)."""
        wanted: Any = {}
        if arguments.strip():
            try:
                wanted = json.loads(arguments)
            except ValueError:
                # (a JSON API body's object reaches here as its Python text: ``param``)
                try:
                    wanted = ast.literal_eval(arguments)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    wanted = None
        if not isinstance(wanted, dict):
            raise ActionError(400, "arguments must be a JSON object (empty: none)")
        for b in self.broker.exchanges.views()[1]:
            if (b.source, b.destination, b.destination_kind, b.routing_key) == (
                    source, destination, kind, routing_key) and \
                    arguments_json(b.arguments) == wanted:
                return b
        raise ActionError(404, f"no binding {source!r} → {kind} {destination!r} with "
                          f"key {routing_key!r}")
