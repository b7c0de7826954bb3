"""Operating the broker: the configuration file, reloading on SIGHUP, webhooks.

Nothing here is on the broker's hot path except the webhook recorder's
``message``, which returns at once when no hook asks for messages.
"""
