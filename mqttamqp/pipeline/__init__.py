"""The traffic report job: PySpark over the broker's Parquet archive.

``mqttamqp-report`` (``python -m mqttamqp.pipeline``) reads ``ARCHIVE/messages``
and ``ARCHIVE/events`` and writes ``OUT/tables/*`` (Parquet) and
``OUT/summary.json`` (what the console's Traffic page reads). The same code runs on
``local[*]`` and on a Spark standalone cluster (``--master spark://HOST:7077``).

This package must not be imported by the broker's reactor process except for the
summary's file name: PySpark is an optional extra (``mqttamqp[report]``), and the
job runs as a child process.
"""

SUMMARY_FILE = "summary.json"

__all__ = ["SUMMARY_FILE"]
