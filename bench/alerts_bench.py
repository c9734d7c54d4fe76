"""Alerts: cost of one evaluation cycle's pure part, and webhook delivery throughput.

    # pure part only (no database):
    .venv/bin/python bench/alerts_bench.py eval --nodes 50 --workers-per-node 8
    # delivery throughput against a local receiver (needs a scratch database; it migrates it):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pdplane_alerts_bench \
        .venv/bin/python bench/alerts_bench.py deliver --count 500 --sweepers 1 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def bench_eval(nodes: int, per_node: int, rounds: int) -> None:
    from controlplane.alerts import lifecycle, rules

    def snapshot(t: float, bad: bool) -> rules.FleetSnapshot:
        ns, ws = [], []
        for n in range(nodes):
            hot = bad and n % 10 == 0  # 10 % of the fleet in trouble
            ns.append(
                rules.NodeFacts(
                    "c1",
                    f"n{n}",
                    last_report_age_s=2.0,
                    gpus=tuple(
                        rules.GpuFacts(g, (99 if hot else 50) * 10**9, 100 * 10**9)
                        for g in range(8)
                    ),
                    nics=(rules.NicFacts("eth0", int(t) * (100 if hot else 0), 0),),
                    agent_protocol=1,
                    agent_version="0.1.0",
                )
            )
            for w in range(per_node):
                ws.append(
                    rules.WorkerFacts(
                        "c1",
                        f"n{n}",
                        "llama",
                        f"n{n}-w{w}",
                        kv_usage=0.99 if hot else 0.5,
                        ttft_p95_ms=1500 if hot else 300,
                        ttft_slo_ms=1000,
                        itl_p95_ms=20,
                        itl_slo_ms=50,
                        has_traffic=True,
                        kv_events_seq=int(t),
                        prefix_hit_rate=0.4,
                    )
                )
        return rules.FleetSnapshot(
            t, tuple(ns), tuple(ws), expected_agent_protocol=1, expected_agent_version="0.1.0"
        )

    config = lifecycle.LifecycleConfig(group_wait_s=0, group_interval_s=0)
    memory, alerts, groups = {}, {}, {}
    eval_ms, step_ms, fired = [], [], 0
    for i in range(rounds):
        snap = snapshot(i * 15.0, bad=i >= rounds // 2)
        t0 = time.perf_counter()
        result = rules.evaluate(snap, memory=memory)
        t1 = time.perf_counter()
        step = lifecycle.advance(alerts, groups, result.observations, snap.now, (), config)
        t2 = time.perf_counter()
        memory, alerts, groups = result.memory, step.alerts, step.groups
        fired += len(step.notifications)
        eval_ms.append((t1 - t0) * 1000)
        step_ms.append((t2 - t1) * 1000)
    print(
        f"{nodes} nodes × 8 GPUs, {nodes * per_node} workers, {rounds} cycles: "
        f"rules median {statistics.median(eval_ms):.2f} ms, max {max(eval_ms):.2f} ms; "
        f"lifecycle median {statistics.median(step_ms):.2f} ms, max {max(step_ms):.2f} ms; "
        f"{len(alerts)} open alerts, {fired} notifications"
    )


def bench_deliver(count: int, sweeper_counts: list[int]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["ALERTS_WEBHOOK_ALLOW"] = "127.0.0.1/32"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from controlplane.alerts.models import WEBHOOK_KIND, Delivery, WebhookEndpoint
    from controlplane.outbox.worker import drain
    from tests.integration.alerts_support.fixtures import Receiver

    call_command("migrate", verbosity=0)
    with tempfile.TemporaryDirectory() as tmp:
        ep, _ = WebhookEndpoint.objects.get_or_create(name="bench", url="http://127.0.0.1/")
        rx = Receiver(Path(tmp), ep.secret).start()
        try:
            ep.url = rx.url
            ep.save()
            for sweepers in sweeper_counts:
                Delivery.objects.filter(endpoint=ep).delete()
                body = {"alerts": [{"labels": {"node": f"n{i}"}} for i in range(5)]}
                for _ in range(count):
                    Delivery.objects.create(
                        endpoint=ep,
                        event_type="bench",
                        payload=body,
                        next_attempt_at=timezone.now(),
                    )

                def run(name):
                    try:
                        while drain([WEBHOOK_KIND], worker=name, time_budget_s=60).get("delivered"):
                            pass
                    finally:
                        connection.close()

                t0 = time.perf_counter()
                threads = [threading.Thread(target=run, args=(f"b{i}",)) for i in range(sweepers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = time.perf_counter() - t0
                delivered = Delivery.objects.filter(endpoint=ep, status="delivered").count()
                ids = [r["id"] for r in rx.requests()]
                print(
                    f"{sweepers} sweeper(s): {delivered}/{count} delivered in {elapsed:.1f} s "
                    f"= {delivered / elapsed:.0f}/s; duplicate sends so far: "
                    f"{len(ids) - len(set(ids))}"
                )
        finally:
            rx.stop()
            Delivery.objects.filter(endpoint=ep).delete()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--nodes", type=int, default=50)
    e.add_argument("--workers-per-node", type=int, default=8)
    e.add_argument("--rounds", type=int, default=40)
    d = sub.add_parser("deliver")
    d.add_argument("--count", type=int, default=500)
    d.add_argument("--sweepers", type=int, nargs="+", default=[1, 4])
    args = ap.parse_args()
    if args.cmd == "eval":
        bench_eval(args.nodes, args.workers_per_node, args.rounds)
    else:
        bench_deliver(args.count, args.sweepers)


if __name__ == "__main__":
    main()
