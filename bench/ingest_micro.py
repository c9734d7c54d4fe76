"""Per-report CPU of the pure ingest steps (parse, validate, build Redis commands), in µs,
best of 5 runs of 20,000 (process time, so it holds up on a busy machine):

    DATABASE_URL=… REDIS_URL=… .venv/bin/python bench/ingest_micro.py
"""

import os
import sys
import time


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.dirname(here)]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    import orjson
    from ingest_bench import hello, report

    from controlplane.telemetry.hotstate import Keys
    from controlplane.telemetry.ingest import NodeContext, report_commands
    from workers_agent import protocol as proto

    inv = proto.Inventory.from_hello(hello("x")["inventory"])
    raw = orjson.dumps(report(1))
    ctx = NodeContext(1, 1, "x", 1, 2.0, {"e0": 1, "e1": 2})
    keys = Keys()
    msg = orjson.loads(raw)
    steps = {
        "parse": lambda: orjson.loads(raw),
        "validate": lambda: proto.validate_report(msg, inv),
        "commands": lambda: report_commands(ctx, msg, 1.0, keys, lambda a, b: False),
    }
    n = 20000
    best = {}
    for _ in range(5):
        for name, step in steps.items():
            t = time.process_time()
            for _ in range(n):
                step()
            best[name] = min(best.get(name, 1e9), (time.process_time() - t) / n * 1e6)
    print({k: round(v, 1) for k, v in best.items()}, "report bytes", len(raw))


if __name__ == "__main__":
    main()
