"""The broker core: topics, router, sessions, retained messages, wills, limits.

Nothing in here speaks a wire protocol or imports ZODB; protocols drive it and a
``StateStore`` (see ``persistence``) makes its state durable.
"""
