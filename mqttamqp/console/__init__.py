"""The admin console: a Klein web application over the broker's read model and
commands (pages, a JSON API under ``/api/``, live feeds), and ``mqttamqp-admin``.

Start at ``app.py`` (the root app that mounts one app per area, ``apps/``) and
``web.py`` (what every route shares: login, CSRF, parameters, answers).  The
console reads ``Broker.view`` and acts through the façade's commands; it never
imports a protocol adapter or the store (``.importlinter``).
"""
