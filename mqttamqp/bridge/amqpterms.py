"""The AMQP 1.0 bridge's pure rules: what a remote's attach and a remote's outcome mean.

What it owns: ``refused`` (does the remote's attach refuse our link), ``upstream_of``
(the remote as the gateway's connection names it) and ``outcome_of``, the settlement
rules of an ``out`` message from the remote's disposition (AMQP 1.0 §3.4):

* accepted: done;
* rejected: by its condition (``amqp.refusals.verdict``, the table the broker's own
  AMQP ingress rejects with): refused for good (most conditions): dropped (counted,
  logged), with the remote's condition; refused for now
  (``amqp:resource-limit-exceeded``: a full queue there): ``FULL``, sent again as a
  released message is (the bridge drops it past ``max-full-wait``);
  ``amqp:internal-error``: as modified with
  ``delivery-failed``;
* released, modified without ``delivery-failed`` (with or without
  ``undeliverable-here``), or settled with no outcome: not a failed delivery, the
  message is sent again (with a back-off), never dropped;
* modified with ``delivery-failed``: a failed attempt, counted toward ``max-resends``.

What it must not do: hold state, touch the bridge, the session or the connection; it
reads proton's link and delivery only.
"""

from __future__ import annotations

from typing import Any

from proton import Terminus

from mqttamqp.amqp.refusals import RESEND, RESEND_COUNTED, verdict
from mqttamqp.gateway.target import Upstream
from mqttamqp.net.rawproton import (
    condition,
    delivery_remote,
    delivery_remote_state,
    describe,
    lib,
)

__all__ = ["ACCEPTED", "FAILED", "FULL", "REJECTED", "RELEASED", "outcome_of", "refused",
           "upstream_of"]

ACCEPTED: int = lib.PN_ACCEPTED
REJECTED: int = lib.PN_REJECTED
RELEASED: int = lib.PN_RELEASED
MODIFIED: int = lib.PN_MODIFIED
FAILED = -1   # (ours, not proton's: modified with delivery-failed)
FULL = -2     # (ours: rejected for now, e.g. a full queue there)
TERMINAL = (ACCEPTED, REJECTED, RELEASED, MODIFIED)


def refused(link: Any) -> bool:
    """Whether the remote's attach of ``link`` refuses it (its detach follows): a null
    terminus, the remote's target for our sender, its source for our receiver (AMQP
    1.0 §2.6.3; a terminus without an address is not one).  Proton never gives None
    for the remote terminus: a null one is a terminus of type unspecified.  (A pure
    function of proton's link; the gateway's channel has its own check of the same
    fact.)"""
    terminus = link.remote_target if link.is_sender else link.remote_source
    return bool(terminus.type == Terminus.UNSPECIFIED)


def upstream_of(bridge: Any) -> Upstream:
    """The remote (a bridge's) as the gateway's connection names it."""
    s = bridge.settings
    return Upstream(s.host, s.port, s.tls, s.username, s.password, s.server_name, s.tls_ca)


def outcome_of(dlv: Any) -> tuple[int, str]:
    """The remote's outcome of our delivery ``dlv`` (terminal, or settled) as the
    bridge settles it (see the module): ACCEPTED, REJECTED with its condition,
    FULL (rejected for now: sent again), RELEASED (sent again) or FAILED (modified
    with delivery-failed, or the remote's internal error)."""
    state = delivery_remote_state(dlv)
    if state == ACCEPTED:
        return ACCEPTED, ""
    if state == REJECTED:
        cond = lib.pn_disposition_condition(delivery_remote(dlv))
        reason = describe(cond) or ""
        what = verdict((condition(cond) or ("", ""))[0])
        if what == RESEND:
            return FULL, reason
        return (FAILED, f"rejected: {reason}") if what == RESEND_COUNTED else (REJECTED, reason)
    if state == MODIFIED and lib.pn_disposition_is_failed(delivery_remote(dlv)):
        here = lib.pn_disposition_is_undeliverable(delivery_remote(dlv))
        return FAILED, "modified: delivery-failed" + (", undeliverable-here" if here else "")
    return RELEASED, ""
