"""The broker's vocabulary of events: what can happen to a client (the archive's
``kind`` column) and why a connection ended or a will was published (its
``reason`` column).

The core records with these names (``core.recorder``) and the archive stores
them (``archive.schema``); neither imports the other, both import this module,
which imports nothing.
"""

from __future__ import annotations

__all__ = [
    "CONNECT", "DISCONNECT", "WILL_PUBLISHED", "SESSION_CREATED", "SESSION_RESUMED",
    "SESSION_CLEARED", "SESSION_EXPIRED", "SUBSCRIBE", "UNSUBSCRIBE", "AUTH_FAILURE",
    "CONSOLE_ACTION", "EVENT_KINDS",
    "CAUSE_CLEAN", "CAUSE_LOST", "CAUSE_KEEPALIVE", "CAUSE_PROTOCOL_ERROR",
    "CAUSE_TAKEN_OVER", "CAUSE_CONSOLE", "CAUSE_SHUTDOWN", "CAUSE_RESTART", "CAUSE_STORAGE",
    "CAUSE_LIMIT",
    "DISCONNECT_CAUSES", "WILL_CAUSES",
]

# -- event kinds (the ``kind`` column) and the columns each fills ----------------------
CONNECT = "connect"                  # protocol, address, user, clean_session, keepalive
DISCONNECT = "disconnect"            # reason: one of DISCONNECT_CAUSES; detail
WILL_PUBLISHED = "will_published"    # topic, qos, retain, reason: one of WILL_CAUSES
SESSION_CREATED = "session_created"  # clean_session
SESSION_RESUMED = "session_resumed"  # queued (messages waiting for it)
SESSION_CLEARED = "session_cleared"  # reason (e.g. clean_session, console), user
SESSION_EXPIRED = "session_expired"  # reason
SUBSCRIBE = "subscribe"              # topic (the filter), qos (granted)
UNSUBSCRIBE = "unsubscribe"          # topic (the filter)
AUTH_FAILURE = "auth_failure"        # protocol, address, user, reason
CONSOLE_ACTION = "console_action"    # user (the admin), action, target

EVENT_KINDS = frozenset({
    CONNECT, DISCONNECT, WILL_PUBLISHED, SESSION_CREATED, SESSION_RESUMED,
    SESSION_CLEARED, SESSION_EXPIRED, SUBSCRIBE, UNSUBSCRIBE, AUTH_FAILURE,
    CONSOLE_ACTION,
})

# -- causes (the ``reason`` column of disconnect and will_published) ------------------
CAUSE_CLEAN = "clean"                    # DISCONNECT packet / AMQP close without error
CAUSE_LOST = "lost"                      # socket closed without DISCONNECT
CAUSE_KEEPALIVE = "keepalive"            # keepalive (or AMQP idle time-out) expired
CAUSE_PROTOCOL_ERROR = "protocol_error"  # malformed or forbidden input
CAUSE_TAKEN_OVER = "taken_over"          # another connection with the same client id
CAUSE_CONSOLE = "console"                # an operator's action in the console
CAUSE_SHUTDOWN = "shutdown"              # the broker stopped
CAUSE_RESTART = "restart"                # will published after a restart's grace period
CAUSE_STORAGE = "storage"                # closed by the broker: a commit it waited on failed
CAUSE_LIMIT = "limit"                    # closed by the broker: over a limit (links, sessions)

DISCONNECT_CAUSES = (CAUSE_CLEAN, CAUSE_LOST, CAUSE_KEEPALIVE, CAUSE_PROTOCOL_ERROR,
                     CAUSE_TAKEN_OVER, CAUSE_CONSOLE, CAUSE_SHUTDOWN, CAUSE_STORAGE,
                     CAUSE_LIMIT)
WILL_CAUSES = (CAUSE_LOST, CAUSE_KEEPALIVE, CAUSE_PROTOCOL_ERROR, CAUSE_TAKEN_OVER,
               CAUSE_CONSOLE, CAUSE_RESTART, CAUSE_STORAGE, CAUSE_LIMIT)
