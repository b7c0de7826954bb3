"""Operator actions of the console, each audited in the log with the admin user.

Every action here is one of the operator's commands (``core.commands``:
``force_will``, ``disconnect``, ``clear_session``, ``delete_retained``...) and reads
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

from mqttamqp.console.rendering import duration
from mqttamqp.console.traffic import ReportRunner
from mqttamqp.core.auth import peer_host
from mqttamqp.core.broker import Broker
from mqttamqp.core.message import Message
from mqttamqp.core.topics import is_sys_topic, validate_topic_filter, validate_topic_name
from mqttamqp.security.bans import BanError

__all__ = ["ActionError", "ActionResult", "ConsoleActions", "MAX_BULK"]

MAX_BULK = 1000      # clients one bulk action may name


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

    def __init__(self, broker: Broker, report_job: ReportRunner | None = None) -> None:
        self.broker = broker
        self.commands = broker.commands     # the operator's commands (core.commands)
        self.report_job = report_job
        # An instance attribute: a class-level Logger would rename itself after the class.
        self.log = Logger(namespace="mqttamqp.console.audit")

    def audit(self, user: str, action: str, outcome: str, **target: Any) -> None:
        """Log and record a console action (also for ``mqttamqp.console.useractions``)."""
        self._audit(user, action, outcome, **target)

    def _audit(self, user: str, action: str, outcome: str, **target: Any) -> None:
        # Client-supplied strings are logged with repr(): no forged log lines.
        detail = " ".join(f"{k}={v!r}" for k, v in target.items())
        self.log.info("audit: user={user!r} action={action} {detail} -> {outcome}",
                      user=user, action=action, detail=detail, outcome=outcome)
        self.commands.record_console_action(user, action, f"{detail} -> {outcome}")

    # -- clients ----------------------------------------------------------------

    async def force_will(self, user: str, key: str, keep_connected: bool) -> ActionResult:
        client = self.broker.view.client(key, 0)
        if client is None:
            raise ActionError(404, f"no connected client {key!r}")
        client_id = client.info.client_id
        reason = f"will forced by console user {user}"
        done = self.commands.force_will(key, keep_connected, reason)
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
        done = self.commands.disconnect(key, with_will,
                                      f"disconnected by console user {user} ({how})")
        if client is None or done is None:
            raise ActionError(404, f"no connected client {key!r}")
        fired, durable = done
        await durable
        self._audit(user, "disconnect", f"disconnected {how}", key=key)
        return ActionResult(f"Disconnected {client.info.client_id} {how}.",
                            {"disconnected": True, "wills_published": fired},
                            connection_gone=True)

    async def debug_client(self, user: str, client_id: str, minutes: int) -> ActionResult:
        """Log every MQTT packet or AMQP frame of ``client_id`` (an AMQP container
        id) for ``minutes`` (0 stops)."""
        if not client_id:
            raise ActionError(400, "no client id given")
        if not 0 <= minutes <= 60:
            raise ActionError(400, "minutes must be between 0 and 60")
        try:
            until, started = self.commands.debug_client(client_id, minutes * 60.0)
        except ValueError as e:
            raise ActionError(409, str(e)) from None
        if minutes == 0:
            self._audit(user, "debug-log", "stopped", client_id=client_id)
            return ActionResult(f"Debug logging of {client_id} stopped.", {"until": None})
        self._audit(user, "debug-log", f"on for {minutes} min", client_id=client_id)
        return ActionResult(
            f"Every packet (or AMQP frame) of {client_id} is logged for {minutes} minutes "
            f"(lines 'debug {client_id} ...' in the broker's log).",
            {"until": until, "connections": started})

    async def bulk(self, user: str, action: str, keys: list[str], with_will: bool
                   ) -> ActionResult:
        """Disconnect, or clear the persistent session of, each of ``keys`` (live
        connections).  Each one is audited as its single action is; clients that left
        meanwhile, or hold no persistent session to clear, are skipped and counted."""
        if action not in ("disconnect", "clear-session"):
            raise ActionError(400, "action must be disconnect or clear-session")
        unique = list(dict.fromkeys(k for k in keys if k))
        if not unique:
            raise ActionError(400, "no clients selected")
        if len(unique) > MAX_BULK:
            raise ActionError(400, f"at most {MAX_BULK} clients at a time")
        done: list[str] = []
        skipped: list[str] = []
        for key in unique:
            client = self.broker.view.client(key, 0)
            try:
                if client is None:
                    raise ActionError(404, "gone")
                if action == "disconnect":
                    await self.disconnect(user, key, with_will)
                else:
                    session = client.session
                    if session is None or not session.persistent:
                        raise ActionError(409, "no persistent session")
                    await self.clear_session(user, session.client_id)
            except ActionError:
                skipped.append(key)
            else:
                done.append(key)
        self._audit(user, "bulk-" + action, f"{len(done)} done, {len(skipped)} skipped",
                    keys=len(unique))
        verb = "Disconnected" if action == "disconnect" else "Cleared the sessions of"
        note = f"; skipped {len(skipped)} (gone, or no persistent session)" if skipped else ""
        return ActionResult(f"{verb} {len(done)} client(s){note}.",
                            {"done": done, "skipped": skipped}, connection_gone=bool(done))

    # -- sessions ---------------------------------------------------------------

    async def clear_session(self, user: str, client_id: str) -> ActionResult:
        session = self.broker.view.session(client_id, 0)
        if session is None:
            raise ActionError(404, f"no session {client_id!r}")
        was_online = session.online
        d = self.commands.clear_session(client_id, f"session cleared by console user {user}")
        await _durable(d)
        self._audit(user, "clear-session", "cleared" + (" (was connected)" if was_online
                                                        else ""), client_id=client_id)
        return ActionResult(f"Cleared the session of {client_id}.",
                            {"cleared": True, "was_connected": was_online})

    # -- wills ------------------------------------------------------------------

    async def fire_will(self, user: str, owner: str) -> ActionResult:
        d = self.commands.fire_will(owner, f"published by console user {user}")
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
        await _durable(self.commands.delete_retained(topic))
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
        deleted, d = self.commands.delete_retained_matching(topic_filter)
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
        if is_sys_topic(topic):
            # (no client publishes there either: the broker's own topics, which its
            # watchers keep until the value changes)
            raise ActionError(400, "invalid topic: $SYS is the broker's own")
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

    # -- bans -------------------------------------------------------------------

    async def ban(self, user: str, kind: str, value: str, seconds: float | None, reason: str,
                  disconnect: bool) -> ActionResult:
        """Ban ``value`` for ``seconds`` (None: for good), durably; with ``disconnect``
        the matching live connections are closed too (their wills fire, as on any
        unexpected end)."""
        if seconds is not None and seconds <= 0:
            raise ActionError(400, "a ban lasts a positive number of seconds (or for good)")
        until = None if seconds is None else self.broker.clock.seconds() + seconds
        try:
            ban, durable = self.commands.ban(kind, value, until, reason, user)
        except BanError as e:
            raise ActionError(400, str(e)) from None
        await durable
        closed = 0
        if disconnect:
            for client in self.broker.view.clients():
                info = client.info
                if self.commands.bans.check(info.client_id, info.user,
                                          peer_host(info.remote)) is not None:
                    done = self.commands.disconnect(info.key, True,
                                                  f"banned by console user {user}")
                    if done is not None:
                        await done[1]
                        closed += 1
        term = "for good" if until is None else f"for {duration(seconds)}"
        self._audit(user, "ban", f"banned {term}, {closed} connection(s) closed",
                    kind=kind, value=ban.value, reason=ban.reason)
        return ActionResult(f"Banned {kind.replace('_', ' ')} {ban.value} {term}"
                            f"{f'; closed {closed} connection(s)' if closed else ''}.",
                            {"banned": True, "until": until, "disconnected": closed})

    async def unban(self, user: str, kind: str, value: str) -> ActionResult:
        try:
            d = self.commands.unban(kind, value)
        except BanError as e:
            raise ActionError(400, str(e)) from None
        if d is None:
            raise ActionError(404, f"no ban on {kind} {value!r}")
        await d
        self._audit(user, "unban", "lifted", kind=kind, value=value)
        return ActionResult(f"Lifted the ban on {kind.replace('_', ' ')} {value}.",
                            {"lifted": True})

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
