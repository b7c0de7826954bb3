"""The console's Klein apps, one per area (clients, sessions and wills, retained
messages, topics, messages, queues, exchanges, bridges, users, traffic, the overview,
the API's own routes, login).  Each has its own ``app = Klein()`` bound to an instance that is
handed what it uses; ``mqttamqp.console.app.Console`` mounts them all.
"""
