"""Running the broker in production: Prometheus metrics (``metrics``), the optional
OpenTelemetry export (``otel``), liveness and readiness (``health``), the reactor's
lag (``lag``), the HTTP listener that serves them (``web``) and the log format and
level (``logs``).

What it owns: turning the broker's own numbers and state into what operators'
tools read.  What it must not do: keep numbers of its own (it reads
``BrokerStats`` and the core at scrape time, so ``$SYS``, the console and
``/metrics`` never disagree), or block the reactor thread.
"""
