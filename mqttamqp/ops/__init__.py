"""Running the broker in production.

Operating it: the configuration file, reloading on SIGHUP, webhooks (``config``,
``reload``, ``webhooks``, ``recorders``).  Nothing of these is on the broker's hot
path except the webhook recorder's ``message``, which returns at once when no hook
asks for messages.

Watching it: Prometheus metrics (``metrics``), the optional OpenTelemetry export
(``otel``), liveness and readiness (``health``), the reactor's lag (``lag``), the
HTTP listener that serves them (``web``) and the log format and level (``logs``),
wired into the service by ``wiring``.  These keep no numbers of their own (they
read ``BrokerStats`` and the core at scrape time, so ``$SYS``, the console and
``/metrics`` never disagree), and never block the reactor thread.
"""
