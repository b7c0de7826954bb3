"""What an AMQP 1.0 ``rejected`` outcome's error condition means: the one table for
the broker's own AMQP ingress and for the AMQP 1.0 bridges, both ways.

What it owns: ``CONDITIONS``, a durable queue's refusal (the MQTT 5 reason code a
``core.queues.addresses.Refusal`` carries) as the error condition a publisher's
message is rejected with (``condition_of``); ``FOR_NOW``, the conditions that say
the message may pass later (a full queue: sending it again is the way), where
every other condition says it is refused for good (sent again, it is refused
again); ``FAILED``, those that say the attempt failed without saying why (the
remote's internal error: sent again a bounded number of times).  Who reads it:

* ``amqp.publisher`` rejects with ``condition_of(code)``;
* a bridge's ``in`` direction (``bridge.amqp``) rejects to its remote only what is
  refused for good (``for_good(code)``); one refused for now is not answered, the
  connection is dropped, and the remote sends it again after the reconnect;
* a bridge's ``out`` direction (``bridge.amqpterms``) reads a remote's ``rejected``
  by its condition (``verdict``): for good, the message is dropped (counted, logged
  once a minute per condition); for now, it is sent again with the back-off of a
  released one, for the bridge's ``max-full-wait`` at most; failed, as a
  ``modified`` with delivery-failed
  (``max-resends``).

What it must not do: hold state or touch proton; pure values and lookups.
"""

from __future__ import annotations

from mqttamqp.amqp.links import INVALID_FIELD, PRECONDITION_FAILED
from mqttamqp.core.queues.addresses import QUOTA_EXCEEDED, TOPIC_NAME_INVALID

__all__ = ["CONDITIONS", "DROP", "FAILED", "FOR_NOW", "INTERNAL_ERROR", "RESEND",
           "RESEND_COUNTED", "RESOURCE_LIMIT_EXCEEDED", "condition_of", "for_good",
           "verdict"]

RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
INTERNAL_ERROR = "amqp:internal-error"

# A durable queue's refusal code -> the Rejected error condition (others:
# amqp:precondition-failed).
CONDITIONS: dict[int, str] = {TOPIC_NAME_INVALID: INVALID_FIELD,
                              QUOTA_EXCEEDED: RESOURCE_LIMIT_EXCEEDED}
# Conditions that refuse a message for now: it may pass later (a full queue here,
# as Artemis and mqttamqp say it).
FOR_NOW: frozenset[str] = frozenset({RESOURCE_LIMIT_EXCEEDED})
# Conditions that say an attempt failed, not whether the next one may pass.
FAILED: frozenset[str] = frozenset({INTERNAL_ERROR})

# What a bridge does with a message its remote rejected (``verdict``).
DROP, RESEND, RESEND_COUNTED = 0, 1, 2


def condition_of(code: int) -> str:
    """The Rejected error condition of a durable queue's refusal ``code``."""
    return CONDITIONS.get(code, PRECONDITION_FAILED)


def for_good(code: int) -> bool:
    """Whether a refusal with ``code`` would refuse the same message again."""
    return condition_of(code) not in FOR_NOW


def verdict(condition: str) -> int:
    """What to do with a message rejected with ``condition`` (its name; "" when the
    remote gave none): DROP (for good), RESEND (for now: up to max-full-wait) or
    RESEND_COUNTED (a failed attempt: toward ``max-resends``)."""
    if condition in FOR_NOW:
        return RESEND
    if condition in FAILED:
        return RESEND_COUNTED
    return DROP
