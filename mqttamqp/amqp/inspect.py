"""What the console may see of an AMQP connection beyond its links: the
sessions the peer began, the frame size and idle time-out both sides asked for,
and the SASL mechanism it used (``AmqpDetails``).

Read-only: it looks at proton's objects and changes nothing.  Any proton call
that fails (an endpoint freed under us) yields zeros rather than an error, so a
console page can never break a connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from mqttamqp.core.clients.connections import AmqpDetails, AmqpSessionInfo, LinkInfo

__all__ = ["amqp_details"]

MAX_SESSIONS_SHOWN = 64     # --amqp-max-sessions is 32 by default


def _sessions(pconn: Any) -> list[Any]:
    out: list[Any] = []
    session = pconn.session_head(0) if pconn is not None else None
    while session is not None and len(out) < MAX_SESSIONS_SHOWN:
        out.append(session)
        session = session.next(0)
    return out


def amqp_details(pconn: Any, ptrans: Any, container_id: str, sasl_mechanism: str,
                 links: Sequence[tuple[Any, LinkInfo]]
                 ) -> tuple[AmqpDetails, tuple[LinkInfo, ...]]:
    """The connection's details, and ``links`` (proton link, info) with each info
    naming its session's number."""
    try:
        sessions = _sessions(pconn)
    except Exception:
        sessions = []
    counts = [0] * len(sessions)
    infos: list[LinkInfo] = []
    for plink, info in links:
        number = 0
        try:
            psession = plink.session
            for i, s in enumerate(sessions):
                if s == psession:
                    number = i + 1
                    counts[i] += 1
                    break
        except Exception:
            pass
        infos.append(replace(info, session=number))
    session_infos = []
    for i, s in enumerate(sessions):
        try:
            window, inb, outb = int(s.outgoing_window), int(s.incoming_bytes), int(
                s.outgoing_bytes)
        except Exception:
            window = inb = outb = 0
        session_infos.append(AmqpSessionInfo(i + 1, counts[i], window, inb, outb))
    try:
        frame, remote_frame = int(ptrans.max_frame_size), int(ptrans.remote_max_frame_size)
        idle, remote_idle = float(ptrans.idle_timeout), float(ptrans.remote_idle_timeout)
    except Exception:
        frame = remote_frame = 0
        idle = remote_idle = 0.0
    return AmqpDetails(container_id, sasl_mechanism, frame, remote_frame, idle, remote_idle,
                       tuple(session_infos)), tuple(infos)
