"""Where an ``--ha`` takeover's load time goes (issue 28, warm standby): the same
stored state (N persistent sessions with a subscription and a queued message each, M
retained messages) loaded by the broker's store from PostgreSQL (cold: a new storage,
an empty RelStorage cache, as a standby that read nothing ahead) and from the file
storage (every object local: the floor a standby that had read the whole state ahead
into its cache could reach, since unpickling and building the state remain).

In-process (``ZODBStore.load``), a throw-away PostgreSQL cluster on 127.0.0.1
(``tests/support/pgcluster.py``, stopped by its PID); printed as JSON.

    python bench/ha_load_split.py [--sessions 10000] [--retained 100000] [--loads 2]
"""

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

from ha_takeover import populate  # noqa: E402
from pgcluster import PostgresCluster  # noqa: E402


class Inline:
    def callFromThread(self, f, *args):
        f(*args)


def load_seconds(uri, data_dir):
    from mqttamqp.store import ZODBStore, resolve_engine

    started = time.monotonic()
    store = ZODBStore(data_dir, Inline(), engine=resolve_engine(uri, data_dir))
    store.load()
    elapsed = time.monotonic() - started
    store.close()
    return round(elapsed, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--retained", type=int, default=100_000)
    ap.add_argument("--loads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    result = {}
    with tempfile.TemporaryDirectory(prefix="ha-split-") as tmp:
        cluster = PostgresCluster().start()
        try:
            uri = cluster.create_database()
            populate(uri, os.path.join(tmp, "populate"), args.sessions, args.retained)
            result["postgresql_cold_load_seconds"] = [
                load_seconds(uri, os.path.join(tmp, "pg%d" % i)) for i in range(args.loads)]
        finally:
            cluster.stop()
        fs = os.path.join(tmp, "fs")
        os.makedirs(fs)
        populate(None, fs, args.sessions, args.retained)
        result["file_load_seconds"] = [load_seconds(None, fs) for _ in range(args.loads)]
    doc = {"bench": "ha_load_split", "when": datetime.datetime.now(datetime.timezone.utc)
           .strftime("%Y-%m-%dT%H:%M:%SZ"), "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "sessions": args.sessions,
           "retained": args.retained, **result}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
