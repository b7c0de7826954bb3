"""The broker core: topics, router, sessions, retained messages, wills, limits.

Nothing in here speaks a wire protocol, imports ZODB or a security module;
protocols drive it through ``broker.Broker`` (the port), the console through
``commands.ConsoleCommands`` and ``readmodel.ReadModel``, and a ``StateStore``
(see ``persistence``) makes its state durable.  Sub-packages, each above the
next: ``clients`` (registry, gate, gateway, wills), ``routing`` beside ``queues``,
and ``sessions``.
"""
