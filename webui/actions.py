"""Operator actions of the console, each audited in the log with the admin user.

Every action here is one of the broker façade's commands (``force_will``,
``disconnect``, ``clear_session``, ``fire_will``, ``delete_retained``...) and reads
only its read model (``Broker.view``); nothing reaches into sessions or protocol
internals.  An action returns an ``ActionResult`` once the change is durable (the
command's Deferred fired), so the HTTP answer never claims more than the store
holds.  Bad input raises ``ActionError`` with an HTTP status.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message
from mqttamqp.core.topics import validate_topic_filter, validate_topic_name

__all__ = ["ActionError", "ActionResult", "ConsoleActions"]


class ActionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ActionResult:
    message: str                        # for the operator (flash message / JSON)
    data: dict[str, Any] = field(default_factory=dict)
    connection_gone: bool = False       # the client's detail page no longer exists


async def _durable(d: Deferred[None] | None) -> None:
    if d is not None:
        await d


class ConsoleActions:
    """The commands behind the console's buttons and the JSON API's POSTs."""

    def __init__(self, broker: Broker, report_job: Any = None) -> None:
        self.broker = broker
        self.report_job = report_job     # a webui.traffic.ReportRunner, or None
        # An instance attribute: a class-level Logger would rename itself after the class.
        self.log = Logger(namespace="mqttamqp.console.audit")

    def _audit(self, user: str, action: str, outcome: str, **target: Any) -> None:
        # Client-supplied strings are logged with repr(): no forged log lines.
        detail = " ".join(f"{k}={v!r}" for k, v in target.items())
        self.log.info("audit: user={user!r} action={action} {detail} -> {outcome}",
                      user=user, action=action, detail=detail, outcome=outcome)
        self.broker.record_console_action(user, action, f"{detail} -> {outcome}")

    # -- clients ----------------------------------------------------------------

    async def force_will(self, user: str, key: str, keep_connected: bool) -> ActionResult:
        client = self.broker.view.client(key, 0)
        if client is None:
            raise ActionError(404, f"no connected client {key!r}")
        client_id = client.info.client_id
        reason = f"will forced by console user {user}"
        done = self.broker.force_will(key, keep_connected, reason)
        if done is None:
            raise ActionError(404, f"no connected client {key!r}")
        owners, durable = done
        if not owners:
            self._audit(user, "force-will", "refused: no will", key=key)
            raise ActionError(409, f"client {client_id!r} has no will")
        await durable
        if keep_connected:
            self._audit(user, "force-will", "published, client kept connected", key=key,
                        owners=owners)
            return ActionResult(f"Published the will of {client_id}; it stays connected "
                                f"and keeps its will.", {"published": len(owners),
                                                          "disconnected": False})
        self._audit(user, "force-will", "published and disconnected", key=key, owners=owners)
        return ActionResult(f"Published the will of {client_id} and disconnected it.",
                            {"published": len(owners), "disconnected": True},
                            connection_gone=True)

    async def disconnect(self, user: str, key: str, with_will: bool) -> ActionResult:
        client = self.broker.view.client(key, 0)
        how = "with its will" if with_will else "without its will"
        done = self.broker.disconnect(key, with_will,
                                      f"disconnected by console user {user} ({how})")
        if client is None or done is None:
            raise ActionError(404, f"no connected client {key!r}")
        fired, durable = done
        await durable
        self._audit(user, "disconnect", f"disconnected {how}", key=key)
        return ActionResult(f"Disconnected {client.info.client_id} {how}.",
                            {"disconnected": True, "wills_published": fired},
                            connection_gone=True)

    # -- sessions ---------------------------------------------------------------

    async def clear_session(self, user: str, client_id: str) -> ActionResult:
        session = self.broker.view.session(client_id, 0)
        if session is None:
            raise ActionError(404, f"no session {client_id!r}")
        was_online = session.online
        d = self.broker.clear_session(client_id, f"session cleared by console user {user}")
        await _durable(d)
        self._audit(user, "clear-session", "cleared" + (" (was connected)" if was_online
                                                        else ""), client_id=client_id)
        return ActionResult(f"Cleared the session of {client_id}.",
                            {"cleared": True, "was_connected": was_online})

    # -- wills ------------------------------------------------------------------

    async def fire_will(self, user: str, owner: str) -> ActionResult:
        d = self.broker.fire_will(owner, f"published by console user {user}")
        if d is None:
            raise ActionError(404, f"no will of {owner!r}")
        await d
        self._audit(user, "fire-will", "published and deleted", owner=owner)
        return ActionResult(f"Published and removed the will of {owner}.", {"published": True})

    async def discard_will(self, user: str, owner: str) -> ActionResult:
        if self.broker.view.will(owner) is None:
            raise ActionError(404, f"no will of {owner!r}")
        await _durable(self.broker.clear_will(owner))
        self._audit(user, "discard-will", "deleted", owner=owner)
        return ActionResult(f"Removed the will of {owner} without publishing it.",
                            {"discarded": True})

    # -- retained ---------------------------------------------------------------

    async def delete_retained(self, user: str, topic: str) -> ActionResult:
        if self.broker.view.retained(topic) is None:
            raise ActionError(404, f"no retained message on {topic!r}")
        await _durable(self.broker.delete_retained(topic))
        self._audit(user, "delete-retained", "deleted", topic=topic)
        return ActionResult(f"Deleted the retained message on {topic}.", {"deleted": 1})

    def count_retained(self, topic_filter: str) -> int:
        problem = validate_topic_filter(topic_filter)
        if problem is not None:
            raise ActionError(400, f"invalid topic filter: {problem}")
        return len(self.broker.view.retained_matching(topic_filter))

    async def delete_retained_matching(self, user: str, topic_filter: str,
                                       expected: int | None) -> ActionResult:
        count = self.count_retained(topic_filter)
        if expected is not None and count != expected:
            raise ActionError(409, f"{count} retained messages match {topic_filter!r} now, "
                                   f"not {expected}; confirm again")
        deleted, d = self.broker.delete_retained_matching(topic_filter)
        await _durable(d)
        self._audit(user, "delete-retained-matching", f"deleted {deleted}",
                    filter=topic_filter)
        return ActionResult(f"Deleted {deleted} retained message(s) matching {topic_filter}.",
                            {"deleted": deleted})

    # -- publish ----------------------------------------------------------------

    async def publish(self, user: str, topic: str, payload: str, encoding: str, qos: int,
                      retain: bool) -> ActionResult:
        problem = validate_topic_name(topic)
        if problem is not None:
            raise ActionError(400, f"invalid topic: {problem}")
        if qos not in (0, 1, 2):
            raise ActionError(400, "QoS must be 0, 1 or 2")
        try:
            if encoding == "hex":
                body = binascii.unhexlify("".join(payload.split()))
            elif encoding == "base64":
                body = base64.b64decode(payload, validate=True)
            elif encoding in ("utf-8", "text", ""):
                body = payload.encode("utf-8")
            else:
                raise ActionError(400, f"unknown payload encoding {encoding!r}")
        except (ValueError, binascii.Error):
            raise ActionError(400, f"payload is not valid {encoding}") from None
        if len(body) > self.broker.limits.max_packet_size:
            raise ActionError(413, "payload is larger than --max-packet-size")
        now = self.broker.clock.seconds()
        await _durable(self.broker.publish(Message(topic, body, qos, retain, None, now)).durable)
        self._audit(user, "publish", "published", topic=topic, qos=qos, retain=retain,
                    size=len(body))
        return ActionResult(f"Published {len(body)} byte(s) to {topic} (QoS {qos}"
                            f"{', retained' if retain else ''}).",
                            {"published": True, "size": len(body)})

    # -- traffic report -----------------------------------------------------------

    async def run_report(self, user: str) -> ActionResult:
        """Start the report job now (a child process; this answers once it started)."""
        if self.report_job is None:
            raise ActionError(404, "this broker has no report job")
        started, message = self.report_job.run_now(f"console user {user}")
        self._audit(user, "run-report", "started" if started else f"refused: {message}")
        if not started:
            raise ActionError(409, message)
        return ActionResult("Started the report job; this page shows when it ends.",
                            {"started": True})
