"""The Celery application of the AMQP 0.9.1 Celery test (a real worker, tests/integration/amqp091/).

Both sides build it with ``make_app(broker_url, queue)``: the test process sends tasks
and remote-control broadcasts, and ``celery -A celery_app091 worker`` (a child process
of the test, this module on its PYTHONPATH) builds ``app`` from
``MQTTAMQP_TEST_CELERY_BROKER`` and ``MQTTAMQP_TEST_CELERY_QUEUE``.  Results come back
through the ``rpc://`` backend (each client's own reply queue); tasks are acknowledged
late (after they ran), one at a time, as a careful deployment configures them.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task


def make_app(broker_url: str, queue: str) -> Celery:
    app = Celery("t091", broker=broker_url, backend="rpc://", set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=False,
        broker_connection_max_retries=0,
        worker_hijack_root_logger=False,
        result_expires=60,
    )

    @app.task(name="t091.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="t091.flaky", bind=True, max_retries=3)
    def flaky(self: Task, fails: int) -> int:       # type: ignore[type-arg]
        """Fails ``fails`` times (retrying at once), then says how many retries it took."""
        if self.request.retries < fails:
            raise self.retry(countdown=0)
        return int(self.request.retries)

    @app.task(name="t091.echo")
    def echo(value: Any) -> Any:
        return value

    return app


if os.environ.get("MQTTAMQP_TEST_CELERY_BROKER"):
    app = make_app(os.environ["MQTTAMQP_TEST_CELERY_BROKER"],
                   os.environ.get("MQTTAMQP_TEST_CELERY_QUEUE", "celery"))
